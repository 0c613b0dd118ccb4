package daemon

import (
	"github.com/spf13/pflag"

	"github.com/vigil-ha/vigil/internal/announce"
	"github.com/vigil-ha/vigil/internal/bfd"
	"github.com/vigil-ha/vigil/internal/bgp"
	"github.com/vigil-ha/vigil/internal/election"
	"github.com/vigil-ha/vigil/internal/health"
	"github.com/vigil-ha/vigil/internal/lb"
	"github.com/vigil-ha/vigil/internal/vip"
)

// AddFlags adds every part's flags to f, each bound to its setting: a
// flag's name is its setting's key in the configuration file in kebab case
// (--lb-port: lbPort), and its default is the setting's. The flags whose
// values need parsing across settings (--vip, --lb-port) and those of the
// command itself (--guard, logging) are the command's.
func (c *Config) AddFlags(f *pflag.FlagSet) {
	c.NodeSettings.addFlags(f)
	c.StoreSettings.addFlags(f)
	c.ElectionSettings.addFlags(f)
	c.AnnounceSettings.addFlags(f)
	c.LBSettings.addFlags(f)
	c.HealthSettings.addFlags(f)
	c.ServeSettings.addFlags(f)
	c.PruneSettings.addFlags(f)
}

func (s *NodeSettings) addFlags(f *pflag.FlagSet) {
	f.StringVar(&s.Interface, "interface", "", "interface that carries the VIP, e.g. eth0")
	f.StringVar(&s.NodeName, "node-name", "", "this node's name in the election; unique per control-plane node (default: the host name)")
	f.DurationVar(&s.VIPLifetime, "vip-lifetime", vip.DefaultLifetime, "kernel lifetime of the VIP (whole seconds), refreshed every 250ms by the holder: if vigil and its guard are stopped or killed together, the kernel drops the VIP after this; 0 disables")
	f.StringVar(&s.GuardSocket, "guard-socket", "", "use the guard listening on this Unix socket (vigil guard --listen, the static pod's guard container) instead of a child: in a container vigil is PID 1 and a child dies with it")
}

func (s *StoreSettings) addFlags(f *pflag.FlagSet) {
	f.StringVar(&s.Kubeconfig, "kubeconfig", "", "kubeconfig for the Kubernetes API: required by --election kubernetes (this node's own API server), optional otherwise (Events, EndpointSlice discovery, --prune-delete-node); its user needs the rules from vigil manifest rbac")
	f.StringSliceVar(&s.EtcdEndpoints, "etcd-endpoints", nil, "comma-separated etcd client URLs to start from; vigil then follows the client URLs the members advertise")
	f.StringVar(&s.EtcdCACert, "etcd-cacert", "", "CA bundle that signed the etcd server certificates")
	f.StringVar(&s.EtcdCert, "etcd-cert", "", "etcd client certificate")
	f.StringVar(&s.EtcdKey, "etcd-key", "", "etcd client key")
}

func (s *ElectionSettings) addFlags(f *pflag.FlagSet) {
	f.StringVar(&s.Election, "election", ElectionEtcd, "election backend: etcd (works before the API server exists) or kubernetes (a coordination.k8s.io/v1 Lease)")
	f.StringVar(&s.LeaseNamespace, "lease-namespace", election.DefaultLeaseNamespace, "namespace of the election Lease (--election kubernetes)")
	f.StringVar(&s.LeaseName, "lease-name", election.DefaultLeaseName, "name of the election Lease (--election kubernetes)")
	f.StringVar(&s.LockKey, "lock-key", election.DefaultEtcdKey, "etcd key that holds the lock record")
	f.StringVar(&s.EtcdMemberName, "etcd-member-name", "", "this node's etcd member name (default: --node-name)")
	f.BoolVar(&s.ShedRaftLeadership, "shed-etcd-leadership", true, "while holding the VIP, move etcd raft leadership to another member, so one crash never costs both a VIP failover and an etcd election")
	f.DurationVar(&s.LeaseDuration, "lease-duration", election.DefaultLeaseDuration, "how long candidates wait, on their own clock, before taking an unrenewed lock; failover takes about this long (with --election kubernetes the default is "+election.DefaultAPILeaseDuration.String()+")")
	f.DurationVar(&s.RenewDeadline, "renew-deadline", election.DefaultRenewDeadline, "the leader removes the VIP when no renewal succeeded for this long; must be at least 100ms below --lease-duration (with --election kubernetes the default is "+election.DefaultAPIRenewDeadline.String()+")")
	f.DurationVar(&s.RetryPeriod, "retry-period", election.DefaultRetryPeriod, "interval between renewals and between candidate reads (with --election kubernetes the default is "+election.DefaultAPIRetryPeriod.String()+")")
}

func (s *AnnounceSettings) addFlags(f *pflag.FlagSet) {
	f.StringVar(&s.Announce, "announce", AnnounceARP, "how the holder makes the VIP reachable: arp (gratuitous ARP / unsolicited neighbour advertisements on --interface's segment) or bgp (a host route to every --bgp-peer; put the VIP on lo as a host address, see docs/bgp.md)")
	f.DurationVar(&s.AnnounceInterval, "announce-interval", announce.DefaultInterval, "interval between periodic gratuitous ARP / neighbour advertisements (--announce arp)")
	f.IntVar(&s.BGPLocalAS, "bgp-local-as", 0, "this node's AS number (--announce bgp; the same on every control-plane node, so routers compare their MEDs)")
	f.StringVar(&s.BGPRouterID, "bgp-router-id", "", "BGP router ID, an IPv4 address unique per node (--announce bgp; default: this node's address towards the first --bgp-peer)")
	f.StringArrayVar(&s.BGPPeers, "bgp-peer", nil, "a BGP neighbour, ADDRESS,AS[,password-file=PATH][,port=N]; repeat the flag for each router (--announce bgp). password-file: its TCP MD5 password, the file's first line (a password itself is refused on the command line)")
	f.StringVar(&s.BGPPasswordFile, "bgp-password-file", "", "file whose first line is the TCP MD5 password of every --bgp-peer that names no password-file of its own (--announce bgp)")
	f.DurationVar(&s.BGPHoldTime, "bgp-hold-time", bgp.DefaultHoldTime, "BGP hold time offered to every peer, whole seconds, 3s to 65535s and at least 3 x --bgp-keepalive; a router drops a silent node's route after the smaller of the two sides' (--announce bgp)")
	f.DurationVar(&s.BGPKeepalive, "bgp-keepalive", bgp.DefaultKeepalive, "interval between BGP keepalives, whole seconds (--announce bgp)")
	f.IntVar(&s.BGPMultihop, "bgp-multihop", 0, "TTL of the sessions to eBGP peers that are not on this node's network, 2 to 255 (0: directly connected; --announce bgp)")
	f.StringVar(&s.BGPSourceAddress, "bgp-source-address", "", "local address of every BGP session, one of this node's, such as a loopback address the routers reach; it is also the VIP route's next hop (default: the kernel's choice towards each peer; --announce bgp)")
	f.StringArrayVar(&s.BGPCommunities, "bgp-community", nil, "a standard community on the VIP's route, AS:VALUE or no-export, no-advertise, no-export-subconfed; repeatable (--announce bgp)")
	f.Int64Var(&s.BGPLocalPref, "bgp-local-pref", 0, "LOCAL_PREF on the VIP's route, sent to iBGP peers (those in --bgp-local-as) only (0: none; --announce bgp)")
	f.StringVar(&s.BGPMode, "bgp-mode", BGPModeSingle, "single: the VIP holder alone advertises the VIP; ecmp: every node whose own API server passes its checks carries the VIP on --interface, serves it with its load balancer and advertises it, and the routers spread flows across them (the election still picks one node for pruning and Node deletion; docs/bgp.md, \"ECMP\"; --announce bgp)")
	f.BoolVar(&s.BGPBFD, "bgp-bfd", false, "run BFD (RFC 5880, single hop) to every --bgp-peer: a router that ties its session to BFD drops a dead or frozen node's route within --bgp-bfd-interval x --bgp-bfd-multiplier instead of the hold time, and a peer whose BFD session is down counts as down here (--announce bgp; docs/bgp.md)")
	f.DurationVar(&s.BGPBFDInterval, "bgp-bfd-interval", bfd.DefaultInterval, "interval between BFD packets, and the slowest accepted from the router, 50ms to 1m (--bgp-bfd)")
	f.IntVar(&s.BGPBFDMultiplier, "bgp-bfd-multiplier", bfd.DefaultMultiplier, "intervals without a BFD packet before a side declares the other down, 1 to 255 (--bgp-bfd)")
	f.BoolVar(&s.BGPGracefulRestart, "bgp-graceful-restart", false, "advertise BGP graceful restart: routers keep this node's routes 9 s after its session drops, so a restarted vigil does not flap them; a dead holder's route then lingers as well, and the new holder's lower MED takes over from it (--announce bgp)")
}

func (s *LBSettings) addFlags(f *pflag.FlagSet) {
	f.StringArrayVar(&s.PortChecks, "lb-port-check", nil, "how the backends of one --lb-port are checked, PORT=tcp (accepts a connection) or PORT=/PATH (HTTPS GET answers 200, verified like --health-path); repeatable. Default: --health-path for the first --lb-port, tcp for the others")
	f.IntVar(&s.LBListenPort, "lb-listen-port", 0, "listen on VIP:PORT instead of VIP:--lb-port, and on the VIP holder only send VIP:--lb-port to it with nftables: the API servers keep kubeadm's default bind address 0.0.0.0 at --lb-port (0: listen on --lb-port itself)")
	f.StringVar(&s.LBPolicy, "lb-policy", "least-conn", "load balancing policy: least-conn or round-robin")
	f.IntVar(&s.LBMaxConns, "lb-max-conns", lb.DefaultMaxConns, "most client connections the load balancer serves at once; more are reset at once, so a flood cannot run vigil, and the VIP with it, out of memory. The default fits the static pod's 128Mi limit (an idle connection costs about 0.7 KiB in an event loop and 14 KiB once handed to goroutines, docs/lb.md); raise both together (-1: no limit)")
	f.IntVar(&s.LBMaxConnsPerSource, "lb-max-conns-per-source", lb.DefaultMaxConnsPerSource, "most connections from one source IP address; one client or NAT cannot take every slot (-1: no limit)")
	f.DurationVar(&s.LBIdleTimeout, "lb-idle-timeout", 0, "close a connection that carried no byte either way for this long (0: never; watches can be quiet for minutes, so keep it well above their timeouts)")
	f.IntVar(&s.LBEventLoops, "lb-event-loops", 0, "event loops (epoll) serving the load balancer's connections: 0, one per CPU up to 4; 1 to 64, that many; -1 serves every connection with two goroutines instead, the data path before event loops (docs/lb.md, \"Event loops\")")
	f.DurationVar(&s.LBDrainTimeout, "lb-drain-timeout", lb.DefaultDrainTimeout, "connections to an API server that answers but fails its check (shutting down) are closed after this at the latest")
	f.IntVar(&s.BackendPort, "backend-port", 6443, "port of the API servers; backends are the etcd members' hosts with this port")
	f.StringSliceVar(&s.Backends, "backend", nil, "static HOST:PORT backends, used only until discovery has found any (bootstrap)")
	f.StringSliceVar(&s.Discovery, "discovery", []string{DiscoveryAuto}, "where the API server backends come from: etcd (the member list), kubernetes (the kubernetes Service's EndpointSlices), both (etcd,kubernetes), auto (each source whose access is given) or none (--backend only)")
}

func (s *HealthSettings) addFlags(f *pflag.FlagSet) {
	f.StringVar(&s.HealthPath, "health-path", health.DefaultPath, "HTTPS path checked on every API server; 200 means healthy")
	f.IntVar(&s.HealthPort, "health-port", 0, "port for health checks (0: the backend port)")
	f.StringVar(&s.HealthCA, "health-ca", "", "CA that signed the API servers' serving certificates (default: "+DefaultHealthCA+" when present, else the system roots)")
	f.BoolVar(&s.HealthInsecure, "health-insecure-skip-verify", false, "do not verify API server certificates in health checks (labs only)")
	f.DurationVar(&s.HealthInterval, "health-interval", health.DefaultInterval, "interval between health checks of each API server")
	f.DurationVar(&s.HealthTimeout, "health-timeout", health.DefaultTimeout, "a check without an answer within this is a failure")
	f.IntVar(&s.HealthRise, "health-rise", health.DefaultRise, "consecutive passed checks that bring a failed backend back")
	f.IntVar(&s.HealthFall, "health-fall", health.DefaultFall, "consecutive failed checks that take a backend out")
	f.DurationVar(&s.HealthGrace, "health-grace", DefaultHealthGrace, "when this node's own API server has failed its checks this long and a peer's has passed every check this long, the last within half of --health-timeout, give the VIP to that peer (0: off)")
}

func (s *ServeSettings) addFlags(f *pflag.FlagSet) {
	f.StringVar(&s.MetricsAddress, "metrics-address", "127.0.0.1:9558", "serve /metrics, /healthz and /status here (empty: off)")
	f.StringVar(&s.AgentFeedListen, "agent-feed-listen", "", "serve the worker agents' feed here, such as :9557 (the agents' --feed-port): this node's view of the API servers' and etcd members' health, streamed, so that a fleet of agents need not check every backend every second (empty: off; vigil manifest turns it on)")
	f.BoolVar(&s.Pprof, "pprof", false, "also serve Go's profiles under /debug/pprof/ on --metrics-address (off: a profile shows memory and code paths to whoever reaches the address)")
}

func (s *PruneSettings) addFlags(f *pflag.FlagSet) {
	f.DurationVar(&s.PruneAfter, "prune-after", 0, "while holding the VIP, remove etcd members that a majority of the voters' vigils have seen unreachable, without a break, for this long, never below a healthy quorum; no prune in the first period after start or takeover (0: off; at least 10s; under 30s a removal can stall etcd, and the VIP, for up to 5 s; minutes in production)")
	f.BoolVar(&s.PruneDeleteNode, "prune-delete-node", false, "with --prune-after and --kubeconfig: also delete the Node named like each pruned member, once its kubelet has not renewed its node Lease for --prune-after (and unless it is Ready)")
}
