package agent

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/vigil-ha/vigil/internal/config"
	"github.com/vigil-ha/vigil/internal/feed"
	"github.com/vigil-ha/vigil/internal/kubelite"
	"github.com/vigil-ha/vigil/internal/lb"
	"github.com/vigil-ha/vigil/internal/observe"
	"github.com/vigil-ha/vigil/internal/validate"
)

// Command is the agent's command line, the same in both binaries that
// carry it: "vigil agent" (use "agent") and "vigil-agent", the worker's own
// binary, which links no client-go and no gRPC (use "vigil-agent").
func Command(use string) *cobra.Command {
	name := "vigil agent"
	if use != "agent" {
		name = use
	}
	var (
		cfg                     Config
		etcdCA, etcdCert, etcdK string
		healthCA                string
		healthInsecure          bool
		kubeconfig              string
		inCluster               bool
		logLevel, logFormat     string
	)
	cmd := &cobra.Command{
		Use:   use,
		Short: "Run the worker agent: stable local endpoints for the API server and etcd",
		Long: `Run the worker agent.

Every worker runs the agent: vigil-agent, a small binary of its own, or the
same command as "vigil agent" in the vigil binary (vigil-agent links neither
client-go nor gRPC, and needs a third less memory). It listens on
--apiserver-listen (and, with --etcd-listen, on a local etcd endpoint) and
forwards each TCP connection, TLS untouched, to a healthy control-plane
backend. Point kubelet, kube-proxy and etcd clients such as flannel at these
local endpoints once, and they never need a new address, a new config or a
restart when control-plane nodes are added, removed or replaced.

Backends. With --etcd-endpoints the agent reads the etcd member list every
--discovery-interval, over etcd's JSON gateway (POST /v3/cluster/member/list,
one connection to one member at a time): each voting member's client URL
is an etcd backend and its host with --backend-port an API server backend.
With --kubeconfig or --in-cluster the agent also watches the kubernetes
Service's EndpointSlices, where every kube-apiserver publishes its address;
this is how a worker without etcd certificates (kubeadm's) learns the API
servers. A kubeconfig may give a client certificate or a token (exec plugins
are refused). --server and --etcd-endpoints are seeds: used to find the
cluster and, when no learned backend is usable, as the last resort. The
learned lists are cached in --cache-dir, so a restarted agent serves at once,
even while the seeds are down.

Health. API servers: HTTPS GET --health-path (/readyz); etcd members: GET
/health?serializable=true with the etcd client certificate; over kept-alive
connections, every --health-interval. A refused connection takes a backend out
at once; a silent one is out after --health-interval + --health-timeout.
Connections to a backend that dies or leaves the cluster are closed so that
their clients reconnect, through the agent, to one that is still there.
Connections go to the nearest usable backends (on this host, then the lowest
measured latency, then the seeds), least connections among them; when no
backend passes its checks, to any of them rather than none.

Fleets. Every vigil run on the control plane can serve an agent feed
(--agent-feed-listen; vigil manifest turns it on) of what its own checks
see; the agent reads it on --feed-port, on the VIP first, then on any
control-plane node. While a feed is fresh the agent takes a backend the feed
says is down out at once, reads no etcd member list, and checks the backends
the feed vouches for only every 10 minutes; a backend whose connection
failed on this host is checked every --health-interval until it passes,
whatever the feed says. Without a fresh feed the agent checks everything
itself, as above.

Certificates. The client still verifies the API server's certificate, whose
SANs do not include 127.0.0.1 by default in kubeadm. Either add 127.0.0.1 to
apiServer.certSANs, or set tls-server-name: kubernetes in the kubeconfig
(kubernetes is always a SAN). kubeadm's etcd server certificates include
127.0.0.1 already. See docs/agent.md for kubelet, kube-proxy and flannel.`,
		Example: `  ` + name + ` --server https://10.0.0.100:6443 --apiserver-listen 127.0.0.1:6443 \
    --etcd-listen 127.0.0.1:2379 --etcd-endpoints https://10.0.0.11:2379,https://10.0.0.12:2379 \
    --etcd-cacert /etc/kubernetes/pki/etcd/ca.crt \
    --etcd-cert /etc/vigil/etcd-client.crt --etcd-key /etc/vigil/etcd-client.key`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := config.Apply(cmd.Flags(), config.SectionAgent, os.Getenv); err != nil {
				return err
			}
			log, err := observe.NewLogger(logLevel, logFormat)
			if err != nil {
				return err
			}
			if healthCA != "" && healthInsecure {
				return fmt.Errorf("%w: `healthCa` and `healthInsecureSkipVerify` exclude each other", validate.ErrInvalid)
			}
			if cfg.APITLS, err = validate.HealthTLS(healthCA, healthInsecure); err != nil {
				return validate.Invalid(err)
			}
			if cfg.EtcdTLS, err = validate.EtcdClientTLS(etcdCA, etcdCert, etcdK); err != nil {
				return validate.Invalid(err)
			}
			switch {
			case kubeconfig != "" && inCluster:
				return fmt.Errorf("%w: `kubeconfig` and `inCluster` exclude each other", validate.ErrInvalid)
			case kubeconfig != "":
				if cfg.Kube, err = kubelite.FromKubeconfig(kubeconfig); err != nil {
					return err
				}
			case inCluster:
				// Through the agent's own listener, so the watch follows
				// whichever API server is healthy; "kubernetes" is a SAN of
				// every kubeadm API server certificate.
				listen := cfg.APIServerListen
				if listen == "" {
					listen = DefaultAPIServerListen
				}
				if cfg.Kube, err = kubelite.FromServiceAccount(kubelite.ServiceAccountDir, "https://"+listen, "kubernetes"); err != nil {
					return err
				}
			}
			a, err := New(cfg, log)
			if err != nil {
				return err
			}
			return a.Run(cmd.Context())
		},
	}
	f := cmd.Flags()
	config.AddFlag(f, string(config.SectionAgent))
	f.StringVar(&cfg.Server, "server", "", "the control plane's API server URL (the VIP), https://HOST:PORT: the seed and last-resort backend (required)")
	f.StringVar(&cfg.APIServerListen, "apiserver-listen", DefaultAPIServerListen, "local API server endpoint, IP:PORT")
	f.StringVar(&cfg.EtcdListen, "etcd-listen", "", "local etcd endpoint, IP:PORT such as 127.0.0.1:2379 (empty: none); needs --etcd-endpoints")
	f.StringSliceVar(&cfg.EtcdSeeds, "etcd-endpoints", nil, "comma-separated etcd client URLs to learn the members from (seeds); without them the only API server backend is --server")
	f.StringVar(&etcdCA, "etcd-cacert", "", "CA bundle that signed the etcd server certificates")
	f.StringVar(&etcdCert, "etcd-cert", "", "etcd client certificate (for the member list and etcd health checks)")
	f.StringVar(&etcdK, "etcd-key", "", "etcd client key")
	f.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig to watch the kubernetes Service's EndpointSlices with (the API servers publish themselves there); its user needs the vigil-agent rules of vigil manifest rbac")
	f.BoolVar(&inCluster, "in-cluster", false, "watch the EndpointSlices with the pod's service-account token, through the agent's own --apiserver-listen (the DaemonSet from vigil manifest daemonset does this)")
	f.StringVar(&cfg.CacheDir, "cache-dir", DefaultCacheDir, "directory for the learned backend list (empty: no cache)")
	f.IntVar(&cfg.BackendPort, "backend-port", 0, "API server port on control-plane nodes (0: the port of --server)")
	f.StringVar(&cfg.HealthPath, "health-path", "/readyz", "HTTPS path checked on every API server; 200 means healthy")
	f.StringVar(&healthCA, "health-ca", "", "CA that signed the API servers' serving certificates (default: "+validate.DefaultHealthCA+" when present, else the system roots)")
	f.BoolVar(&healthInsecure, "health-insecure-skip-verify", false, "do not verify API server certificates in health checks (labs only)")
	f.DurationVar(&cfg.HealthInterval, "health-interval", DefaultHealthInterval, "interval between health checks of each backend; each costs the backend one request")
	f.DurationVar(&cfg.HealthTimeout, "health-timeout", DefaultHealthTimeout, "a check without an answer within this is a failure")
	f.IntVar(&cfg.HealthRise, "health-rise", DefaultHealthRise, "consecutive passed checks that bring a failed backend back")
	f.IntVar(&cfg.HealthFall, "health-fall", DefaultHealthFall, "consecutive failed checks that take a backend out")
	f.DurationVar(&cfg.DiscoveryInterval, "discovery-interval", DefaultDiscoveryInterval, "interval between reads of the etcd member list (none while the agent feed is fresh)")
	f.IntVar(&cfg.FeedPort, "feed-port", feed.DefaultPort, "port of the agent feed that vigil run serves on control-plane nodes (--agent-feed-listen): read on the VIP first, then on any control-plane node; while it is fresh the agent reads no member list and checks the backends it vouches for every 10 minutes instead of every --health-interval (0: no feed)")
	f.IntVar(&cfg.MaxConns, "lb-max-conns", lb.DefaultMaxConns, "most client connections each local endpoint serves at once; more are reset at once (-1: no limit)")
	f.IntVar(&cfg.MaxConnsPerSource, "lb-max-conns-per-source", -1, "most connections from one source IP address to each local endpoint (-1, the default: no limit, as local clients all come from the loopback address)")
	f.DurationVar(&cfg.IdleTimeout, "lb-idle-timeout", 0, "close a connection that carried no byte either way for this long (0: never; watches can be quiet for minutes)")
	f.IntVar(&cfg.EventLoops, "lb-event-loops", 0, "event loops (epoll) serving each local endpoint's connections: 0, one per CPU up to 4; 1 to 64, that many; -1 serves every connection with goroutines instead")
	f.DurationVar(&cfg.DrainTimeout, "lb-drain-timeout", lb.DefaultDrainTimeout, "connections to a backend that answers but fails its check (shutting down) are closed after this at the latest")
	f.StringVar(&cfg.MetricsAddress, "metrics-address", DefaultMetricsAddress, "serve /metrics, /healthz and /status here (empty: off)")
	f.BoolVar(&cfg.Pprof, "pprof", false, "also serve Go's profiles under /debug/pprof/ on --metrics-address (off: a profile shows memory and code paths to whoever reaches the address)")
	f.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	f.StringVar(&logFormat, "log-format", "text", "text or json")
	return cmd
}
