//go:build linux

package announce

import (
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vigil-ha/vigil/internal/netns"
	"github.com/vigil-ha/vigil/internal/nstest"
)

// TestPeerLearnsNewLocation: B has a stale neighbour entry for the VIP
// pointing at some other MAC (the old holder). A takes the VIP and announces
// it once; B's entry must now point at A.
func TestPeerLearnsNewLocation(t *testing.T) {
	p := nstest.NewPair(t)
	forEachVIP(t, func(t *testing.T, vip, bits string) {
		nstest.IP(t, "-n", p.B, "neigh", "replace", vip, "lladdr", "02:00:00:00:00:01", "dev", "b0", "nud", "stale")
		nstest.IP(t, "-n", p.A, "addr", "add", vip+bits, "dev", "a0", "nodad")
		time.Sleep(100 * time.Millisecond)
		if out := nstest.IP(t, "-n", p.B, "neigh", "show", vip, "dev", "b0"); !strings.Contains(out, "02:00:00:00:00:01") {
			t.Fatalf("B's entry changed before any announcement: %q", out)
		}
		mac := announceOnce(t, p, Config{Interface: "a0", Address: netip.MustParseAddr(vip)})
		deadline := time.Now().Add(5 * time.Second)
		for {
			out := nstest.IP(t, "-n", p.B, "neigh", "show", vip, "dev", "b0")
			if strings.Contains(out, mac) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("B's neighbour entry for %s is %q, want it to point at A (%s)", vip, strings.TrimSpace(out), mac)
			}
			time.Sleep(10 * time.Millisecond)
		}
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
		deadline := time.Now().Add(5 * time.Second)
		for out := ""; !strings.Contains(out, mac); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("B's neighbour entry for %s is %q, want it to point at A (%s)", ip, strings.TrimSpace(out), mac)
			}
			out = nstest.IP(t, "-n", p.B, "neigh", "show", ip, "dev", "b0")
		}
	}
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
