//go:build linux

package netmon

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vigil-ha/vigil/internal/netns"
	"github.com/vigil-ha/vigil/internal/nstest"
	"github.com/vigil-ha/vigil/internal/testkit"
)

// The monitor follows a veth in a namespace of its own: its MAC, its
// addresses, its administrative state and its carrier (the peer's), and
// its removal, each seen within seconds and announced on Changes.
func TestMonitorFollowsALink(t *testing.T) {
	p := nstest.NewPair(t)
	var m *Monitor
	if err := netns.Do(p.A, func() (err error) { m, err = New(testkit.Log(t)); return err }); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); m.Run(ctx) }()
	defer func() { cancel(); <-done; m.Close() }()
	changes := m.Changes()

	l, err := m.Link("a0")
	if err != nil || !l.Up || !l.Carrier || l.Index == 0 || len(l.MAC) != 6 {
		t.Fatalf("a0 at start: %+v, %v; want up, with carrier, an index and a MAC", l, err)
	}
	if _, err := m.Link("eth0"); !errors.Is(err, ErrNoLink) {
		t.Fatalf("a link of the host's namespace is visible: %v", err)
	}
	if !slices.Contains(m.Addrs(), netip.MustParseAddr("192.0.2.1")) || slices.Contains(m.Addrs(), netip.MustParseAddr("192.0.2.2")) {
		t.Fatalf("addresses %v: want a0's 192.0.2.1, not the peer's", m.Addrs())
	}
	if ifi, err := m.InterfaceByName("a0"); err != nil || ifi.Index != l.Index || ifi.HardwareAddr.String() != l.MAC.String() {
		t.Fatalf("InterfaceByName = %+v, %v", ifi, err)
	}

	// Each change, then what the monitor must come to say.
	link := func() Link { l, _ := m.Link("a0"); return l }
	for _, step := range []struct {
		what string
		ip   []string
		ok   func() bool
	}{
		{"a new MAC", []string{"link", "set", "a0", "address", "02:00:00:00:00:42"}, func() bool { return link().MAC.String() == "02:00:00:00:00:42" }},
		{"an address added", []string{"addr", "add", "198.51.100.7/32", "dev", "a0"}, func() bool { return slices.Contains(m.Addrs(), netip.MustParseAddr("198.51.100.7")) }},
		{"the same address with another prefix length, on lo", []string{"addr", "add", "198.51.100.7/24", "dev", "lo"}, func() bool { return slices.Contains(m.Addrs(), netip.MustParseAddr("198.51.100.7")) }},
		{"the address removed from lo", []string{"addr", "del", "198.51.100.7/24", "dev", "lo"}, func() bool { return slices.Contains(m.Addrs(), netip.MustParseAddr("198.51.100.7")) }},
		{"the address removed", []string{"addr", "del", "198.51.100.7/32", "dev", "a0"}, func() bool { return !slices.Contains(m.Addrs(), netip.MustParseAddr("198.51.100.7")) }},
		{"the link down", []string{"link", "set", "a0", "down"}, func() bool { return !link().Up }},
		{"the link up", []string{"link", "set", "a0", "up"}, func() bool { return link().Up && link().Carrier }},
	} {
		select { // forget earlier changes
		case <-changes:
		default:
		}
		nstest.IP(t, append([]string{"-n", p.A}, step.ip...)...)
		select {
		case <-changes:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: no change announced", step.what)
		}
		testkit.WaitFor(t, 10*time.Second, step.what, step.ok)
	}
	// A subscription that ends by itself (a receive error) is made
	// again, and nothing is missed.
	m.lost <- struct{}{}
	nstest.IP(t, "-n", p.A, "addr", "add", "198.51.100.9/32", "dev", "a0")
	testkit.WaitFor(t, 10*time.Second, "an address added after a lost subscription", func() bool { return slices.Contains(m.Addrs(), netip.MustParseAddr("198.51.100.9")) })
	nstest.IP(t, "-n", p.A, "addr", "del", "198.51.100.9/32", "dev", "a0")
	testkit.WaitFor(t, 10*time.Second, "and removed", func() bool { return !slices.Contains(m.Addrs(), netip.MustParseAddr("198.51.100.9")) })

	// Carrier is the peer's: b0 down takes it away, a0 stays up.
	nstest.IP(t, "-n", p.B, "link", "set", "b0", "down")
	testkit.WaitFor(t, 10*time.Second, "a0 without carrier", func() bool { l := link(); return l.Up && !l.Carrier })
	nstest.IP(t, "-n", p.A, "link", "del", "a0")
	testkit.WaitFor(t, 10*time.Second, "a0 gone", func() bool { _, err := m.Link("a0"); return errors.Is(err, ErrNoLink) })
}

// vigil's container has NET_ADMIN and NET_RAW, not SYS_ADMIN: the monitor
// must open and follow its own namespace without entering one (setns).
// The test runs itself again without CAP_SYS_ADMIN (setpriv).
func TestMonitorWithoutSysAdmin(t *testing.T) {
	if os.Getenv("NETMON_CHILD") != "" {
		m, err := New(testkit.Log(t))
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		m.lost <- struct{}{} // and subscribe again
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); m.Run(ctx) }()
		testkit.WaitFor(t, 10*time.Second, "subscribed again", func() bool { return len(m.lost) == 0 })
		if l, err := m.Link("lo"); err != nil || l.Index == 0 {
			t.Fatalf("lo: %+v, %v", l, err)
		}
		cancel()
		<-done
		return
	}
	nstest.RequireRoot(t)
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		nstest.Unavailable(t, "setpriv is not installed (util-linux)")
	}
	cmd := exec.Command(setpriv, "--bounding-set", "-sys_admin", "--inh-caps", "-sys_admin", os.Args[0], "-test.run", "^TestMonitorWithoutSysAdmin$", "-test.v")
	cmd.Env = append(os.Environ(), "NETMON_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS") {
		t.Fatalf("without CAP_SYS_ADMIN: %v\n%s", err, out)
	}
}
