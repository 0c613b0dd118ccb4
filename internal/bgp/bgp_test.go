package bgp

import (
	"errors"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vigil-ha/vigil/internal/validate"
)

func TestParsePeer(t *testing.T) {
	tests := []struct {
		in   string
		want Peer
		err  string // part of the error; "" for none
	}{
		{in: "10.0.0.1,65000", want: Peer{Address: netip.MustParseAddr("10.0.0.1"), AS: 65000}},
		{in: "fd00::1,4200000000,port=1790", want: Peer{Address: netip.MustParseAddr("fd00::1"), AS: 4200000000, Port: 1790}},
		{in: "10.0.0.1,65000,password-file=/etc/vigil/bgp,port=179", want: Peer{Address: netip.MustParseAddr("10.0.0.1"), AS: 65000, PasswordFile: "/etc/vigil/bgp", Port: 179}},
		{in: "10.0.0.1,65000,password=s3cret", err: "password-file=PATH"},
		{in: "10.0.0.1,65000,password-file=bgp", err: "absolute path"},
		{in: "10.0.0.1", err: "no AS number"},
		{in: "router1,65000", err: "not an IP address"},
		{in: "fe80::1%eth0,65000", err: "not an IP address"},
		{in: "10.0.0.1,0", err: "1 to 4294967294"},
		{in: "10.0.0.1,4294967295", err: "1 to 4294967294"},
		{in: "10.0.0.1,as65000", err: "1 to 4294967294"},
		{in: "10.0.0.1,65000,port=0", err: "port"},
		{in: "10.0.0.1,65000,port=70000", err: "port"},
		{in: "10.0.0.1,65000,md5", err: "not KEY=VALUE"},
		{in: "10.0.0.1,65000,ttl=2", err: "unknown key"},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParsePeer(tc.in)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) || !errors.Is(err, validate.ErrInvalid) {
					t.Fatalf("ParsePeer(%q) = %v, %v; want an validate.ErrInvalid saying %q", tc.in, got, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("ParsePeer(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
			}
		})
	}
}

func TestParsePeerHidesThePassword(t *testing.T) {
	_, err := ParsePeer("10.0.0.1,65000,password=hunter2,port=x")
	if err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("error %v shows the password", err)
	}
	p := Peer{Address: netip.MustParseAddr("10.0.0.1"), AS: 1, Password: "hunter2"}
	if strings.Contains(p.String(), "hunter2") {
		t.Fatalf("Peer.String() = %q shows the password", p)
	}
}

func TestConfigValidate(t *testing.T) {
	peer := Peer{Address: netip.MustParseAddr("10.0.0.1"), AS: 65000}
	ok := Config{LocalAS: 65001, RouterID: netip.MustParseAddr("10.0.0.11"), Peers: []Peer{peer}}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	ibgp := Peer{Address: netip.MustParseAddr("10.0.0.2"), AS: 65001}
	good := map[string]func(c *Config){
		"timers":               func(c *Config) { c.HoldTime, c.Keepalive = 3*time.Second, time.Second },
		"long hold":            func(c *Config) { c.HoldTime = 65535 * time.Second },
		"multihop and source":  func(c *Config) { c.Multihop, c.SourceAddress = 2, netip.MustParseAddr("10.1.0.11") },
		"communities":          func(c *Config) { c.Communities = []uint32{65001<<16 | 100, 0xFFFFFF01} },
		"local pref with iBGP": func(c *Config) { c.Peers, c.LocalPref = []Peer{peer, ibgp}, 200 },
		"graceful restart":     func(c *Config) { c.GracefulRestart = true },
	}
	for name, mutate := range good {
		c := ok
		mutate(&c)
		if err := c.Validate(); err != nil {
			t.Errorf("%s: Validate() = %v", name, err)
		}
	}
	bad := map[string]func(c *Config){
		"`bgpLocalAs`":                 func(c *Config) { c.LocalAS = 0 },
		"`bgpRouterId`":                func(c *Config) { c.RouterID = netip.MustParseAddr("fd00::1") },
		"at least one":                 func(c *Config) { c.Peers = nil },
		"given twice":                  func(c *Config) { c.Peers = []Peer{peer, peer} },
		"less than 3 x `bgpKeepalive`": func(c *Config) { c.HoldTime, c.Keepalive = 6*time.Second, 3*time.Second },
		"3s to 65535s":                 func(c *Config) { c.HoldTime, c.Keepalive = 2*time.Second, time.Second },
		"`bgpHoldTime` 18h12m16s":      func(c *Config) { c.HoldTime = 65536 * time.Second },
		"whole seconds":                func(c *Config) { c.HoldTime = 4500 * time.Millisecond },
		"`bgpKeepalive`":               func(c *Config) { c.Keepalive = 500 * time.Millisecond },
		"another address family":       func(c *Config) { c.SourceAddress = netip.MustParseAddr("fd00::11") },
		"unicast":                      func(c *Config) { c.SourceAddress = netip.IPv4Unspecified() },
		"eBGP peers only":              func(c *Config) { c.Peers, c.Multihop = []Peer{ibgp}, 2 },
		"`bgpCommunity` 65001:100 is given twice": func(c *Config) { c.Communities = []uint32{65001<<16 | 100, 65001<<16 | 100} },
		"iBGP peers only":                         func(c *Config) { c.LocalPref = 200 },
	}
	for want, mutate := range bad {
		c := ok
		mutate(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: Validate() = %v", want, err)
		}
	}
}

// Every later holder's route must win a router's comparison (lower MED),
// including at the ends of the range.
func TestMEDFallsWithEveryTransition(t *testing.T) {
	prev := uint32(math.MaxUint32)
	for _, tr := range []int{0, 1, 2, 1000, 1 << 30, math.MaxUint32 - 3} {
		m := MED(tr)
		if m >= prev {
			t.Fatalf("MED(%d) = %d, not below the previous %d", tr, m, prev)
		}
		prev = m
	}
	if MED(-1) != MED(0) || MED(math.MaxInt64) != 1 {
		t.Fatalf("MED(-1) = %d, MED(max) = %d", MED(-1), MED(math.MaxInt64))
	}
}

func TestParseCommunity(t *testing.T) {
	for in, want := range map[string]uint32{
		"65001:100":     65001<<16 | 100,
		"0:0":           0,
		"65535:65535":   0xFFFFFFFF,
		"no-export":     0xFFFFFF01,
		" No-Advertise": 0xFFFFFF02,
	} {
		got, err := ParseCommunity(in)
		if err != nil || got != want {
			t.Errorf("ParseCommunity(%q) = %#x, %v; want %#x", in, got, err, want)
		}
	}
	for _, in := range []string{"", "65001", "65536:1", "1:65536", "a:b", "65001:100:1", "no-exports"} {
		if _, err := ParseCommunity(in); err == nil || !errors.Is(err, validate.ErrInvalid) || !strings.Contains(err.Error(), "AS:VALUE") {
			t.Errorf("ParseCommunity(%q) = %v, want an error that says what to give", in, err)
		}
	}
	for _, c := range []uint32{65001<<16 | 100, 0xFFFFFF01, 0xFFFFFF03} {
		if got, err := ParseCommunity(FormatCommunity(c)); err != nil || got != c {
			t.Errorf("FormatCommunity(%#x) = %q, which parses to %#x, %v", c, FormatCommunity(c), got, err)
		}
	}
}

func TestLoadPassword(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	own, every := write("own", "s3cret\r\nignored\n"), write("every", "hunter2")
	p := Peer{Address: netip.MustParseAddr("10.0.0.1"), AS: 65000, PasswordFile: own}
	if err := p.LoadPassword(every); err != nil || p.Password != "s3cret" {
		t.Fatalf("the peer's own file: %q, %v", p.Password, err)
	}
	p = Peer{Address: netip.MustParseAddr("10.0.0.1"), AS: 65000}
	if err := p.LoadPassword(every); err != nil || p.Password != "hunter2" || p.PasswordFile != every {
		t.Fatalf("--bgp-password-file: %+v, %v", p, err)
	}
	p = Peer{Address: netip.MustParseAddr("10.0.0.1"), AS: 65000}
	if err := p.LoadPassword(""); err != nil || p.Password != "" {
		t.Fatalf("no file: %+v, %v", p, err)
	}
	for name, file := range map[string]string{
		"holds no password": write("empty", "\nsecond line\n"),
		"80 at most":        write("long", strings.Repeat("x", 81)),
		"no such file":      filepath.Join(dir, "none"),
	} {
		p := Peer{Address: netip.MustParseAddr("10.0.0.1"), AS: 65000, PasswordFile: file}
		if err := p.LoadPassword(""); !errors.Is(err, validate.ErrInvalid) || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: %v", file, err)
		}
	}
}
