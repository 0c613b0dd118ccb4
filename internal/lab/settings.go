package lab

import (
	"fmt"
	"net/netip"
	"slices"
	"time"
)

// Settings describe the lab that `up` builds; they are saved with it.
type Settings struct {
	Nodes int    `json:"nodes"`
	Impl  string `json:"impl"`
	// Vigil timings; zero means vigil's defaults.
	LeaseDuration time.Duration `json:"leaseDuration,omitempty"`
	RenewDeadline time.Duration `json:"renewDeadline,omitempty"`
	RetryPeriod   time.Duration `json:"retryPeriod,omitempty"`
	// Load balancer and health settings passed to vigil run (vigil labs
	// only). LBPort 0 runs vigil without its load balancer.
	LBPort      int           `json:"lbPort"`
	BackendPort int           `json:"backendPort"`
	HealthPort  int           `json:"healthPort,omitempty"`
	HealthGrace time.Duration `json:"healthGrace,omitempty"`
	// LBMaxConns is vigil's --lb-max-conns (0: vigil's default, -1: no
	// limit). The reconnect-storm drill needs StormClients.
	LBMaxConns int `json:"lbMaxConns,omitempty"`
	// LBEventLoops is vigil's --lb-event-loops (0: vigil's default, one
	// per CPU; -1: no loops, every connection on goroutines), to measure
	// the two data paths side by side.
	LBEventLoops int `json:"lbEventLoops,omitempty"`
	// PruneAfter is vigil's --prune-after; with it, replace-node waits for
	// vigil to prune the dead member instead of running vigil members
	// prune.
	PruneAfter time.Duration `json:"pruneAfter,omitempty"`
	// Workers is how many worker nodes (vigil agent and clients) up starts.
	Workers int `json:"workers,omitempty"`
	// APIServer is what runs as each node's API server: APIServerStandIn
	// (default) or APIServerKube, the real kube-apiserver.
	APIServer string `json:"apiServer,omitempty"`
	// Election is vigil's --election: ElectionEtcd (default) or
	// ElectionKubernetes (a Lease; needs APIServerKube).
	Election string `json:"election,omitempty"`
	// VIPLink gives every node a second link (vip0) that carries only the
	// VIP, so faults can take the VIP's link down while etcd's stays up.
	VIPLink bool `json:"vipLink,omitempty"`
	// EtcdLogLevel is etcd's --log-level; empty means warn.
	EtcdLogLevel string `json:"etcdLogLevel,omitempty"`
	// Kubeadm builds a real kubeadm cluster (kubeadm.go): every node runs
	// containerd and a kubelet, and kubeadm runs etcd, the control plane
	// and vigil as static pods.
	Kubeadm bool `json:"kubeadm,omitempty"`
	// LBListenPort, with Kubeadm, leaves every kube-apiserver on kubeadm's
	// default 0.0.0.0:6443 and runs vigil with --lb-listen-port: the
	// balancer on VIP:LBListenPort, VIP:6443 sent to it by the holder's
	// nftables rule. 0 binds each API server to its node's address
	// instead, so that the balancer can listen on VIP:6443.
	LBListenPort int `json:"lbListenPort,omitempty"`
	// Announce is how vigil announces the VIP: AnnounceARP (default) or
	// AnnounceBGP, through a router running BIRD (router.go).
	Announce string `json:"announce,omitempty"`
	// BGPBFD, with AnnounceBGP, runs BFD between every node and the
	// router (vigil run --bgp-bfd at BFDInterval x 3, BIRD's bfd on): a
	// node killed or cut off loses its route within 300 ms.
	BGPBFD bool `json:"bgpBFD,omitempty"`
	// BFDInterval is BFD's interval on both sides with BGPBFD (0:
	// BFDInterval); the multiplier is 3.
	BFDInterval time.Duration `json:"bfdInterval,omitempty"`
	// BGPMode "ecmp", with AnnounceBGP, runs vigil run --bgp-mode ecmp:
	// every node advertises the VIP and the router spreads flows across
	// them (BIRD merges the routes, the kernel hashes on ports too). Its
	// drill is ecmp-node-killed (ecmpdrill.go); the single-holder drills
	// do not apply. "" is the default, one holder.
	BGPMode string `json:"bgpMode,omitempty"`
	// RouterHash, with BGPMode ecmp, is how the router spreads flows
	// across the nodes: RouterHashResilient (default) or
	// RouterHashThreshold (fib.go).
	RouterHash string `json:"routerHash,omitempty"`
	// IPFamily is the VIP's family: IPv4 (default), IPv6, or Dual (one
	// address of each, held as one by vigil). Labs with IPv6 give every
	// host an address on subnet6 too; etcd and the API servers stay on
	// IPv4.
	IPFamily string `json:"ipFamily,omitempty"`
}

// IP families of the lab's VIP (--ip-family).
const (
	IPv4 = "ipv4"
	IPv6 = "ipv6"
	Dual = "dual"
)

// has4 and has6 tell which families the VIP has.
func (s Settings) has4() bool { return s.IPFamily != IPv6 }
func (s Settings) has6() bool { return s.IPFamily == IPv6 || s.IPFamily == Dual }

// vips are the VIP's addresses as vigil and the lab's faults add them,
// IPv4 first: host addresses in the routed lab, where they sit on lo.
func (s Settings) vips() []netip.Prefix {
	var out []netip.Prefix
	for _, p := range []netip.Prefix{VIP, VIP6} {
		if (p.Addr().Is4() && s.has4()) || (p.Addr().Is6() && s.has6()) {
			if s.bgp() {
				p = netip.PrefixFrom(p.Addr(), p.Addr().BitLen())
			}
			out = append(out, p)
		}
	}
	return out
}

// vipPrefix is the VIP's first address (IPv4 unless the lab is IPv6-only).
func (s Settings) vipPrefix() netip.Prefix { return s.vips()[0] }

// vipAddr is the address of vipPrefix: what single-family checks probe.
func (s Settings) vipAddr() netip.Addr { return s.vipPrefix().Addr() }

// family names the family of a.
func family(a netip.Addr) string {
	if a.Is4() {
		return IPv4
	}
	return IPv6
}

// addr6 is the IPv6 address of node index i in a lab with IPv6, else the
// zero Addr.
func (s Settings) addr6(i int) netip.Addr {
	if !s.has6() {
		return netip.Addr{}
	}
	return nodeIP6(i)
}

// vipIface is the interface vigil puts the VIP on.
func (s Settings) vipIface() string {
	if s.bgp() {
		return "lo"
	}
	if s.VIPLink {
		return vipIface
	}
	return nodeIface
}

func (s Settings) kube() bool { return s.APIServer == APIServerKube }

// Ports of the stand-in API server on every node of a vigil lab.
const (
	APIServerPort = 6443
	// BulkPort serves the load balancer benchmark's raw TCP protocol.
	BulkPort = 7000
)

// Validate checks the settings.
func (s Settings) Validate() error {
	if s.Nodes < 1 || s.Nodes > 9 {
		return fmt.Errorf("lab: --nodes %d: use 1 to 9", s.Nodes)
	}
	switch s.Impl {
	case ImplVigil, ImplKeepalived, ImplKeepalivedTuned:
	default:
		return fmt.Errorf("lab: unknown --impl %q (vigil, keepalived or keepalived-tuned)", s.Impl)
	}
	switch s.APIServer {
	case "", APIServerStandIn:
	case APIServerKube:
		if s.Impl != ImplVigil {
			return fmt.Errorf("lab: --apiserver kube needs --impl vigil")
		}
	default:
		return fmt.Errorf("lab: unknown --apiserver %q (standin or kube)", s.APIServer)
	}
	switch s.Election {
	case "", ElectionEtcd:
	case ElectionKubernetes:
		if !s.kube() {
			return fmt.Errorf("lab: --election kubernetes needs --apiserver kube (a real API server to hold the Lease)")
		}
	default:
		return fmt.Errorf("lab: unknown --election %q (etcd or kubernetes)", s.Election)
	}
	if s.VIPLink && s.Impl != ImplVigil {
		return fmt.Errorf("lab: --vip-link needs --impl vigil")
	}
	if s.Workers < 0 || s.Workers > 9 {
		return fmt.Errorf("lab: --workers %d: use 0 to 9", s.Workers)
	}
	if s.Workers > 0 && s.Impl != ImplVigil {
		return fmt.Errorf("lab: --workers needs --impl vigil (the agent learns the control plane from etcd)")
	}
	switch s.EtcdLogLevel {
	case "", "debug", "info", "warn", "error":
	default:
		return fmt.Errorf("lab: unknown --etcd-log-level %q (debug, info, warn or error)", s.EtcdLogLevel)
	}
	if s.Kubeadm {
		switch {
		case s.Impl != ImplVigil:
			return fmt.Errorf("lab: --kubeadm needs --impl vigil")
		case s.kube() || s.Election == ElectionKubernetes:
			return fmt.Errorf("lab: --kubeadm runs kubeadm's own kube-apiserver and vigil's etcd election; drop --apiserver and --election")
		case s.VIPLink:
			return fmt.Errorf("lab: --kubeadm does not support --vip-link")
		case s.LeaseDuration != 0 || s.RenewDeadline != 0 || s.RetryPeriod != 0 || s.HealthPort != 0 || s.HealthGrace != 0:
			return fmt.Errorf("lab: --kubeadm runs vigil from the manifest vigil manifest pod writes; its timings are vigil's defaults")
		case s.LBPort != APIServerPort || s.BackendPort != APIServerPort:
			return fmt.Errorf("lab: --kubeadm puts the load balancer on VIP:%d in front of the API servers on %d; drop --lb-port and --backend-port", APIServerPort, APIServerPort)
		case s.LBListenPort < 0 || s.LBListenPort > 65535 || s.LBListenPort == APIServerPort:
			return fmt.Errorf("lab: --lb-listen-port %d: give a port other than %d (0: API servers bound to their node's address instead)", s.LBListenPort, APIServerPort)
		}
	} else if s.LBListenPort != 0 {
		return fmt.Errorf("lab: --lb-listen-port needs --kubeadm (where kube-apiserver keeps kubeadm's 0.0.0.0:%d)", APIServerPort)
	}
	switch s.IPFamily {
	case "", IPv4:
	case IPv6, Dual:
		switch {
		case s.Impl != ImplVigil:
			return fmt.Errorf("lab: --ip-family %s needs --impl vigil", s.IPFamily)
		case s.Kubeadm:
			return fmt.Errorf("lab: --kubeadm does not support --ip-family %s yet (its cluster and certificates are IPv4)", s.IPFamily)
		}
	default:
		return fmt.Errorf("lab: unknown --ip-family %q (ipv4, ipv6 or dual)", s.IPFamily)
	}
	switch s.Announce {
	case "", AnnounceARP:
	case AnnounceBGP:
		switch {
		case s.Impl != ImplVigil:
			return fmt.Errorf("lab: --announce bgp needs --impl vigil")
		case s.Kubeadm:
			return fmt.Errorf("lab: --kubeadm does not support --announce bgp")
		case s.VIPLink:
			return fmt.Errorf("lab: --announce bgp does not support --vip-link (the VIP sits on lo)")
		}
	default:
		return fmt.Errorf("lab: unknown --announce %q (arp or bgp)", s.Announce)
	}
	if s.BGPBFD && !s.bgp() {
		return fmt.Errorf("lab: --bgp-bfd needs --announce bgp")
	}
	if s.BFDInterval != 0 && (!s.BGPBFD || s.BFDInterval < 50*time.Millisecond || s.BFDInterval > time.Second) {
		return fmt.Errorf("lab: --bfd-interval %v: needs --bgp-bfd, and from 50ms to 1s", s.BFDInterval)
	}
	switch s.BGPMode {
	case "", "single":
	case BGPModeECMP:
		switch {
		case !s.bgp():
			return fmt.Errorf("lab: --bgp-mode ecmp needs --announce bgp")
		case s.LBPort == 0:
			return fmt.Errorf("lab: --bgp-mode ecmp needs --lb-port: every node's balancer serves the VIP")
		case s.has6():
			return fmt.Errorf("lab: --bgp-mode ecmp is IPv4 only in the lab")
		}
	default:
		return fmt.Errorf("lab: unknown --bgp-mode %q (single or ecmp)", s.BGPMode)
	}
	switch s.RouterHash {
	case "", RouterHashResilient, RouterHashThreshold:
		if s.RouterHash != "" && !s.ecmp() {
			return fmt.Errorf("lab: --router-hash needs --bgp-mode ecmp")
		}
	default:
		return fmt.Errorf("lab: unknown --router-hash %q (resilient or threshold)", s.RouterHash)
	}
	for flag, p := range map[string]int{"--lb-port": s.LBPort, "--backend-port": s.BackendPort, "--health-port": s.HealthPort} {
		if p < 0 || p > 65535 {
			return fmt.Errorf("lab: %s %d is out of range", flag, p)
		}
	}
	switch {
	case s.LBMaxConns < -1:
		return fmt.Errorf("lab: --lb-max-conns %d: give a number of connections, 0 for vigil's default or -1 for no limit", s.LBMaxConns)
	case s.LBMaxConns != 0 && (s.Impl != ImplVigil || s.LBPort == 0 || s.Kubeadm):
		return fmt.Errorf("lab: --lb-max-conns needs vigil's load balancer in a lab of its own processes (--impl vigil, --lb-port, no --kubeadm)")
	case s.LBEventLoops < -1:
		return fmt.Errorf("lab: --lb-event-loops %d: give a number of loops, 0 for vigil's default or -1 for none", s.LBEventLoops)
	case s.LBEventLoops != 0 && (s.Impl != ImplVigil || s.LBPort == 0 || s.Kubeadm):
		return fmt.Errorf("lab: --lb-event-loops needs vigil's load balancer in a lab of its own processes (--impl vigil, --lb-port, no --kubeadm)")
	}
	return nil
}

// reservedPorts are the ports the user chose that are inside the lab's
// ephemeral range (ephemeralFloor and up), sorted, each once: no outgoing
// connection in a lab namespace may take one before its listener binds.
func (s Settings) reservedPorts() []int {
	var ps []int
	for _, p := range []int{s.LBPort, s.BackendPort, s.HealthPort, s.LBListenPort} {
		if p >= ephemeralFloor && p <= 65535 && !slices.Contains(ps, p) {
			ps = append(ps, p)
		}
	}
	slices.Sort(ps)
	return ps
}
