//go:build linux

package announce

import (
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vigil-ha/vigil/internal/netns"
	"github.com/vigil-ha/vigil/internal/nstest"
)

// TestProbeFindsWhoAnswers: nobody answers for the VIP, then B does. A's
// probe must see exactly B's hardware address, and an interface without an
// IPv4 address of its own must still probe.
func TestProbeFindsWhoAnswers(t *testing.T) {
	p := nstest.NewPair(t)
	forEachVIP(t, func(t *testing.T, vip, bits string) {
		probe := func() []net.HardwareAddr {
			t.Helper()
			var got []net.HardwareAddr
			err := netns.Do(p.A, func() error {
				ifi, err := net.InterfaceByName("a0")
				if err != nil {
					return err
				}
				got, err = Probe(ifi, mustAddr(t, vip), 200*time.Millisecond)
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			return got
		}
		if got := probe(); len(got) != 0 {
			t.Fatalf("before anyone has %s: %v answered", vip, got)
		}
		nstest.IP(t, "-n", p.B, "addr", "add", vip+bits, "dev", "b0", "nodad")
		defer nstest.IP(t, "-n", p.B, "addr", "del", vip+bits, "dev", "b0")
		bmac := strings.Fields(nstest.IP(t, "-n", p.B, "-br", "link", "show", "b0"))[2]
		got := probe()
		if len(got) != 1 || got[0].String() != bmac {
			t.Fatalf("probe saw %v, want exactly B's %s", got, bmac)
		}
	})
	// An ARP probe carries sender 0.0.0.0: it works without an address.
	nstest.IP(t, "-n", p.A, "addr", "flush", "dev", "a0")
	nstest.IP(t, "-n", p.B, "addr", "add", "192.0.2.100/24", "dev", "b0")
	err := netns.Do(p.A, func() error {
		ifi, err := net.InterfaceByName("a0")
		if err != nil {
			return err
		}
		got, err := Probe(ifi, mustAddr(t, "192.0.2.100"), 200*time.Millisecond)
		if err == nil && len(got) != 1 {
			t.Errorf("probe from an interface without address saw %v, want B", got)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

func mustAddr(t *testing.T, s string) netip.Addr {
	t.Helper()
	a, err := netip.ParseAddr(s)
	if err != nil {
		t.Fatal(err)
	}
	return a
}
