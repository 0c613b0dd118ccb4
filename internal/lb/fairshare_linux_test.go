package lb

import (
	"fmt"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/vigil-ha/vigil/internal/netns"
	"github.com/vigil-ha/vigil/internal/nstest"
)

// The flood of TestFairShareUnderAFlood from IPv6 addresses, where an
// attacker has as many as it likes: the balancer listens in namespace A on
// fd00:192::1, the flood and the newcomer come from 65 addresses of
// namespace B. (The backend is on this process's loopback: the balancer's
// own dials leave from here.)
func TestFairShareUnderAnIPv6Flood(t *testing.T) {
	p := nstest.NewPair(t)
	for i := range 65 {
		nstest.IP(t, "-n", p.B, "addr", "add", fmt.Sprintf("fd00:192::1:%x/128", i+1), "dev", "b0", "nodad")
	}
	for _, sources := range []int{4, 64} {
		t.Run(fmt.Sprintf("%d sources", sources), func(t *testing.T) {
			b := startLBIn(t, p.A, "[fd00:192::1]:0", newBackend(t, "a", false))
			checkFairShare(t, b, sources, func(i int) (c net.Conn, err error) {
				src := fmt.Sprintf("fd00:192::1:%x", min(i, 64)+1)
				err = netns.Do(p.B, func() error {
					d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: time.Second}
					c, err = d.Dial("tcp", b.Addr().String())
					return err
				})
				return c, err
			})
		})
	}
}

// startLBIn is startLB with the listener in namespace ns, on listen.
func startLBIn(t *testing.T, ns, listen string, be *tcpBackend) *Balancer {
	t.Helper()
	b, _ := startLBWith(t, Config{Listen: listen, MaxConns: floodLimit, MaxConnsPerSource: -1}, func(cfg Config) (b *Balancer, err error) {
		err = netns.Do(ns, func() error {
			b, err = New(cfg, slog.New(slog.DiscardHandler))
			return err
		})
		return b, err
	}, be)
	return b
}
