package daemon

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vigil-ha/vigil/internal/bgp"
	"github.com/vigil-ha/vigil/internal/election"
	"github.com/vigil-ha/vigil/internal/kube"
	"github.com/vigil-ha/vigil/internal/validate"
)

func TestParseVIP(t *testing.T) {
	tests := []struct {
		in   string
		want string
		ok   bool
	}{
		{"10.250.0.100/24", "10.250.0.100/24", true},
		{"10.250.0.100", "10.250.0.100/32", true},
		{"fd00::10", "fd00::10/128", true},
		{"fd00::10/64", "fd00::10/64", true},
		{"", "", false},
		{"10.250.0.300/24", "", false},
		{"10.250.0.1/33", "", false},
		{"eth0", "", false},
		{"fe80::1%eth0/64", "", false},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseVIP(tc.in)
			if (err == nil) != tc.ok {
				t.Fatalf("ParseVIP(%q) error = %v, want ok=%v", tc.in, err, tc.ok)
			}
			if tc.ok && got.String() != tc.want {
				t.Fatalf("ParseVIP(%q) = %s, want %s", tc.in, got, tc.want)
			}
			if !tc.ok && !errors.Is(err, validate.ErrInvalid) {
				t.Fatalf("error %v does not wrap validate.ErrInvalid", err)
			}
		})
	}
}

func validConfig() Config {
	return Config{
		NodeSettings:  NodeSettings{VIPs: []netip.Prefix{netip.MustParsePrefix("10.250.0.100/24")}, Interface: "eth0", NodeName: "cp1"},
		StoreSettings: StoreSettings{EtcdEndpoints: []string{"http://10.250.0.11:2379"}},
		ElectionSettings: ElectionSettings{
			Election:      "etcd",
			LeaseDuration: election.DefaultLeaseDuration,
			RenewDeadline: election.DefaultRenewDeadline,
			RetryPeriod:   election.DefaultRetryPeriod,
		},
		LBSettings: LBSettings{BackendPort: 6443},
	}
}

func TestValidate(t *testing.T) {
	dir := t.TempDir()
	exists := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(exists, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		mutate  func(*Config)
		wantErr error
	}{
		{"valid", func(*Config) {}, nil},
		{"no vip", func(c *Config) { c.VIPs = nil }, validate.ErrInvalid},
		{"dual-stack", func(c *Config) { c.VIPs = append(c.VIPs, netip.MustParsePrefix("fd00:250::100/64")) }, nil},
		{"two IPv4 VIPs", func(c *Config) { c.VIPs = append(c.VIPs, netip.MustParsePrefix("10.250.0.101/24")) }, validate.ErrInvalid},
		{"three VIPs", func(c *Config) {
			c.VIPs = append(c.VIPs, netip.MustParsePrefix("fd00:250::100/64"), netip.MustParsePrefix("fd00:250::101/64"))
		}, validate.ErrInvalid},
		{"no interface", func(c *Config) { c.Interface = "" }, validate.ErrInvalid},
		{"no node name", func(c *Config) { c.NodeName = "" }, validate.ErrInvalid},
		{"unknown backend", func(c *Config) { c.Election = "raft" }, validate.ErrInvalid},
		{"no endpoints", func(c *Config) { c.EtcdEndpoints = nil }, validate.ErrInvalid},
		{"endpoint without scheme", func(c *Config) { c.EtcdEndpoints = []string{"10.0.0.1:2379"} }, validate.ErrInvalid},
		{"cert without key", func(c *Config) { c.EtcdCert = exists }, validate.ErrInvalid},
		{"missing ca file", func(c *Config) { c.EtcdCACert = filepath.Join(dir, "nope.crt") }, validate.ErrInvalid},
		{"vip lifetime below a second", func(c *Config) { c.VIPLifetime = 500 * time.Millisecond }, validate.ErrInvalid},
		{"vip lifetime not whole seconds", func(c *Config) { c.VIPLifetime = 1500 * time.Millisecond }, validate.ErrInvalid},
		{"vip lifetime one second", func(c *Config) { c.VIPLifetime = time.Second }, nil},
		{"node name localhost", func(c *Config) { c.NodeName = "localhost" }, validate.ErrInvalid},
		{"node name localhost.localdomain", func(c *Config) { c.NodeName = "localhost.localdomain" }, validate.ErrInvalid},
		{"node name with spaces", func(c *Config) { c.NodeName = " cp1" }, validate.ErrInvalid},
		{"renew deadline not below lease", func(c *Config) { c.RenewDeadline = c.LeaseDuration }, validate.ErrInvalid},
		{"margin below 100ms", func(c *Config) { c.RenewDeadline = c.LeaseDuration - 50*time.Millisecond }, validate.ErrInvalid},
		{"with load balancer", func(c *Config) { c.LBPort, c.Backends, c.HealthCA = 8443, []string{"10.0.0.1:6443"}, exists }, nil},
		{"lb port out of range", func(c *Config) { c.LBPort = 70000 }, validate.ErrInvalid},
		{"backend port out of range", func(c *Config) { c.BackendPort = 0 }, validate.ErrInvalid},
		{"health port out of range", func(c *Config) { c.HealthPort = -1 }, validate.ErrInvalid},
		{"unknown lb policy", func(c *Config) { c.LBPolicy = "random" }, validate.ErrInvalid},
		{"static backend without port", func(c *Config) { c.Backends = []string{"10.0.0.1"} }, validate.ErrInvalid},
		{"malformed health path", func(c *Config) { c.HealthPath = "readyz" }, validate.ErrInvalid},
		{"health ca and insecure", func(c *Config) { c.HealthCA, c.HealthInsecure = exists, true }, validate.ErrInvalid},
		{"missing health ca", func(c *Config) { c.HealthCA = filepath.Join(dir, "nope.crt") }, validate.ErrInvalid},
		{"negative grace", func(c *Config) { c.HealthGrace = -time.Second }, validate.ErrInvalid},
		{"bad metrics address", func(c *Config) { c.MetricsAddress = "9558" }, validate.ErrInvalid},
		{"bad agent feed address", func(c *Config) { c.AgentFeedListen = "9557" }, validate.ErrInvalid},
		{"pprof without a metrics address", func(c *Config) { c.Pprof, c.MetricsAddress = true, "" }, validate.ErrInvalid},
		{"prune-after shorter than a reboot", func(c *Config) { c.PruneAfter = time.Second }, validate.ErrInvalid},
		{"prune-after on", func(c *Config) { c.PruneAfter = 10 * time.Minute }, nil},
		{"negative drain timeout", func(c *Config) { c.LBDrainTimeout = -time.Second }, validate.ErrInvalid},
		{"max conns below -1", func(c *Config) { c.LBMaxConns = -2 }, validate.ErrInvalid},
		{"per-source above total", func(c *Config) { c.LBMaxConns, c.LBMaxConnsPerSource = 100, 200 }, validate.ErrInvalid},
		{"negative idle timeout", func(c *Config) { c.LBIdleTimeout = -time.Second }, validate.ErrInvalid},
		{"no connection limits", func(c *Config) { c.LBMaxConns, c.LBMaxConnsPerSource = -1, -1 }, nil},
		{"two ports", func(c *Config) {
			c.LBPort, c.MorePorts, c.PortChecks = 6443, []PortSpec{{Port: 9345, BackendPort: 9345}}, []string{"9345=/ping", "6443=tcp"}
		}, nil},
		{"a port given twice", func(c *Config) { c.LBPort, c.MorePorts = 6443, []PortSpec{{Port: 6443, BackendPort: 6443}} }, validate.ErrInvalid},
		{"a further port as the listen port", func(c *Config) {
			c.LBPort, c.LBListenPort, c.MorePorts = 6443, 16443, []PortSpec{{Port: 16443, BackendPort: 9345}}
		}, validate.ErrInvalid},
		{"further ports without a first", func(c *Config) { c.MorePorts = []PortSpec{{Port: 9345, BackendPort: 9345}} }, validate.ErrInvalid},
		{"further port out of range", func(c *Config) { c.LBPort, c.MorePorts = 6443, []PortSpec{{Port: 9345, BackendPort: 0}} }, validate.ErrInvalid},
		{"a check of a port not balanced", func(c *Config) { c.LBPort, c.PortChecks = 6443, []string{"9345=tcp"} }, validate.ErrInvalid},
		{"a port checked twice", func(c *Config) { c.LBPort, c.PortChecks = 6443, []string{"6443=tcp", "6443=/readyz"} }, validate.ErrInvalid},
		{"a bad check", func(c *Config) { c.LBPort, c.PortChecks = 6443, []string{"6443=http"} }, validate.ErrInvalid},
		{"a check beside --health-path", func(c *Config) { c.LBPort, c.HealthPath, c.PortChecks = 6443, "/livez", []string{"6443=/ping"} }, validate.ErrInvalid},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := validConfig()
			tc.mutate(&c)
			err := c.Validate()
			if tc.wantErr == nil {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				if c.EtcdMemberName != c.NodeName || c.LockKey != election.DefaultEtcdKey {
					t.Fatalf("defaults not filled in: %+v", c)
				}
				return
			}
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("Validate() = %v, want an error wrapping %v", err, tc.wantErr)
			}
		})
	}
}

func TestValidateKubernetesElection(t *testing.T) {
	kubeconfig := func(name, server string) string {
		p := filepath.Join(t.TempDir(), name)
		doc := "apiVersion: v1\nkind: Config\nclusters:\n- name: k\n  cluster: {server: \"" + server + "\"}\ncontexts:\n- name: k\n  context: {cluster: k, user: u}\ncurrent-context: k\nusers:\n- name: u\n  user: {token: t}\n"
		if err := os.WriteFile(p, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	kc := kubeconfig("own", "https://10.250.0.11:6443")
	viaVIP := kubeconfig("vip", "https://10.250.0.100:6443")
	kubeCfg := func(mod func(*Config)) Config {
		c := validConfig()
		c.Election, c.Kubeconfig, c.LeaseNamespace, c.LeaseName = ElectionKubernetes, kc, "kube-system", "vigil"
		c.EtcdEndpoints = nil
		mod(&c)
		return c
	}
	ok := kubeCfg(func(*Config) {})
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid kubernetes config refused: %v", err)
	}
	if !slices.Equal(ok.Discovery, []string{DiscoveryKubernetes}) {
		t.Fatalf("auto discovery with a kubeconfig only = %v, want kubernetes", ok.Discovery)
	}
	both := validConfig()
	both.Kubeconfig = kc
	if err := both.Validate(); err != nil || !slices.Equal(both.Discovery, []string{DiscoveryEtcd, DiscoveryKubernetes}) {
		t.Fatalf("etcd election with a kubeconfig: %v, discovery %v; want both sources", err, both.Discovery)
	}
	for name, c := range map[string]Config{
		"no kubeconfig":            kubeCfg(func(c *Config) { c.Kubeconfig = "" }),
		"missing kubeconfig":       kubeCfg(func(c *Config) { c.Kubeconfig = kc + ".nope" }),
		"kubeconfig via the VIP":   kubeCfg(func(c *Config) { c.Kubeconfig = viaVIP }),
		"empty lease name":         kubeCfg(func(c *Config) { c.LeaseName = "" }),
		"lb without backends":      kubeCfg(func(c *Config) { c.LBPort = 6443; c.Discovery = []string{DiscoveryNone} }),
		"unknown backend":          kubeCfg(func(c *Config) { c.Election = "consul" }),
		"etcd without endpoint":    kubeCfg(func(c *Config) { c.Election = ElectionEtcd }),
		"etcd discovery, no etcd":  kubeCfg(func(c *Config) { c.Discovery = []string{DiscoveryEtcd} }),
		"unknown discovery":        kubeCfg(func(c *Config) { c.Discovery = []string{"dns"} }),
		"auto with another":        kubeCfg(func(c *Config) { c.Discovery = []string{DiscoveryAuto, DiscoveryEtcd} }),
		"delete node, no prune":    kubeCfg(func(c *Config) { c.PruneDeleteNode = true }),
		"missing kubeconfig, etcd": func() Config { c := validConfig(); c.Kubeconfig = kc + ".nope"; return c }(),
		"kubernetes discovery, no kubeconfig": func() Config {
			c := validConfig()
			c.Discovery = []string{DiscoveryKubernetes}
			return c
		}(),
		"delete node, no kubeconfig": func() Config {
			c := validConfig()
			c.PruneAfter, c.PruneDeleteNode = time.Minute, true
			return c
		}(),
	} {
		if err := c.Validate(); !errors.Is(err, validate.ErrInvalid) {
			t.Errorf("%s: err = %v, want validate.ErrInvalid", name, err)
		}
	}
	// An unreadable kubeconfig is caught when the client is built.
	bad := filepath.Join(t.TempDir(), "bad")
	if err := os.WriteFile(bad, []byte("not: [yaml"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := kube.NewClient(bad); !errors.Is(err, validate.ErrInvalid) {
		t.Fatalf("kube.NewClient(garbage) err = %v, want validate.ErrInvalid", err)
	}
}

func TestValidateAnnounce(t *testing.T) {
	// The peers' TCP MD5 passwords come from files: the peer's own, or
	// --bgp-password-file for the others.
	dir := t.TempDir()
	own, every := filepath.Join(dir, "own"), filepath.Join(dir, "every")
	bgpConfig := func() Config {
		c := validConfig()
		c.VIPs = []netip.Prefix{netip.MustParsePrefix("10.250.0.100/32")}
		c.Interface = "lo"
		c.Announce = AnnounceBGP
		c.BGPLocalAS = 65001
		c.BGPRouterID = "10.250.0.11"
		c.BGPPeers = []string{"10.250.0.254,65000", "10.250.0.253,65000,password-file=" + own}
		return c
	}
	if err := os.WriteFile(own, []byte("x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(every, []byte("y"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := bgpConfig()
	c.BGPPasswordFile = every
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if len(c.BGP.Peers) != 2 || c.BGP.LocalAS != 65001 || c.BGP.RouterID != netip.MustParseAddr("10.250.0.11") || c.BGP.Peers[0].Password != "y" || c.BGP.Peers[1].Password != "x" {
		t.Fatalf("BGP config = %+v", c.BGP)
	}
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"a password on the command line", func(c *Config) { c.BGPPeers = []string{"10.250.0.254,65000,password=x"} }, "password-file=PATH"},
		{"a missing password file", func(c *Config) { c.BGPPasswordFile = filepath.Join(dir, "none") }, "no such file"},
		{"a relative password file", func(c *Config) { c.BGPPasswordFile = "bgp-password" }, "absolute path"},
		{"an empty password file", func(c *Config) { c.BGPPasswordFile = own + ".empty"; _ = os.WriteFile(c.BGPPasswordFile, nil, 0o600) }, "holds no password"},
		{"a password file without bgp", func(c *Config) {
			c.Announce, c.BGPLocalAS, c.BGPRouterID, c.BGPPeers, c.BGPPasswordFile = AnnounceARP, 0, "", nil, every
		}, "need `announce` bgp"},
	} {
		c := bgpConfig()
		tc.edit(&c)
		if err := c.Validate(); !errors.Is(err, validate.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an invalid configuration saying %q", tc.name, err, tc.want)
		}
	}
	arp := validConfig()
	if err := arp.Validate(); err != nil || arp.Announce != AnnounceARP {
		t.Fatalf("default announce: %q, %v", arp.Announce, err)
	}
	// The timers and the policy, the flags' defaults for hold time and
	// keepalive included (they are not a reason to refuse arp).
	arp = validConfig()
	arp.BGPHoldTime, arp.BGPKeepalive = bgp.DefaultHoldTime, bgp.DefaultKeepalive
	if err := arp.Validate(); err != nil {
		t.Fatalf("arp with the BGP timers' defaults: %v", err)
	}
	c = bgpConfig()
	c.BGPHoldTime, c.BGPKeepalive, c.BGPMultihop = 6*time.Second, 2*time.Second, 2
	c.BGPSourceAddress = "127.0.0.1" // an address this host has
	c.BGPCommunities = []string{"65001:100", "no-export"}
	c.BGPGracefulRestart = true
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if b := c.BGP; b.HoldTime != 6*time.Second || b.Keepalive != 2*time.Second || b.Multihop != 2 || b.SourceAddress != netip.MustParseAddr("127.0.0.1") ||
		len(b.Communities) != 2 || b.Communities[1] != 0xFFFFFF01 || !b.GracefulRestart {
		t.Fatalf("BGP config = %+v", b)
	}
	c = bgpConfig()
	c.BGPBFD, c.BGPBFDInterval, c.BGPBFDMultiplier = true, 100*time.Millisecond, 3
	if err := c.Validate(); err != nil || c.BGP.BFDInterval != 100*time.Millisecond || c.BGP.BFDMultiplier != 3 {
		t.Fatalf("BFD: %v, BGP config %+v", err, c.BGP)
	}
	bfdOn := func(c *Config) { c.BGPBFD, c.BGPBFDInterval, c.BGPBFDMultiplier = true, 300*time.Millisecond, 3 }
	bad := map[string]func(c *Config){
		"`bgpBfdMultiplier` 0":   func(c *Config) { bfdOn(c); c.BGPBFDMultiplier = 0 },
		"`bgpBfdMultiplier` 256": func(c *Config) { bfdOn(c); c.BGPBFDMultiplier = 256 },
		"`bgpBfdInterval` 10ms":  func(c *Config) { bfdOn(c); c.BGPBFDInterval = 10 * time.Millisecond },
		"need `bgpBfd`":          func(c *Config) { c.BGPBFDInterval = 100 * time.Millisecond },
		"single-hop":             func(c *Config) { bfdOn(c); c.BGPMultihop = 2 },
		"`bgpHoldTime`, `bgpKeepalive`": func(c *Config) {
			c.Announce, c.BGPLocalAS, c.BGPRouterID, c.BGPPeers, c.BGPGracefulRestart = AnnounceARP, 0, "", nil, true
		},
		"less than 3 x `bgpKeepalive`":  func(c *Config) { c.BGPHoldTime, c.BGPKeepalive = 5*time.Second, 2*time.Second },
		"`bgpMultihop` 256":             func(c *Config) { c.BGPMultihop = 256 },
		"`bgpLocalPref` -1":             func(c *Config) { c.BGPLocalPref = -1 },
		"`bgpLocalPref` 100: BGP sends": func(c *Config) { c.BGPLocalPref = 100 },
		"`bgpCommunity` \"65001\"":      func(c *Config) { c.BGPCommunities = []string{"65001"} },
		"is not an IP address":          func(c *Config) { c.BGPSourceAddress = "lo" },
		"not an address of this node":   func(c *Config) { c.BGPSourceAddress = "192.0.2.77" },
		"need `announce` bgp":           func(c *Config) { c.Announce = AnnounceARP },
		"unknown `announce`":            func(c *Config) { c.Announce = "ospf" },
		"host address":                  func(c *Config) { c.VIPs = []netip.Prefix{netip.MustParsePrefix("10.250.0.100/24")} },
		"fd00:250::100/64":              func(c *Config) { c.VIPs = append(c.VIPs, netip.MustParsePrefix("fd00:250::100/64")) },
		"`bgpLocalAs`":                  func(c *Config) { c.BGPLocalAS = 0 },
		"`bgpLocalAs` -1":               func(c *Config) { c.BGPLocalAS = -1 },
		"not an IPv4 address":           func(c *Config) { c.BGPRouterID = "router1" },
		"needs at least one":            func(c *Config) { c.BGPPeers = nil },
		"no AS number":                  func(c *Config) { c.BGPPeers = []string{"10.250.0.254"} },
		"`bgpPeer` 10.250.0.254":        func(c *Config) { c.BGPPeers = []string{"10.250.0.254,65000", "10.250.0.254,65001"} },
		"`bgpMode` ecmp needs `announce` bgp": func(c *Config) {
			c.Announce, c.BGPLocalAS, c.BGPRouterID, c.BGPPeers, c.BGPMode = AnnounceARP, 0, "", nil, BGPModeECMP
		},
		"unknown `bgpMode`": func(c *Config) { c.BGPMode = "anycast" },
		"`lbListenPort` needs one VIP holder": func(c *Config) {
			c.BGPMode, c.LBPort, c.LBListenPort, c.Backends = BGPModeECMP, 6443, 16443, []string{"10.0.0.1:6443"}
		},
	}
	ecmp := bgpConfig()
	ecmp.BGPMode, ecmp.LBPort, ecmp.Backends = BGPModeECMP, 6443, []string{"10.0.0.1:6443"}
	if err := ecmp.Validate(); err != nil || !ecmp.ecmp() {
		t.Fatalf("ecmp: %v", err)
	}
	if c := bgpConfig(); c.Validate() != nil || c.BGPMode != BGPModeSingle {
		t.Fatalf("default --bgp-mode %q", c.BGPMode)
	}
	for want, mutate := range bad {
		c := bgpConfig()
		mutate(&c)
		err := c.Validate()
		if err == nil || !errors.Is(err, validate.ErrInvalid) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: Validate() = %v", want, err)
		}
		if err != nil && strings.Count(err.Error(), "invalid") > 1 {
			t.Errorf("%s: %q says invalid twice", want, err)
		}
	}
}

// --lb-port's values: the first is LBPort (and BackendPort when it names
// one), the others further ports; checks land on their ports; bad values
// are refused before anything runs.
func TestSetLBPorts(t *testing.T) {
	c := validConfig()
	if err := c.SetLBPorts([]string{"8443:6000", "9345", "9000:19000"}, false); err != nil {
		t.Fatal(err)
	}
	want := []PortSpec{{Port: 9345, BackendPort: 9345}, {Port: 9000, BackendPort: 19000}}
	if c.LBPort != 8443 || c.BackendPort != 6000 || !slices.Equal(c.MorePorts, want) {
		t.Fatalf("LBPort %d BackendPort %d MorePorts %v", c.LBPort, c.BackendPort, c.MorePorts)
	}
	c.Backends, c.PortChecks = []string{"10.0.0.1:6443"}, []string{"8443=tcp", "9000=/ping"}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if !c.HealthTCP || c.MorePorts[0].Check != CheckTCP || c.MorePorts[1].Check != "/ping" {
		t.Fatalf("checks not applied: HealthTCP %v, %v", c.HealthTCP, c.MorePorts)
	}
	if err := c.Validate(); err != nil { // Validate may run again
		t.Fatalf("second Validate: %v", err)
	}

	c = validConfig()
	if err := c.SetLBPorts([]string{"0"}, false); err != nil || c.LBPort != 0 || c.MorePorts != nil {
		t.Fatalf("the default: %v, %d, %v", err, c.LBPort, c.MorePorts)
	}
	c.BackendPort = 7000
	if err := c.SetLBPorts([]string{"8443:6443"}, true); !errors.Is(err, validate.ErrInvalid) || !strings.Contains(err.Error(), "`backendPort`") {
		t.Fatalf("PORT:BACKENDPORT against --backend-port: %v", err)
	}
	for _, bad := range [][]string{{"x"}, {"6443", "0"}, {"6443", "9345:"}, {"70000"}} {
		c := validConfig()
		if err := c.SetLBPorts(bad, false); !errors.Is(err, validate.ErrInvalid) {
			t.Errorf("SetLBPorts(%q) = %v, want validate.ErrInvalid", bad, err)
		}
	}
}

// TestValidateTwice: Validate completes a configuration (defaults, the
// discovery sources, every port's check, the BGP speaker's configuration)
// and a second Validate of the result changes nothing: what it derives is
// kept apart from what was given.
func TestValidateTwice(t *testing.T) {
	pw := filepath.Join(t.TempDir(), "bgp-password")
	if err := os.WriteFile(pw, []byte("x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := validConfig()
	c.VIPs = []netip.Prefix{netip.MustParsePrefix("10.250.0.100/32")}
	c.Interface = "lo"
	c.Announce, c.BGPLocalAS, c.BGPRouterID = AnnounceBGP, 65001, "10.250.0.11"
	c.BGPPeers, c.BGPPasswordFile = []string{"10.250.0.254,65000"}, pw
	c.BGPCommunities = []string{"no-export"}
	c.BGPBFD, c.BGPBFDInterval, c.BGPBFDMultiplier = true, 300*time.Millisecond, 3
	if err := c.SetLBPorts([]string{"6443", "9345"}, false); err != nil {
		t.Fatal(err)
	}
	c.PortChecks = []string{"6443=/livez", "9345=/ping"}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	// What the first Validate derived and defaulted.
	switch {
	case c.LockKey != election.DefaultEtcdKey, c.EtcdMemberName != "cp1", c.BGPMode != BGPModeSingle:
		t.Fatalf("defaults: lock key %q, member %q, BGP mode %q", c.LockKey, c.EtcdMemberName, c.BGPMode)
	case !slices.Equal(c.Discovery, []string{DiscoveryEtcd}):
		t.Fatalf("discovery %v, want etcd (auto with etcd endpoints only)", c.Discovery)
	case c.HealthPath != "/livez" || c.MorePorts[0].Check != "/ping":
		t.Fatalf("checks: first port %q, second %q", c.HealthPath, c.MorePorts[0].Check)
	case len(c.BGP.Peers) != 1 || c.BGP.Peers[0].Password != "x" || c.BGP.BFDMultiplier != 3 || len(c.BGP.Communities) != 1:
		t.Fatalf("BGP config %+v", c.BGP)
	}
	first := c
	first.MorePorts = slices.Clone(c.MorePorts)
	if err := c.Validate(); err != nil {
		t.Fatalf("second Validate: %v", err)
	}
	if !reflect.DeepEqual(c, first) {
		t.Fatalf("a second Validate changed the configuration:\n%+v\nwas\n%+v", c, first)
	}
	// Back to arp: the derived BGP configuration goes with it.
	c.Announce, c.BGPLocalAS, c.BGPRouterID, c.BGPPeers, c.BGPPasswordFile, c.BGPCommunities, c.BGPBFD = AnnounceARP, 0, "", nil, "", nil, false
	c.VIPs = []netip.Prefix{netip.MustParsePrefix("10.250.0.100/24")}
	if err := c.Validate(); err != nil || len(c.BGP.Peers) != 0 {
		t.Fatalf("arp after bgp: %v, BGP config %+v", err, c.BGP)
	}
}
