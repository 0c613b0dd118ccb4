package lb

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/vigil-ha/vigil/internal/netns"
	"github.com/vigil-ha/vigil/internal/nstest"
	"github.com/vigil-ha/vigil/internal/testkit"
)

// A holder whose lease ran out loses the VIP first and resets its clients
// after (safety before courtesy; the guard may even have removed the VIP
// already). The resets must still reach the clients: a client waiting for
// an answer sends nothing, so without the reset it waits for its own
// timeout, which for a kubelet's watch is minutes. The kernel sends a
// socket's packets from its own address only while that address is local;
// the listener is IP_TRANSPARENT so that its connections may still send
// from the VIP once it is gone.
func TestResetsReachClientsAfterTheVIPIsGone(t *testing.T) {
	p := nstest.NewPair(t)
	for _, tc := range []struct{ name, vip, prefix string }{
		{"IPv4", "192.0.2.100", "/24"},
		{"IPv6", "fd00:192::100", "/64"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nstest.IP(t, "-n", p.A, "addr", "add", tc.vip+tc.prefix, "dev", "a0", "nodad")
			be := newBackend(t, "a", true) // reads, never answers
			b, _ := startLBWith(t, Config{Listen: net.JoinHostPort(tc.vip, "0"), FreeBind: true}, func(cfg Config) (b *Balancer, err error) {
				err = netns.Do(p.A, func() error {
					b, err = New(cfg, slog.New(slog.DiscardHandler))
					return err
				})
				return b, err
			}, be)
			var c net.Conn
			err := netns.Do(p.B, func() (err error) {
				c, err = net.DialTimeout("tcp", b.Addr().String(), 2*time.Second)
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if _, err := io.WriteString(c, "request\n"); err != nil {
				t.Fatal(err)
			}
			// Proxied: the backend holds the connection.
			testkit.WaitNil(t, 5*time.Second, "the backend to hold the connection", func() error {
				be.mu.Lock()
				n := len(be.conns)
				be.mu.Unlock()
				if n != 1 {
					return fmt.Errorf("it has %d, want 1", n)
				}
				return nil
			})
			nstest.IP(t, "-n", p.A, "addr", "del", tc.vip+tc.prefix, "dev", "a0")
			b.SetServing(false)
			_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
			_, err = c.Read(make([]byte, 1))
			if !errors.Is(err, syscall.ECONNRESET) {
				t.Fatalf("the client read %v after the VIP went and the balancer reset it, want a reset", err)
			}
		})
	}
}
