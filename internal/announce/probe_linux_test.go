//go:build linux

package announce

import (
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/packet"

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
				got, _, err = Probe(ifi, mustAddr(t, vip), 200*time.Millisecond)
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
		// B's kernel joins the new address's solicited-node group from
		// a work queue, after ip returns: on a loaded machine an NDP
		// probe sent at once can find nobody listening yet (seen in a
		// cold run). So probe until somebody answers, then judge.
		var got []net.HardwareAddr
		for deadline := time.Now().Add(5 * time.Second); len(got) == 0 && time.Now().Before(deadline); {
			got = probe()
		}
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
		got, _, err := Probe(ifi, mustAddr(t, "192.0.2.100"), 200*time.Millisecond)
		if err == nil && len(got) != 1 {
			t.Errorf("probe from an interface without address saw %v, want B", got)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// A flood of ARP replies for the VIP from random hardware addresses (anyone
// on the segment can send them) is counted, not kept: a probe keeps at most
// MaxProbeMACs.
func TestProbeFloodIsBounded(t *testing.T) {
	p := nstest.NewPair(t)
	vip := mustAddr(t, "192.0.2.100")
	stop := make(chan struct{})
	flooded := make(chan error, 1)
	go func() {
		flooded <- netns.Do(p.B, func() error {
			ifi, err := net.InterfaceByName("b0")
			if err != nil {
				return err
			}
			c, err := packet.Listen(ifi, packet.Datagram, int(ethernet.EtherTypeARP), nil)
			if err != nil {
				return err
			}
			defer c.Close()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return nil
				default:
				}
				mac := net.HardwareAddr{0x02, 0, byte(i >> 16), byte(i >> 8), byte(i), 1}
				rep, err := arp.NewPacket(arp.OperationReply, mac, vip, ethernet.Broadcast, netip.MustParseAddr("192.0.2.1"))
				if err != nil {
					return err
				}
				b, err := rep.MarshalBinary()
				if err != nil {
					return err
				}
				if _, err := c.WriteTo(b, &packet.Addr{HardwareAddr: ethernet.Broadcast}); err != nil {
					return err
				}
			}
		})
	}()
	var got []net.HardwareAddr
	var more int
	err := netns.Do(p.A, func() error {
		ifi, err := net.InterfaceByName("a0")
		if err != nil {
			return err
		}
		got, more, err = Probe(ifi, vip, 300*time.Millisecond)
		return err
	})
	close(stop)
	if ferr := <-flooded; ferr != nil {
		t.Fatalf("flood: %v", ferr)
	}
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != MaxProbeMACs || more == 0 {
		t.Fatalf("under a flood of replies from random MACs the probe kept %d and counted %d more; want %d kept and more counted", len(got), more, MaxProbeMACs)
	}
	t.Logf("kept %d, counted %d more", len(got), more)
}

func mustAddr(t *testing.T, s string) netip.Addr {
	t.Helper()
	a, err := netip.ParseAddr(s)
	if err != nil {
		t.Fatal(err)
	}
	return a
}
