package dnat

import (
	"bufio"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vigil-ha/vigil/internal/netns"
	"github.com/vigil-ha/vigil/internal/nstest"
)

// serve answers every connection on addr, in ns, with name.
func serve(t *testing.T, ns, addr, name string) {
	t.Helper()
	var ln net.Listener
	if err := netns.Do(ns, func() (err error) { ln, err = net.Listen("tcp", addr); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte(name + "\n"))
			c.Close()
		}
	}()
}

// who dials addr from ns and returns the name that answered.
func who(t *testing.T, ns, addr string) string {
	t.Helper()
	c, err := netns.Dialer(ns)(t.Context(), addr)
	if err != nil {
		t.Fatalf("dial %s from %s: %v", addr, ns, err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatalf("read from %s: %v", addr, err)
	}
	return strings.TrimSpace(line)
}

// The API server listens on every address's port 6443 (kubeadm's
// default), the load balancer on VIP:16443. Installed, the rule sends
// VIP:6443 to the balancer, from another host (prerouting) and from the
// holder itself (output); the node's own address still reaches the API
// server; removed, VIP:6443 is the API server's again.
func TestRuleSendsTheVIPsPortToTheBalancer(t *testing.T) {
	p := nstest.NewPair(t)
	for _, tc := range []struct{ name, vip, prefix, node string }{
		{"IPv4", "192.0.2.100", "/24", "192.0.2.1"},
		{"IPv6", "fd00:192::100", "/64", "fd00:192::1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nstest.IP(t, "-n", p.A, "addr", "add", tc.vip+tc.prefix, "dev", "a0", "nodad")
			t.Cleanup(func() { _ = netns.Do(p.A, Remove) })
			vip := netip.MustParseAddr(tc.vip)
			api, lb := net.JoinHostPort(tc.vip, "6443"), net.JoinHostPort(tc.vip, "16443")
			serve(t, p.A, net.JoinHostPort(tc.node, "6443"), "apiserver-node")
			serve(t, p.A, api, "apiserver")
			serve(t, p.A, lb, "balancer")
			if got := who(t, p.B, api); got != "apiserver" {
				t.Fatalf("before the rule, VIP:6443 from B reached %s", got)
			}
			rule := Rule{VIP: vip, From: 6443, To: 16443}
			if err := netns.Do(p.A, func() error { return Install([]Rule{rule}) }); err != nil {
				t.Fatal(err)
			}
			// Installing again replaces, it does not add.
			if err := netns.Do(p.A, func() error { return Install([]Rule{rule}) }); err != nil {
				t.Fatal(err)
			}
			var got []Rule
			if err := netns.Do(p.A, func() (err error) { got, err = Installed(); return err }); err != nil || !slices.Equal(got, []Rule{rule}) {
				t.Fatalf("Installed() = %v, %v; want [%v]", got, err, rule)
			}
			for _, from := range []string{p.B, p.A} {
				if got := who(t, from, api); got != "balancer" {
					t.Fatalf("with the rule, VIP:6443 from %s reached %s, want the balancer", from, got)
				}
			}
			if got := who(t, p.B, net.JoinHostPort(tc.node, "6443")); got != "apiserver-node" {
				t.Fatalf("with the rule, the node's own address reached %s", got)
			}
			if err := netns.Do(p.A, Remove); err != nil {
				t.Fatal(err)
			}
			if err := netns.Do(p.A, Remove); err != nil {
				t.Fatalf("a second Remove: %v", err)
			}
			if err := netns.Do(p.A, func() (err error) { got, err = Installed(); return err }); err != nil || len(got) != 0 {
				t.Fatalf("after Remove, Installed() = %v, %v", got, err)
			}
			if got := who(t, p.B, api); got != "apiserver" {
				t.Fatalf("after Remove, VIP:6443 from B reached %s", got)
			}
		})
	}
}
