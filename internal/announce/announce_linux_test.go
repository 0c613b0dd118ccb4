//go:build linux

package announce

import (
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vigil-ha/vigil/internal/netns"
	"github.com/vigil-ha/vigil/internal/nstest"
	"github.com/vigil-ha/vigil/internal/testkit"
)

// TestPeerLearnsNewLocation: B has a stale neighbour entry for the VIP
// pointing at some other MAC (the old holder). A takes the VIP and announces
// it once; B's entry must now point at A.
func TestPeerLearnsNewLocation(t *testing.T) {
	p := nstest.NewPair(t)
	forEachVIP(t, func(t *testing.T, vip, bits string) {
		nstest.IP(t, "-n", p.B, "neigh", "replace", vip, "lladdr", "02:00:00:00:00:01", "dev", "b0", "nud", "stale")
		nstest.IP(t, "-n", p.A, "addr", "add", vip+bits, "dev", "a0", "nodad")
		testkit.Always(t, 100*time.Millisecond, "B's entry unchanged before any announcement", func() bool {
			return strings.Contains(nstest.IP(t, "-n", p.B, "neigh", "show", vip, "dev", "b0"), "02:00:00:00:00:01")
		})
		mac := announceOnce(t, p, Config{Interface: "a0", Address: netip.MustParseAddr(vip)})
		waitNeighbour(t, p, vip, mac)
	})
}

// forEachVIP runs f as a subtest for an IPv4 and an IPv6 VIP of the pair's
// subnets, with the prefix length to add it with.
func forEachVIP(t *testing.T, f func(t *testing.T, vip, bits string)) {
	for _, vip := range []string{"192.0.2.100", "fd00:192::100"} {
		bits := "/24"
		if strings.Contains(vip, ":") {
			bits = "/64"
		}
		t.Run(vip, func(t *testing.T) { f(t, vip, bits) })
	}
}

// TestDualStackAnnouncesBoth: one Once with an IPv4 and an IPv6 address
// moves B's neighbour entries for both.
func TestDualStackAnnouncesBoth(t *testing.T) {
	p := nstest.NewPair(t)
	v4, v6 := "192.0.2.100", "fd00:192::100"
	for _, ip := range []string{v4, v6} {
		nstest.IP(t, "-n", p.B, "neigh", "replace", ip, "lladdr", "02:00:00:00:00:01", "dev", "b0", "nud", "stale")
	}
	nstest.IP(t, "-n", p.A, "addr", "add", v4+"/24", "dev", "a0")
	nstest.IP(t, "-n", p.A, "addr", "add", v6+"/64", "dev", "a0", "nodad")
	mac := announceOnce(t, p, Config{Interface: "a0", Address: netip.MustParseAddr(v4), Also: []netip.Addr{netip.MustParseAddr(v6)}})
	for _, ip := range []string{v4, v6} {
		waitNeighbour(t, p, ip, mac)
	}
}

// waitNeighbour waits until B's neighbour entry for ip points at mac.
func waitNeighbour(t *testing.T, p *nstest.Pair, ip, mac string) {
	t.Helper()
	testkit.WaitNil(t, 5*time.Second, "B's neighbour entry for "+ip+" to point at A ("+mac+")", func() error {
		if out := nstest.IP(t, "-n", p.B, "neigh", "show", ip, "dev", "b0"); !strings.Contains(out, mac) {
			return fmt.Errorf("it is %q", strings.TrimSpace(out))
		}
		return nil
	})
}

// announceOnce sends one announcement from A's a0 with cfg and returns a0's
// hardware address.
func announceOnce(t *testing.T, p *nstest.Pair, cfg Config) string {
	t.Helper()
	var mac string
	err := netns.Do(p.A, func() error {
		ifi, err := net.InterfaceByName("a0")
		if err != nil {
			return err
		}
		mac = ifi.HardwareAddr.String()
		a, err := New(cfg, slog.New(slog.DiscardHandler))
		if err != nil {
			return err
		}
		defer a.Close()
		return a.Once()
	})
	if err != nil {
		t.Fatal(err)
	}
	return mac
}
