// Package daemon is `vigil run`: it wires the election, the VIP and the
// announcer together on one control-plane node.
//
// Shutdown order (Run's context cancelled): the elector steps down, which
// stops the announcer and removes the VIP, then releases the lock so a peer
// takes over at once; only then are the etcd clients closed.
package daemon

import (
	"crypto/tls"
	"fmt"
	"math"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/vigil-ha/vigil/internal/bfd"
	"github.com/vigil-ha/vigil/internal/bgp"
	"github.com/vigil-ha/vigil/internal/dnat"
	"github.com/vigil-ha/vigil/internal/election"
	"github.com/vigil-ha/vigil/internal/health"
	"github.com/vigil-ha/vigil/internal/kube"
	"github.com/vigil-ha/vigil/internal/lb"
	"github.com/vigil-ha/vigil/internal/validate"
)

// validate.ErrInvalid wraps every configuration error.

// Config is everything `vigil run` needs: one struct of settings per part
// of the daemon, embedded, so a setting is read as c.LBPort wherever it is
// used and belongs to one part. Validate fills in the defaults that depend
// on other settings (setDefaults), checks each part on its own (each
// part's validate: no I/O), then the rules between parts (validateAcross),
// then what needs the host (checkHost: files exist and read, a source
// address is this node's), and last derives what the parts are built from
// (the discovery sources, the BGP speaker's configuration).
type Config struct {
	NodeSettings
	StoreSettings
	ElectionSettings
	AnnounceSettings
	LBSettings
	HealthSettings
	ServeSettings
	PruneSettings
}

// NodeSettings: this node and its VIP.
type NodeSettings struct {
	// VIPs are the virtual IPs, one per address family: one address, or
	// an IPv4 and an IPv6 address that one election holds, announces,
	// load-balances and releases together (dual-stack).
	VIPs      []netip.Prefix
	Interface string
	NodeName  string
	// VIPLifetime is the kernel lifetime of the VIP (see vip.DefaultLifetime);
	// zero keeps it until removed.
	VIPLifetime time.Duration
	// GuardBinary, when set, is the vigil executable run as `guard` to
	// remove the VIP if this process dies (see guard.go).
	GuardBinary string
	// GuardSocket, when set, is the Unix socket of a guard that runs on its
	// own (`vigil guard --listen`, the static pod's guard container); vigil
	// connects to it instead of starting a child. It wins over GuardBinary.
	GuardSocket string
}

// StoreSettings: how vigil reaches etcd and the Kubernetes API.
type StoreSettings struct {
	EtcdEndpoints []string
	EtcdCACert    string
	EtcdCert      string
	EtcdKey       string
	// Kubeconfig gives access to the Kubernetes API: required by the
	// Kubernetes election, optional with etcd's (then it serves Events,
	// EndpointSlice discovery and Node deletion only).
	Kubeconfig string
}

// ElectionSettings: who holds the VIP, and on which lock.
type ElectionSettings struct {
	// Election is the backend: ElectionEtcd or ElectionKubernetes.
	Election string
	// LeaseNamespace and LeaseName locate the Lease of the Kubernetes
	// election.
	LeaseNamespace string
	LeaseName      string
	// LockKey is the etcd key of the lock record.
	LockKey string
	// EtcdMemberName is this node's etcd member; while this node holds the
	// VIP, raft leadership is moved off that member. Defaults to NodeName.
	EtcdMemberName string
	// ShedRaftLeadership enables moving raft leadership off the VIP holder.
	ShedRaftLeadership bool

	LeaseDuration time.Duration
	RenewDeadline time.Duration
	RetryPeriod   time.Duration
}

// AnnounceSettings: how the holder makes the VIP reachable.
type AnnounceSettings struct {
	// Announce is AnnounceARP (gratuitous ARP / unsolicited NA on
	// Interface's segment) or AnnounceBGP (a host route to BGP peers; the
	// VIP then sits on Interface, usually lo, as a host prefix).
	Announce         string
	AnnounceInterval time.Duration
	// BGPLocalAS, BGPRouterID and BGPPeers configure the BGP speaker of
	// AnnounceBGP (`bgpPeer` strings, parsed by Validate into BGP).
	BGPLocalAS  int
	BGPRouterID string
	BGPPeers    []string
	// BGPPasswordFile holds the TCP MD5 password of every peer that names
	// no password-file of its own ("" for none).
	BGPPasswordFile string
	// BGPHoldTime, BGPKeepalive, BGPMultihop, BGPSourceAddress,
	// BGPCommunities, BGPLocalPref and BGPGracefulRestart are the
	// sessions' timers and the VIP route's policy (bgp.Config says what
	// each does). Zero values are the defaults.
	BGPHoldTime        time.Duration
	BGPKeepalive       time.Duration
	BGPMultihop        int
	BGPSourceAddress   string
	BGPCommunities     []string
	BGPLocalPref       int64
	BGPGracefulRestart bool
	// BGPMode is BGPModeSingle (the VIP holder alone advertises the VIP)
	// or BGPModeECMP (every node whose own API server is healthy does).
	BGPMode string
	// BGPBFD runs BFD to every peer, every BGPBFDInterval, a peer down
	// after BGPBFDMultiplier intervals without a packet.
	BGPBFD           bool
	BGPBFDInterval   time.Duration
	BGPBFDMultiplier int
	// BGP is the speaker's configuration, derived by Validate.
	BGP bgp.Config
}

// LBSettings: the load balancer on the VIP and where its backends come
// from.
type LBSettings struct {
	// LBPort, when not 0, runs the load balancer on VIP:LBPort, to the
	// API servers (BackendPort, checked as HealthSettings say).
	LBPort int
	// MorePorts are further load-balanced ports on the same backend hosts
	// (`lbPort` given more than once), each with a balancer and checks of
	// its own.
	MorePorts []PortSpec
	// PortChecks are `lbPortCheck`'s PORT=tcp or PORT=/PATH values;
	// Validate applies them to the ports.
	PortChecks []string
	// LBListenPort, when not 0, is where the balancer listens instead
	// (VIP:LBListenPort), nftables on the holder sending VIP:LBPort to it
	// (package dnat): API servers may then keep 0.0.0.0:LBPort.
	LBListenPort int
	LBPolicy     string
	// LBDrainTimeout bounds how long connections to a draining API server
	// are left to finish.
	LBDrainTimeout time.Duration
	// LBMaxConns, LBMaxConnsPerSource and LBIdleTimeout are the load
	// balancer's bounds (lb.Config).
	LBMaxConns          int
	LBMaxConnsPerSource int
	LBIdleTimeout       time.Duration
	// LBEventLoops is lb.Config.Loops: 0 one per CPU (at most 4), -1
	// none (goroutines serve every connection).
	LBEventLoops int
	// BackendPort is the API servers' port; backends are the etcd members'
	// hosts with this port.
	BackendPort int
	// Backends are static host:port backends used until discovery has read
	// the member list (bootstrap only).
	Backends []string
	// Discovery names the backend sources: DiscoveryAuto, or any of
	// DiscoveryEtcd and DiscoveryKubernetes, or DiscoveryNone. Validate
	// resolves DiscoveryAuto.
	Discovery []string
}

// HealthSettings: how the API servers are checked, and health-aware
// placement.
type HealthSettings struct {
	HealthPath string
	// HealthTCP checks the API servers by opening a TCP connection
	// instead of GET HealthPath (`lbPortCheck` PORT=tcp for the first
	// port).
	HealthTCP      bool
	HealthPort     int
	HealthCA       string
	HealthInsecure bool
	HealthInterval time.Duration
	HealthTimeout  time.Duration
	HealthRise     int
	HealthFall     int
	// HealthGrace is how long the local API server may fail its checks
	// before this node gives the VIP to a peer whose API server is healthy;
	// 0 turns health-aware placement off.
	HealthGrace time.Duration
}

// healthTimeout is the checks' timeout, 0 meaning the checker's default.
func (s *HealthSettings) healthTimeout() time.Duration {
	if s.HealthTimeout == 0 {
		return health.DefaultTimeout
	}
	return s.HealthTimeout
}

// ServeSettings: what vigil serves besides the VIP.
type ServeSettings struct {
	// MetricsAddress serves /metrics, /healthz and /status; "" disables.
	MetricsAddress string
	// AgentFeedListen serves the worker agents' feed (internal/feed); ""
	// disables.
	AgentFeedListen string
	// Pprof adds /debug/pprof/ there.
	Pprof bool
}

// PruneSettings: removal of dead etcd members by the VIP holder.
type PruneSettings struct {
	// PruneAfter, when not 0, makes the VIP holder remove etcd members
	// unreachable for longer than this (membership.Prune's rules).
	PruneAfter time.Duration
	// PruneDeleteNode also deletes the Node object named like each pruned
	// member, unless that Node is Ready (needs Kubeconfig).
	PruneDeleteNode bool
}

// How the VIP is announced (--announce).
const (
	AnnounceARP = "arp"
	AnnounceBGP = "bgp"

	// BGPModeSingle: the VIP's one holder advertises it (the default).
	BGPModeSingle = "single"
	// BGPModeECMP: every node whose own API server passes its checks
	// carries the VIP and advertises it, and routers spread flows across
	// them (ecmp.go).
	BGPModeECMP = "ecmp"
)

// Backend discovery sources (--discovery).
const (
	DiscoveryAuto       = "auto" // every source whose access is configured
	DiscoveryEtcd       = "etcd"
	DiscoveryKubernetes = "kubernetes"
	DiscoveryNone       = "none" // --backend only
)

// MinPruneAfter is the shortest --prune-after accepted: a reboot must never
// look like a dead node.
const MinPruneAfter = 10 * time.Second

// QuietPruneAfter is the shortest --prune-after at which, in the lab, a
// removal never stalled etcd. etcd's raft leader closes its connections to
// a removed member before it goes on, and while its writes to a powered-off
// machine fill the socket buffer and then time out (5 s each, one stream
// after the other), that close waits: with --prune-after 10s, 2 of 10
// removals stalled etcd, and so the VIP, for about 4 s; with 30s none of 5
// did (bench/membership, docs/membership.md). Shorter values are accepted,
// with a warning.
const QuietPruneAfter = 30 * time.Second

// Election backends.
const (
	ElectionEtcd       = "etcd"
	ElectionKubernetes = "kubernetes"
)

// DefaultHealthCA: see validate.DefaultHealthCA.
const DefaultHealthCA = validate.DefaultHealthCA

// DefaultHealthGrace: the bound is 3 s. Two seconds is four failed
// checks at the default interval: a single slow /readyz never moves the VIP,
// a dead API server moves it in about 2.5 s.
const DefaultHealthGrace = 2 * time.Second

// ParseVIP parses one --vip (see validate.VIP).
func ParseVIP(s string) (netip.Prefix, error) {
	p, err := validate.VIP(s)
	if err != nil {
		return netip.Prefix{}, validate.Invalid(err)
	}
	return p, nil
}

// ParseVIPs parses --vip given once, or twice for dual-stack (one address
// per family; see validate.VIPs).
func ParseVIPs(ss []string) ([]netip.Prefix, error) {
	ps, err := validate.VIPs(ss)
	if err != nil {
		return nil, validate.Invalid(err)
	}
	return ps, nil
}

// VIPAddrs returns the addresses of the VIPs.
func (c *Config) VIPAddrs() []netip.Addr {
	out := make([]netip.Addr, len(c.VIPs))
	for i, p := range c.VIPs {
		out[i] = p.Addr()
	}
	return out
}

// VIPString lists the VIPs, comma-separated.
func (c *Config) VIPString() string { return vipList(c.VIPs) }

func vipList(vips []netip.Prefix) string {
	s := make([]string, len(vips))
	for i, p := range vips {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}

// Validate checks the configuration and completes it: defaults, then each
// part, then the rules between parts, then what needs this host, then
// what is derived (Config says so in order). Every error wraps
// validate.ErrInvalid and names the setting by its key in the
// configuration file. Validating twice gives the same result.
func (c *Config) Validate() error {
	c.setDefaults()
	for _, check := range []func() error{
		c.NodeSettings.validate,
		c.StoreSettings.validate,
		c.ElectionSettings.validate,
		c.AnnounceSettings.validate,
		c.LBSettings.validate,
		c.HealthSettings.validate,
		c.ServeSettings.validate,
		c.PruneSettings.validate,
		c.validateAcross,
		c.checkHost,
		c.deriveBGP,
	} {
		if err := check(); err != nil {
			return err
		}
	}
	return nil
}

// setDefaults fills in the settings whose default is not a constant the
// flags could show: it depends on another setting, or "" must stay
// distinguishable from the default while checking.
func (c *Config) setDefaults() {
	if c.LockKey == "" {
		c.LockKey = election.DefaultEtcdKey
	}
	if c.EtcdMemberName == "" {
		c.EtcdMemberName = c.NodeName
	}
	if c.BGPMode == "" {
		c.BGPMode = BGPModeSingle
	}
	if c.Announce == "" {
		c.Announce = AnnounceARP
	}
	if c.HealthPath == "" {
		c.HealthPath = health.DefaultPath
	}
	if len(c.Discovery) == 0 {
		c.Discovery = []string{DiscoveryAuto}
	}
}

func (s *NodeSettings) validate() error {
	if err := validate.VIPSet(s.VIPs); err != nil {
		return validate.Invalid(err)
	}
	if s.Interface == "" {
		return fmt.Errorf("%w: `interface` is required", validate.ErrInvalid)
	}
	switch name := strings.ToLower(strings.TrimSpace(s.NodeName)); {
	case name == "":
		return fmt.Errorf("%w: `nodeName` is required (and must be unique among control-plane nodes)", validate.ErrInvalid)
	case name == "localhost" || strings.HasPrefix(name, "localhost."):
		return fmt.Errorf("%w: `nodeName` %q is not unique: every machine whose hostname is not set yet is called that. Set the hostname, or pass `nodeName` with this node's name", validate.ErrInvalid, s.NodeName)
	case name != s.NodeName && strings.TrimSpace(s.NodeName) != s.NodeName:
		return fmt.Errorf("%w: `nodeName` %q has leading or trailing spaces", validate.ErrInvalid, s.NodeName)
	}
	if s.VIPLifetime != 0 && (s.VIPLifetime < time.Second || s.VIPLifetime%time.Second != 0) {
		return fmt.Errorf("%w: `vipLifetime` %v must be 0 (no lifetime) or whole seconds, at least 1s: the kernel counts address lifetimes in seconds", validate.ErrInvalid, s.VIPLifetime)
	}
	return nil
}

func (s *StoreSettings) validate() error {
	if len(s.EtcdEndpoints) > 0 {
		if err := validate.EtcdEndpoints(s.EtcdEndpoints); err != nil {
			return fmt.Errorf("%w: `etcdEndpoints`: %w", validate.ErrInvalid, err)
		}
	}
	if (s.EtcdCert == "") != (s.EtcdKey == "") {
		return fmt.Errorf("%w: `etcdCert` and `etcdKey` go together", validate.ErrInvalid)
	}
	return nil
}

func (s *ElectionSettings) validate() error {
	switch s.Election {
	case ElectionEtcd:
	case ElectionKubernetes:
		if s.LeaseNamespace == "" || s.LeaseName == "" {
			return fmt.Errorf("%w: `leaseNamespace` and `leaseName` must not be empty", validate.ErrInvalid)
		}
	case "":
		return fmt.Errorf("%w: `election` is required (etcd or kubernetes)", validate.ErrInvalid)
	default:
		return fmt.Errorf("%w: unknown `election` backend %q (etcd or kubernetes)", validate.ErrInvalid, s.Election)
	}
	return election.ValidateTimings(s.LeaseDuration, s.RenewDeadline, s.RetryPeriod) // wraps validate.ErrInvalid and names the setting
}

// bgpGiven tells whether any setting of the BGP speaker differs from its
// default: a mistake with `announce` arp.
func (s *AnnounceSettings) bgpGiven() (speaker, policy bool) {
	speaker = s.BGPLocalAS != 0 || s.BGPRouterID != "" || len(s.BGPPeers) > 0 || s.BGPPasswordFile != ""
	policy = (s.BGPHoldTime != 0 && s.BGPHoldTime != bgp.DefaultHoldTime) || (s.BGPKeepalive != 0 && s.BGPKeepalive != bgp.DefaultKeepalive) ||
		s.BGPMultihop != 0 || s.BGPSourceAddress != "" || len(s.BGPCommunities) > 0 || s.BGPLocalPref != 0 || s.BGPGracefulRestart || s.BGPBFD
	return speaker, policy
}

func (s *AnnounceSettings) validate() error {
	switch s.BGPMode {
	case BGPModeSingle, BGPModeECMP:
	default:
		return fmt.Errorf("%w: unknown `bgpMode` %q (single or ecmp)", validate.ErrInvalid, s.BGPMode)
	}
	switch s.Announce {
	case AnnounceARP:
		speaker, policy := s.bgpGiven()
		switch {
		case s.BGPMode == BGPModeECMP:
			return fmt.Errorf("%w: `bgpMode` ecmp needs `announce` bgp: only routers can spread the VIP's flows across nodes; on a shared segment one node answers ARP for it", validate.ErrInvalid)
		case speaker:
			return fmt.Errorf("%w: `bgpLocalAs`, `bgpRouterId`, `bgpPeer` and `bgpPasswordFile` need `announce` bgp", validate.ErrInvalid)
		case policy:
			return fmt.Errorf("%w: `bgpHoldTime`, `bgpKeepalive`, `bgpMultihop`, `bgpSourceAddress`, `bgpCommunity`, `bgpLocalPref`, `bgpGracefulRestart` and `bgpBfd` need `announce` bgp", validate.ErrInvalid)
		}
		return nil
	case AnnounceBGP:
	default:
		return fmt.Errorf("%w: unknown `announce` %q (arp or bgp)", validate.ErrInvalid, s.Announce)
	}
	if s.BGPLocalAS < 0 || s.BGPLocalAS > 4294967294 {
		return fmt.Errorf("%w: `bgpLocalAs` %d: give this node's AS number, 1 to 4294967294", validate.ErrInvalid, s.BGPLocalAS)
	}
	if s.BGPMultihop < 0 || s.BGPMultihop > 255 {
		return fmt.Errorf("%w: `bgpMultihop` %d: give the TTL, 2 to 255, for routers that are not on this node's network (0: directly connected)", validate.ErrInvalid, s.BGPMultihop)
	}
	if s.BGPLocalPref < 0 || s.BGPLocalPref > math.MaxUint32 {
		return fmt.Errorf("%w: `bgpLocalPref` %d: give 1 to 4294967295 (0: none)", validate.ErrInvalid, s.BGPLocalPref)
	}
	bfdTimers := (s.BGPBFDInterval != 0 && s.BGPBFDInterval != bfd.DefaultInterval) || (s.BGPBFDMultiplier != 0 && s.BGPBFDMultiplier != bfd.DefaultMultiplier)
	switch {
	case s.BGPBFD && (s.BGPBFDMultiplier < 0 || s.BGPBFDMultiplier > 255):
		// 0 is refused (bfd.ValidateTimers), not taken for the default:
		// the flags' defaults are what `bgpBfd` alone gets.
		return fmt.Errorf("%w: `bgpBfdMultiplier` %d: give 1 to 255 (3 is usual)", validate.ErrInvalid, s.BGPBFDMultiplier)
	case !s.BGPBFD && bfdTimers:
		return fmt.Errorf("%w: `bgpBfdInterval` and `bgpBfdMultiplier` need `bgpBfd`", validate.ErrInvalid)
	}
	if s.BGPSourceAddress != "" {
		if a, err := netip.ParseAddr(s.BGPSourceAddress); err != nil || a.Zone() != "" {
			return fmt.Errorf("%w: `bgpSourceAddress` %q is not an IP address", validate.ErrInvalid, s.BGPSourceAddress)
		}
	}
	if s.BGPRouterID != "" {
		if _, err := netip.ParseAddr(s.BGPRouterID); err != nil {
			return fmt.Errorf("%w: `bgpRouterId` %q is not an IPv4 address", validate.ErrInvalid, s.BGPRouterID)
		}
	}
	if s.BGPPasswordFile != "" && !filepath.IsAbs(s.BGPPasswordFile) {
		return fmt.Errorf("%w: `bgpPasswordFile` %q: give an absolute path", validate.ErrInvalid, s.BGPPasswordFile)
	}
	return nil
}

func (s *LBSettings) validate() error {
	switch {
	case s.LBPort < 0 || s.LBPort > 65535:
		return fmt.Errorf("%w: `lbPort` %d is out of range (1-65535, or 0 for no load balancer)", validate.ErrInvalid, s.LBPort)
	case s.BackendPort < 1 || s.BackendPort > 65535:
		return fmt.Errorf("%w: `backendPort` %d is out of range 1-65535", validate.ErrInvalid, s.BackendPort)
	case s.LBListenPort < 0 || s.LBListenPort > 65535:
		return fmt.Errorf("%w: `lbListenPort` %d is out of range (1-65535, or 0 to listen on `lbPort` itself)", validate.ErrInvalid, s.LBListenPort)
	case s.LBListenPort != 0 && s.LBPort == 0:
		return fmt.Errorf("%w: `lbListenPort` needs `lbPort` (the port clients use, which the holder sends to it)", validate.ErrInvalid)
	case s.LBListenPort != 0 && s.LBListenPort == s.LBPort:
		return fmt.Errorf("%w: `lbListenPort` %d is `lbPort`: give another port, or leave it out to listen on `lbPort` itself", validate.ErrInvalid, s.LBListenPort)
	case s.LBDrainTimeout < 0:
		return fmt.Errorf("%w: `lbDrainTimeout` %v must be positive", validate.ErrInvalid, s.LBDrainTimeout)
	}
	if _, err := lb.ParsePolicy(s.LBPolicy); err != nil {
		return fmt.Errorf("%w: `lbPolicy`: %w", validate.ErrInvalid, err)
	}
	for _, b := range s.Backends {
		host, port, err := net.SplitHostPort(b)
		if n, perr := strconv.Atoi(port); err != nil || host == "" || perr != nil || n < 1 || n > 65535 {
			return fmt.Errorf("%w: `backend` %q must be HOST:PORT", validate.ErrInvalid, b)
		}
	}
	if err := lb.CheckLimits(s.LBMaxConns, s.LBMaxConnsPerSource, s.LBIdleTimeout); err != nil {
		return err
	}
	return lb.CheckLoops(s.LBEventLoops)
}

func (s *HealthSettings) validate() error {
	switch {
	case s.HealthPort < 0 || s.HealthPort > 65535:
		return fmt.Errorf("%w: `healthPort` %d is out of range (1-65535, or 0 for the backend port)", validate.ErrInvalid, s.HealthPort)
	case s.HealthCA != "" && s.HealthInsecure:
		return fmt.Errorf("%w: `healthCa` and `healthInsecureSkipVerify` exclude each other", validate.ErrInvalid)
	case s.HealthInterval < 0, s.HealthTimeout < 0, s.HealthRise < 0, s.HealthFall < 0:
		return fmt.Errorf("%w: `healthInterval`, `healthTimeout`, `healthRise` and `healthFall` must be positive", validate.ErrInvalid)
	case s.HealthGrace < 0:
		return fmt.Errorf("%w: `healthGrace` %v must be 0 (off) or positive", validate.ErrInvalid, s.HealthGrace)
	}
	if err := health.ValidatePath(s.HealthPath); err != nil {
		return fmt.Errorf("%w: `healthPath`: %w", validate.ErrInvalid, err)
	}
	return nil
}

func (s *ServeSettings) validate() error {
	if s.Pprof && s.MetricsAddress == "" {
		return fmt.Errorf("%w: `pprof` serves on `metricsAddress`, which is empty", validate.ErrInvalid)
	}
	if err := validate.ListenAddress("`agentFeedListen`", s.AgentFeedListen, true); err != nil {
		return validate.Invalid(err)
	}
	if err := validate.ListenAddress("`metricsAddress`", s.MetricsAddress, true); err != nil {
		return validate.Invalid(err)
	}
	return nil
}

func (s *PruneSettings) validate() error {
	switch {
	case s.PruneDeleteNode && s.PruneAfter == 0:
		return fmt.Errorf("%w: `pruneDeleteNode` needs `pruneAfter` (it acts on pruned members) and `kubeconfig` (to delete their Nodes)", validate.ErrInvalid)
	case s.PruneAfter != 0 && s.PruneAfter < MinPruneAfter:
		return fmt.Errorf("%w: `pruneAfter` %v is shorter than %v; a member must be gone for longer than a reboot takes (minutes in production)", validate.ErrInvalid, s.PruneAfter, MinPruneAfter)
	}
	return nil
}

// validateAcross checks the rules between parts, and resolves the
// discovery sources (which depend on the stores given).
func (c *Config) validateAcross() error {
	switch {
	case c.Election == ElectionEtcd && len(c.EtcdEndpoints) == 0:
		return fmt.Errorf("%w: `etcdEndpoints` is required with `election` etcd", validate.ErrInvalid)
	case c.Election == ElectionKubernetes && c.Kubeconfig == "":
		return fmt.Errorf("%w: `kubeconfig` is required with `election` kubernetes (a kubeconfig for this node's own API server)", validate.ErrInvalid)
	case c.PruneDeleteNode && c.Kubeconfig == "":
		return fmt.Errorf("%w: `pruneDeleteNode` needs `pruneAfter` (it acts on pruned members) and `kubeconfig` (to delete their Nodes)", validate.ErrInvalid)
	case c.Announce == AnnounceBGP && c.BGPMode == BGPModeECMP && c.LBListenPort != 0:
		return fmt.Errorf("%w: `lbListenPort` needs one VIP holder, and `bgpMode` ecmp has none: with ecmp every node's balancer listens on VIP:`lbPort`, so bind kube-apiserver to the node's address (or give `lbPort` another port)", validate.ErrInvalid)
	}
	if c.Announce == AnnounceBGP {
		for _, v := range c.VIPs {
			if v.Bits() != v.Addr().BitLen() {
				return fmt.Errorf("%w: `vip` %s: with `announce` bgp give the VIP as a host address (%s/%d): routers learn it as a host route, and the VIP must not bring a subnet onto `interface`", validate.ErrInvalid, v, v.Addr(), v.Addr().BitLen())
			}
		}
	}
	if err := c.validatePorts(); err != nil {
		return err
	}
	sources, err := c.discoverySources()
	if err != nil {
		return err
	}
	c.Discovery = sources
	return nil
}

// checkHost checks what needs this host: the files named exist, and a
// Lease election's kubeconfig does not reach the API through the VIP.
func (c *Config) checkHost() error {
	for key, f := range map[string]string{"`kubeconfig`": c.Kubeconfig, "`etcdCacert`": c.EtcdCACert, "`etcdCert`": c.EtcdCert, "`etcdKey`": c.EtcdKey, "`healthCa`": c.HealthCA} {
		if f == "" {
			continue
		}
		if _, err := os.Stat(f); err != nil {
			return fmt.Errorf("%w: %s %s: %w", validate.ErrInvalid, key, f, err)
		}
	}
	if c.Election == ElectionKubernetes {
		return c.checkLeaseServer()
	}
	return nil
}

// deriveBGP builds the BGP speaker's configuration from the `bgp*`
// settings (`announce` bgp only): it reads the password files, finds the
// router ID when none is given and checks that a source address is this
// node's.
func (c *Config) deriveBGP() error {
	if c.Announce != AnnounceBGP {
		c.BGP = bgp.Config{}
		return nil
	}
	cfg := bgp.Config{LocalAS: uint32(c.BGPLocalAS), HoldTime: c.BGPHoldTime, Keepalive: c.BGPKeepalive, GracefulRestart: c.BGPGracefulRestart,
		Multihop: uint8(c.BGPMultihop), LocalPref: uint32(c.BGPLocalPref)}
	if c.BGPBFD {
		cfg.BFDInterval, cfg.BFDMultiplier = c.BGPBFDInterval, uint8(c.BGPBFDMultiplier)
	}
	for _, s := range c.BGPCommunities {
		x, err := bgp.ParseCommunity(s)
		if err != nil {
			return err
		}
		cfg.Communities = append(cfg.Communities, x)
	}
	if c.BGPSourceAddress != "" {
		cfg.SourceAddress = netip.MustParseAddr(c.BGPSourceAddress).Unmap() // AnnounceSettings.validate parsed it
	}
	for _, s := range c.BGPPeers {
		p, err := bgp.ParsePeer(s)
		if err != nil {
			return err
		}
		if err := p.LoadPassword(c.BGPPasswordFile); err != nil {
			return err
		}
		cfg.Peers = append(cfg.Peers, p)
	}
	if c.BGPRouterID != "" {
		cfg.RouterID = netip.MustParseAddr(c.BGPRouterID) // AnnounceSettings.validate parsed it
	} else if len(cfg.Peers) > 0 {
		// The address this node reaches its first peer from: unique
		// among the nodes, and what an operator would pick.
		cfg.RouterID = bgp.SourceAddr(cfg.Peers[0].Address)
		if !cfg.RouterID.Is4() {
			return fmt.Errorf("%w: `bgpRouterId`: this node has no IPv4 address towards %s to default to; give one", validate.ErrInvalid, cfg.Peers[0].Address)
		}
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	if cfg.SourceAddress.IsValid() && !isLocalAddr(cfg.SourceAddress) {
		return fmt.Errorf("%w: `bgpSourceAddress` %s is not an address of this node (a session can only leave from one)", validate.ErrInvalid, cfg.SourceAddress)
	}
	c.BGP = cfg
	return nil
}

// ecmp tells whether every healthy node carries the VIP (--bgp-mode ecmp).
func (c *Config) ecmp() bool { return c.BGPMode == BGPModeECMP }

// listenPort is where the balancer listens: --lb-listen-port, or
// --lb-port itself.
func (c *Config) listenPort() int {
	if c.LBListenPort != 0 {
		return c.LBListenPort
	}
	return c.LBPort
}

// dnatRules are the holder's nftables rules with --lb-listen-port (nil
// without): VIP:--lb-port to VIP:--lb-listen-port, for every VIP address.
func (c *Config) dnatRules() []dnat.Rule {
	if c.LBListenPort == 0 {
		return nil
	}
	var out []dnat.Rule
	for _, a := range c.VIPAddrs() {
		out = append(out, dnat.Rule{VIP: a, From: uint16(c.LBPort), To: uint16(c.LBListenPort)})
	}
	return out
}

// isLocalAddr tells whether a is one of this host's addresses: whether a
// socket can bind it.
func isLocalAddr(a netip.Addr) bool {
	l, err := net.ListenPacket("udp", netip.AddrPortFrom(a, 0).String())
	if err != nil {
		return false
	}
	l.Close()
	return true
}

// checkLeaseServer refuses a Lease election whose kubeconfig reaches the API
// through the VIP it elects: with no holder nobody could reach the Lease, so
// nobody would ever hold the VIP.
func (c *Config) checkLeaseServer() error {
	server, err := kube.Server(c.Kubeconfig)
	if err != nil {
		return err
	}
	u, err := url.Parse(server)
	if err != nil {
		return fmt.Errorf("%w: `kubeconfig` %s: server %q: %w", validate.ErrInvalid, c.Kubeconfig, server, err)
	}
	if a, err := netip.ParseAddr(u.Hostname()); err == nil && slices.Contains(c.VIPAddrs(), a.Unmap()) {
		return fmt.Errorf("%w: `kubeconfig` %s points at the VIP (%s): the Lease election must reach an API server without the VIP it elects, or with no holder nobody could ever take the Lease. Point it at this node's own API server (https://<node IP>:6443)", validate.ErrInvalid, c.Kubeconfig, server)
	}
	return nil
}

// discoverySources resolves DiscoveryAuto and checks that each source
// named has its access configured, and that a load balancer gets backends
// from somewhere.
func (c *Config) discoverySources() ([]string, error) {
	var out []string
	for _, d := range c.Discovery {
		switch d {
		case DiscoveryAuto:
			if len(c.Discovery) > 1 {
				return nil, fmt.Errorf("%w: `discovery` auto stands alone", validate.ErrInvalid)
			}
			if len(c.EtcdEndpoints) > 0 {
				out = append(out, DiscoveryEtcd)
			}
			if c.Kubeconfig != "" {
				out = append(out, DiscoveryKubernetes)
			}
		case DiscoveryEtcd:
			if len(c.EtcdEndpoints) == 0 {
				return nil, fmt.Errorf("%w: `discovery` etcd needs `etcdEndpoints`", validate.ErrInvalid)
			}
			out = append(out, d)
		case DiscoveryKubernetes:
			if c.Kubeconfig == "" {
				return nil, fmt.Errorf("%w: `discovery` kubernetes needs `kubeconfig`", validate.ErrInvalid)
			}
			out = append(out, d)
		case DiscoveryNone:
			if len(c.Discovery) > 1 {
				return nil, fmt.Errorf("%w: `discovery` none stands alone", validate.ErrInvalid)
			}
		default:
			return nil, fmt.Errorf("%w: unknown `discovery` source %q (auto, etcd, kubernetes or none)", validate.ErrInvalid, d)
		}
	}
	if c.LBPort != 0 && len(out) == 0 && len(c.Backends) == 0 {
		return nil, fmt.Errorf("%w: `lbPort` needs backends: give `etcdEndpoints` (the member list), `kubeconfig` (the kubernetes Service's EndpointSlices) or `backend`", validate.ErrInvalid)
	}
	return out, nil
}

// discovers reports whether source is one of the resolved Discovery.
func (c *Config) discovers(source string) bool { return slices.Contains(c.Discovery, source) }

// tlsConfig loads the etcd client TLS files; nil when none are given.
func (c *Config) tlsConfig() (*tls.Config, error) {
	tc, err := validate.EtcdClientTLS(c.EtcdCACert, c.EtcdCert, c.EtcdKey)
	if err != nil {
		return nil, validate.Invalid(err)
	}
	return tc, nil
}

// healthTLS is how API server certificates are verified (see
// validate.HealthTLS).
func (c *Config) healthTLS() (*tls.Config, error) {
	tc, err := validate.HealthTLS(c.HealthCA, c.HealthInsecure)
	if err != nil {
		return nil, validate.Invalid(err)
	}
	return tc, nil
}
