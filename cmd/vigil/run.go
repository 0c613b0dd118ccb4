package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/vigil-ha/vigil/internal/config"
	"github.com/vigil-ha/vigil/internal/daemon"
	"github.com/vigil-ha/vigil/internal/election"
)

func newRunCmd() *cobra.Command {
	var (
		cfg       daemon.Config
		vipFlag   []string
		lbPorts   []string
		logLevel  string
		logFormat string
		guard     bool
	)
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run the control-plane daemon: elect a leader and hold the VIP",
		Long: `Run the control-plane node daemon.

Every control-plane node runs "vigil run" with the same --vip. The nodes elect
one leader through etcd (a compare-and-swap lock record, no consensus of our
own), or with --election kubernetes through a coordination.k8s.io/v1 Lease
(resourceVersion preconditions; --kubeconfig must reach this node's own API
server, never the VIP). The leader adds the VIP to --interface, announces it with gratuitous ARP
(IPv4) or unsolicited neighbour advertisements (IPv6), and re-announces it
periodically. A node joins or leaves the election by starting or stopping this
command; there is no peer list.

Safety: a leader that cannot renew its lease for --renew-deadline removes the
VIP, and a candidate waits a whole --lease-duration, on its own clock, before
it takes an unrenewed lock. --lease-duration minus --renew-deadline (at least
100ms) is the margin that keeps two nodes from holding the VIP at once. While
etcd itself is electing a raft leader nobody can take the lock, so the holder
keeps the VIP through etcd elections.

On SIGTERM or SIGINT the VIP is removed first, then the lock is released so a
peer takes over at once. If vigil is killed outright, a guard child process
removes the VIP at once (--guard); if vigil is stopped (SIGSTOP, starvation),
the guard removes it when the lease deadline vigil last sent it has passed,
before any peer may take over. If both are stopped or killed together, the
kernel drops the VIP when its refreshed lifetime runs out (--vip-lifetime).

The address follows the role continuously (netlink events): a VIP that
appears on a node that does not hold the lock is removed at once (a stray), a
VIP removed from the holder is put back. A holder whose --interface is gone,
down or without carrier releases the lock to a peer, and such a node does not
campaign. Every node probes (ARP/NDP) who answers for the VIP every 3 s and
reports any hardware address but the holder's (vigil_vip_conflicts_total,
vigil status). A second process with the same --node-name exits with an error
naming the other. etcd being unreachable at start is not an error (with
kubeadm it starts after vigil): vigil retries with backoff and never holds the
VIP meanwhile.

BGP (--announce bgp). For L3 networks, where the VIP is reached through
routers: every node keeps a BGP session to each --bgp-peer, and only the
holder advertises the VIP as a host route (/32 or /128), next hop its own
address. It withdraws the route when it steps down, before the lock can be
taken. A killed holder cannot withdraw; the next holder's route carries a
lower MED than every earlier holder's, so routers prefer it at once, without
waiting for the dead session's hold timer. Give the VIP as a host address on
lo (--vip 10.0.0.100/32 --interface lo). A node with no established session
does not campaign, and a holder that loses its last one steps down. See
docs/bgp.md for router configuration.

API servers. Every node health-checks every API server (HTTPS GET
--health-path, default /readyz). The list is discovered (--discovery): from
the etcd member list (each member's client URL host with --backend-port),
and, with --kubeconfig, from the kubernetes Service's EndpointSlices, where
every kube-apiserver publishes itself (this also finds API servers that do
not run beside an etcd member). --backend is only for bootstrap. A node whose own API server fails its checks for --health-grace
while a peer's has passed every check as long gives the VIP up and does not campaign, unless no peer
takes it (then it holds it rather than leave the cluster without a VIP).

Load balancer (--lb-port). The VIP holder accepts TCP on VIP:--lb-port and
forwards each connection (TLS untouched) to a healthy API server, least
connections first. The listener binds the VIP on every node, so the local
kube-apiserver must not listen on 0.0.0.0 at that port: start it with
--bind-address=<node IP> (kubeadm: apiServer.extraArgs bind-address), or use
another port, e.g. --lb-port 8443 with controlPlaneEndpoint VIP:8443, or
keep kubeadm's default and give --lb-listen-port 16443: the balancer then
listens on VIP:16443, and nftables on the holder alone sends VIP:6443 to it.
More ports on the same hosts (RKE2's supervisor, 9345): repeat --lb-port.
Each further port has its own balancer, backends (PORT, or PORT:BACKENDPORT
on each host), health checks (TCP by default, --lb-port-check PORT=/PATH for
HTTPS) and metrics (label port), and moves with the VIP.

Kubernetes API (--kubeconfig, optional with --election etcd). vigil records
Events on leadership changes (on the Lease, or on this Node with the etcd
election), follows the EndpointSlices above and, with --prune-delete-node,
deletes the Node of each member it prunes once that node's kubelet has not
renewed its Lease (kube-node-lease) for --prune-after. The
API server being down, or refusing (403), never affects the VIP: Events are
dropped and the watch retries. The user needs the rules of
"vigil manifest rbac".

Moving from the etcd election to the Lease election. A vigil run with
--election kubernetes and --etcd-endpoints first retires the etcd election:
it waits until the etcd lock is released or expired, as an etcd candidate
would, then writes a record there that no etcd candidate ever takes ("moved to
lease NAMESPACE/NAME"). Only then does it campaign on the Lease, so nodes can
move one at a time without two holders. Once retired, one read of that
record at start is all it needs from etcd. A vigil run with --election etcd that
finds such a record does not campaign, and says why. See docs/kubeadm.md.

Bootstrap (kubeadm init with controlPlaneEndpoint: VIP). Use --election etcd
with kubeadm's etcd client certificates: the VIP comes up as soon as the
local etcd does, before any API server exists and before admin.conf has
any rights. See docs/kubeadm.md.`,
		Example: `  vigil run --vip 10.250.0.100/24 --interface eth0 --node-name cp1 \
    --election etcd --etcd-endpoints https://10.250.0.11:2379,https://10.250.0.12:2379 \
    --etcd-cacert /etc/kubernetes/pki/etcd/ca.crt \
    --etcd-cert /etc/kubernetes/pki/apiserver-etcd-client.crt \
    --etcd-key /etc/kubernetes/pki/apiserver-etcd-client.key \
    --lb-port 8443 --backend-port 6443`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := config.Apply(cmd.Flags(), config.SectionRun, os.Getenv); err != nil {
				return err
			}
			if cfg.Election == daemon.ElectionKubernetes {
				leaseTimings(cmd.Flags(), &cfg)
			}
			log, err := newLogger(logLevel, logFormat)
			if err != nil {
				return err
			}
			if cfg.NodeName == "" {
				cfg.NodeName, _ = os.Hostname() // "" if unknown; Validate then asks for --node-name
			}
			if cfg.VIPs, err = daemon.ParseVIPs(vipFlag); err != nil {
				return err
			}
			if err := cfg.SetLBPorts(lbPorts, cmd.Flags().Changed("backend-port")); err != nil {
				return err
			}
			if guard {
				if cfg.GuardBinary, err = os.Executable(); err != nil {
					return fmt.Errorf("find own executable for the VIP guard: %w", err)
				}
			}
			return daemon.Run(cmd.Context(), cfg, log)
		},
	}
	f := cmd.Flags()
	config.AddFlag(f, string(config.SectionRun))
	cfg.AddFlags(f)
	f.StringSliceVar(&vipFlag, "vip", nil, "virtual IP with prefix length, e.g. 10.250.0.100/24 (a bare address means /32 or /128); give it twice, one IPv4 and one IPv6, for a dual-stack VIP that moves as one")
	f.BoolVar(&guard, "guard", true, "run a small guard process that removes the VIP the moment vigil dies (even by SIGKILL) or stops renewing its lease (SIGSTOP, starvation)")
	f.Var(newPortsFlag(&lbPorts), "lb-port", "run the load balancer on VIP:PORT, forwarding to every healthy API server (0: no load balancer; the VIP reaches the holder's own API server). kube-apiserver must then not bind 0.0.0.0 on this port, unless --lb-listen-port is given: see --help. PORT:BACKENDPORT sets --backend-port too. Repeat it (or give a list) for more ports on the same hosts, e.g. --lb-port 6443 --lb-port 9345 for RKE2: each further PORT or PORT:BACKENDPORT has its own backends, checks (--lb-port-check) and metrics")
	f.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	f.StringVar(&logFormat, "log-format", "text", "text or json")
	return cmd
}

func newGuardCmd() *cobra.Command {
	var (
		cfg    daemon.GuardConfig
		listen string
	)
	cmd := &cobra.Command{
		Use:   "guard --vip IP --interface IF [--listen SOCKET]",
		Short: "Remove the VIP the moment vigil run dies or stops renewing (started by vigil run, or as its own container)",
		Long: `The guard removes the VIP when vigil run cannot: when it dies (SIGKILL, the
OOM killer) or stops renewing its lease (SIGSTOP, starvation). It never adds
the VIP.

Without --listen it is vigil run's child (vigil run --guard, the default),
reading lease deadlines from standard input; vigil run starts it.

With --listen it runs on its own, as the static pod's second container
(vigil manifest pod): in a container vigil run is PID 1, and a child dies
with it. vigil run --guard-socket connects to the socket; when that
connection ends, because vigil run exited or its container was killed, the
guard removes the VIP at once, and it keeps serving the next vigil run.
A vigil run that no guard listens to does not hold the VIP.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("component", "guard")
			if listen == "" {
				// Only the death of vigil run, which closes our stdin, may
				// end the guard; a signal meant for the whole group must not.
				signal.Ignore(syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
				return daemon.Guard(cfg, os.Stdin, os.Stdout, log)
			}
			if _, err := daemon.ParseVIPs(cfg.VIPs); err != nil {
				return err
			}
			if err := os.Remove(listen); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("guard: remove the old socket: %w", err)
			}
			ln, err := net.Listen("unix", listen)
			if err != nil {
				return fmt.Errorf("guard: %w", err)
			}
			defer os.Remove(listen)
			if err := os.Chmod(listen, 0o600); err != nil {
				ln.Close()
				return fmt.Errorf("guard: %w", err)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			return daemon.ServeGuard(ctx, cfg, ln, log)
		},
	}
	cmd.Flags().StringSliceVar(&cfg.VIPs, "vip", nil, "VIP to remove (twice for dual-stack)")
	cmd.Flags().StringVar(&cfg.Interface, "interface", "", "interface that carries it")
	cmd.Flags().DurationVar(&cfg.Slack, "slack", 0, "without --listen: remove the VIP this long after a lease deadline vigil run sent passes without a newer one (with --listen, each vigil run sends its own)")
	cmd.Flags().StringVar(&listen, "listen", "", "serve vigil run --guard-socket on this Unix socket, as a process of its own (the static pod's guard container)")
	return cmd
}

// leaseTimings gives the Lease backend its own defaults for the timings not
// set on the command line or in the configuration file: an API server's
// writes are slower and spikier than etcd's (election.DefaultAPILeaseDuration).
func leaseTimings(f *pflag.FlagSet, cfg *daemon.Config) {
	for _, t := range []struct {
		flag string
		v    *time.Duration
		def  time.Duration
	}{
		{"lease-duration", &cfg.LeaseDuration, election.DefaultAPILeaseDuration},
		{"renew-deadline", &cfg.RenewDeadline, election.DefaultAPIRenewDeadline},
		{"retry-period", &cfg.RetryPeriod, election.DefaultAPIRetryPeriod},
	} {
		if !f.Changed(t.flag) {
			*t.v = t.def
		}
	}
}
