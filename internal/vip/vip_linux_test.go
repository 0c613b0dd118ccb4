//go:build linux

package vip

import (
	"errors"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vigil-ha/vigil/internal/netns"
	"github.com/vigil-ha/vigil/internal/nstest"
)

func TestUnknownInterface(t *testing.T) {
	_, err := New(Config{Address: netip.MustParsePrefix("192.0.2.100/24"), Interface: "nosuchif0"}, slog.New(slog.DiscardHandler))
	if !errors.Is(err, ErrNoInterface) {
		t.Fatalf("err = %v, want ErrNoInterface", err)
	}
}

func TestRejectsUnusableAddresses(t *testing.T) {
	for _, a := range []string{"0.0.0.0/32", "127.0.0.5/8", "224.0.0.1/32", "::1/128"} {
		if _, err := New(Config{Address: netip.MustParsePrefix(a), Interface: "lo"}, slog.New(slog.DiscardHandler)); err == nil {
			t.Errorf("%s accepted as a VIP", a)
		}
	}
}

// TestAddRemove adds and removes IPv4 and IPv6 VIPs on a veth in a fresh
// namespace, twice each, and checks with iproute2 what the kernel has.
func TestAddRemove(t *testing.T) {
	p := nstest.NewPair(t)
	for _, vip := range []string{"192.0.2.100/24", "192.0.2.101/32", "fd00:192::100/64"} {
		t.Run(vip, func(t *testing.T) {
			addr := netip.MustParsePrefix(vip)
			err := netns.Do(p.A, func() error {
				m, err := New(Config{Address: addr, Interface: "a0"}, slog.New(slog.DiscardHandler))
				if err != nil {
					return err
				}
				for i := 0; i < 2; i++ { // idempotent
					if err := m.Add(); err != nil {
						return err
					}
				}
				if ok, err := m.Present(); err != nil || !ok {
					t.Errorf("Present after Add = %v, %v", ok, err)
				}
				if !strings.Contains(nstest.IP(t, "-n", p.A, "addr", "show", "dev", "a0"), " "+vip+" ") {
					t.Errorf("kernel does not list %s on a0", vip)
				}
				for i := 0; i < 2; i++ {
					if err := m.Remove("test"); err != nil {
						return err
					}
				}
				if ok, err := m.Present(); err != nil || ok {
					t.Errorf("Present after Remove = %v, %v", ok, err)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(nstest.IP(t, "-n", p.A, "addr", "show", "dev", "a0"), " "+vip+" ") {
				t.Fatalf("%s still on a0", vip)
			}
			// The node's own addresses are untouched.
			if !strings.Contains(nstest.IP(t, "-n", p.A, "addr", "show", "dev", "a0"), " 192.0.2.1/24 ") {
				t.Fatal("removing the VIP removed the node's own address")
			}
		})
	}
}

// TestDualStackKeeper holds an IPv4 and an IPv6 VIP as one: both come and
// go together, either one removed by hand on the holder is put back, and
// either one added by hand on a non-holder is removed as a stray.
func TestDualStackKeeper(t *testing.T) {
	p := nstest.NewPair(t)
	v4, v6 := "192.0.2.100/32", "fd00:192::100/128"
	on := func() (has4, has6 bool) {
		out := nstest.IP(t, "-n", p.A, "addr", "show", "dev", "a0")
		return strings.Contains(out, " "+v4+" "), strings.Contains(out, " "+v6+" ")
	}
	var strays, restored atomic.Int32
	err := netns.Do(p.A, func() error {
		m, err := New(Config{Address: netip.MustParsePrefix(v4), Also: []netip.Prefix{netip.MustParsePrefix(v6)}, Interface: "a0"}, slog.New(slog.DiscardHandler))
		if err != nil {
			return err
		}
		k := NewKeeper(m, KeeperConfig{OnStray: func() { strays.Add(1) }, OnRestored: func() { restored.Add(1) }}, slog.New(slog.DiscardHandler))
		k.Hold(time.Now().Add(time.Hour))
		if a, b := on(); !a || !b {
			t.Errorf("after Hold: IPv4 on %v, IPv6 on %v; want both", a, b)
		}
		// Someone removes the IPv6 VIP only: the holder puts it back.
		nstest.IP(t, "-n", p.A, "addr", "del", v6, "dev", "a0")
		k.check(false)
		if a, b := on(); !a || !b || restored.Load() != 1 {
			t.Errorf("after the IPv6 VIP was removed by hand: IPv4 %v, IPv6 %v, restores %d; want both, 1", a, b, restored.Load())
		}
		if err := k.Release("test"); err != nil {
			return err
		}
		if a, b := on(); a || b {
			t.Errorf("after Release: IPv4 on %v, IPv6 on %v; want neither", a, b)
		}
		// A non-holder: one family re-added by the OS is a stray.
		nstest.IP(t, "-n", p.A, "addr", "add", v6, "dev", "a0", "nodad")
		k.check(false)
		if a, b := on(); a || b || strays.Load() != 1 {
			t.Errorf("stray IPv6 VIP on a non-holder: IPv4 %v, IPv6 %v, strays %d; want neither, 1", a, b, strays.Load())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestStrayForms puts the VIP on a node in the forms nobody configured,
// with another prefix length and on lo (Linux answers ARP for it there
// too): a non-holder removes them all, a holder keeps only the managed
// form, and a release leaves none.
func TestStrayForms(t *testing.T) {
	p := nstest.NewPair(t)
	forms := func() []string {
		var got []string
		for _, dev := range []string{"a0", "lo"} {
			for _, f := range strings.Fields(nstest.IP(t, "-o", "-n", p.A, "addr", "show", "dev", dev)) {
				if strings.HasPrefix(f, "192.0.2.100/") {
					got = append(got, dev+":"+f)
				}
			}
		}
		return got
	}
	strays := func() {
		nstest.IP(t, "-n", p.A, "addr", "add", "192.0.2.100/32", "dev", "a0")
		nstest.IP(t, "-n", p.A, "addr", "add", "192.0.2.100/24", "dev", "lo")
	}
	var count atomic.Int32
	err := netns.Do(p.A, func() error {
		m, err := New(Config{Address: netip.MustParsePrefix("192.0.2.100/24"), Interface: "a0"}, slog.New(slog.DiscardHandler))
		if err != nil {
			return err
		}
		k := NewKeeper(m, KeeperConfig{OnStray: func() { count.Add(1) }}, slog.New(slog.DiscardHandler))

		strays()
		k.check(false)
		if got := forms(); len(got) != 0 || count.Load() != 1 {
			t.Errorf("non-holder: VIP forms left %v, strays counted %d; want none, 1", got, count.Load())
		}

		k.Hold(time.Now().Add(time.Hour))
		strays()
		k.check(false)
		if got := forms(); !slices.Equal(got, []string{"a0:192.0.2.100/24"}) || count.Load() != 2 {
			t.Errorf("holder: VIP forms %v, strays counted %d; want only a0:192.0.2.100/24, 2", got, count.Load())
		}
		if ok, err := m.Present(); !ok || err != nil {
			t.Errorf("holder: Present = %v, %v", ok, err)
		}

		// The managed form missing, a stray one there: not present (the
		// stray is not taken for the VIP), and the next check fixes both.
		nstest.IP(t, "-n", p.A, "addr", "del", "192.0.2.100/24", "dev", "a0")
		nstest.IP(t, "-n", p.A, "addr", "add", "192.0.2.100/32", "dev", "a0")
		if ok, _ := m.Present(); ok {
			t.Error("192.0.2.100/32 on a0 was taken for the managed 192.0.2.100/24")
		}
		k.check(false)
		if got := forms(); !slices.Equal(got, []string{"a0:192.0.2.100/24"}) {
			t.Errorf("holder after the managed form was swapped for a /32: %v", got)
		}

		strays()
		if err := k.Release("test"); err != nil {
			return err
		}
		if got := forms(); len(got) != 0 {
			t.Errorf("after Release: VIP forms left %v", got)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
