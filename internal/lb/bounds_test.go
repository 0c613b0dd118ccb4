package lb

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/vigil-ha/vigil/internal/testkit"
	"github.com/vigil-ha/vigil/internal/validate"
)

// Connections beyond the total or the per-source limit are reset at once;
// the ones already served carry on, and a freed slot is usable again.
func TestConnectionLimits(t *testing.T) {
	for _, tc := range []struct {
		name    string
		cfg     Config
		limit   string
		allowed int
	}{
		{"total", Config{MaxConns: 3, MaxConnsPerSource: -1}, "max_conns", 3},
		{"per source", Config{MaxConns: 10, MaxConnsPerSource: 2}, "max_conns_per_source", 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			be := newBackend(t, "a", false)
			b, _ := startLB(t, tc.cfg, be)
			var held []net.Conn
			for range tc.allowed {
				c, _, name := dial(t, b, true)
				if name != "a" {
					t.Fatalf("connection within the limit got %q", name)
				}
				held = append(held, c)
			}
			refused(t, b)
			if n := counterValue(b.m.refused.WithLabelValues(tc.limit)); n != 1 {
				t.Fatalf("vigil_lb_refused_total{limit=%q} = %v, want 1", tc.limit, n)
			}
			// The served ones still work.
			for _, c := range held {
				if _, err := io.WriteString(c, "x"); err != nil {
					t.Fatal(err)
				}
			}
			held[0].Close()
			waitConns(t, b, tc.allowed-1)
			if _, _, name := dial(t, b, true); name != "a" {
				t.Fatalf("a freed slot was not reused: got %q", name)
			}
		})
	}
}

// An idle timeout closes a connection with no traffic either way, and
// traffic in either direction keeps it open.
func TestIdleTimeout(t *testing.T) {
	be := newBackend(t, "a", false)
	b, _ := startLB(t, Config{IdleTimeout: 300 * time.Millisecond}, be)
	c, r, _ := dial(t, b, true)
	for range 5 { // 750 ms of traffic, every 150 ms
		time.Sleep(150 * time.Millisecond)
		if _, err := io.WriteString(c, "ping\n"); err != nil {
			t.Fatalf("closed while busy: %v", err)
		}
		_ = c.SetReadDeadline(time.Now().Add(time.Second))
		if line, err := r.ReadString('\n'); err != nil || line != "ping\n" {
			t.Fatalf("echo = %q, %v", line, err)
		}
	}
	took := closedWithin(t, r, c, 3*time.Second)
	if took < 200*time.Millisecond {
		t.Fatalf("closed %v after the last byte, before the idle timeout", took)
	}
	if n := counterValue(b.m.closed.WithLabelValues("timeout")); n < 1 {
		t.Fatalf("vigil_lb_connections_closed_total{reason=timeout} = %v", n)
	}
}

// Without an idle timeout a quiet connection stays (a watch), and holds no
// copy buffer while it waits.
func TestQuietConnectionsStayAndHoldNoBuffer(t *testing.T) {
	be := newBackend(t, "a", false)
	b, _ := startLB(t, Config{}, be)
	var rs []net.Conn
	for range 20 {
		c, _, name := dial(t, b, true)
		if name != "a" {
			t.Fatalf("got %q", name)
		}
		rs = append(rs, c)
	}
	testkit.WaitNil(t, 3*time.Second, "20 idle connections to hold no copy buffer", func() error {
		if n := buffersInUse.Load(); n != 0 {
			return fmt.Errorf("%d held", n)
		}
		return nil
	})
	waitConns(t, b, 20)
	for _, c := range rs {
		if _, err := io.WriteString(c, "still here\n"); err != nil {
			t.Fatal(err)
		}
	}
}

// After the client finished sending, the backend has HalfCloseTimeout to
// finish too; a backend that never does is cut off.
func TestHalfCloseTimeout(t *testing.T) {
	hung := newBackend(t, "hung", true) // reads everything, never answers or closes
	b, _ := startLB(t, Config{HalfCloseTimeout: 300 * time.Millisecond}, hung)
	c, r, _ := dial(t, b, false)
	waitConns(t, b, 1)
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	took := closedWithin(t, r, c, 3*time.Second)
	if took < 200*time.Millisecond {
		t.Fatalf("closed %v after the half-close, before the timeout", took)
	}
	waitConns(t, b, 0)
}

func TestLimitConfigErrors(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	for _, cfg := range []Config{
		{MaxConns: -2}, {MaxConnsPerSource: -5}, {MaxConns: 10, MaxConnsPerSource: 11},
		{IdleTimeout: -time.Second}, {HalfCloseTimeout: -time.Second},
	} {
		cfg.Listen = "127.0.0.1:0"
		b, err := New(cfg, log)
		if !errors.Is(err, validate.ErrInvalid) {
			if b != nil {
				b.Close()
			}
			t.Errorf("New(%+v) = %v, want validate.ErrInvalid", cfg, err)
		} else if !strings.Contains(err.Error(), "`lb") && !strings.Contains(err.Error(), "timeout") {
			t.Errorf("error %q names neither the setting nor the timeout", err)
		}
	}
}

func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return -1
	}
	return m.GetCounter().GetValue()
}

// At the total limit a flood of idle connections from a few addresses does
// not keep a new client out: the oldest connection of the source holding
// the most is evicted for it, and a source already at its share is still
// refused. 4 and 64 flooding addresses, IPv4 loopback (127.0.0.0/8 gives
// any address); TestFairShareUnderAnIPv6Flood does the same with IPv6.
func TestFairShareUnderAFlood(t *testing.T) {
	for _, sources := range []int{4, 64} {
		t.Run(fmt.Sprintf("%d sources", sources), func(t *testing.T) {
			be := newBackend(t, "a", false)
			b, _ := startLB(t, Config{MaxConns: floodLimit, MaxConnsPerSource: -1}, be)
			checkFairShare(t, b, sources, func(i int) (net.Conn, error) {
				d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 1, byte(i/250), byte(1+i%250))}, Timeout: time.Second}
				return d.Dial("tcp", b.Addr().String())
			})
		})
	}
}

// floodLimit is --lb-max-conns in the flood tests.
const floodLimit = 128

// checkFairShare fills b's floodLimit from sources addresses (dial(i)
// dials from the i-th address), then checks that a client from another
// address (dial(1000)) is served within a second, that exactly one flood
// connection was evicted for it, and that a flooding source asking for
// more is refused.
func checkFairShare(t *testing.T, b *Balancer, sources int, dial func(i int) (net.Conn, error)) {
	t.Helper()
	var flood []net.Conn
	for i := range floodLimit {
		c, err := dial(i % sources)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		flood = append(flood, c)
	}
	waitAdmitted(t, b, floodLimit)
	// A newcomer from a fresh address: served within a second.
	start := time.Now()
	c, err := dial(1000)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := io.WriteString(c, "hi\n"); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(time.Second))
	if name, err := bufio.NewReader(c).ReadString('\n'); err != nil || name != "a\n" {
		t.Fatalf("a new client from a fresh address at the limit got %q, %v; want it served", name, err)
	}
	t.Logf("served in %v", time.Since(start).Round(time.Millisecond))
	if n := counterValue(b.m.closed.WithLabelValues("fair_share")); n != 1 {
		t.Fatalf("evictions = %v, want 1", n)
	}
	// The evicted one is the oldest of a source that held the most.
	var closed atomic.Int32
	var wg sync.WaitGroup
	for _, f := range flood { // all at once: one short wait
		wg.Go(func() {
			_ = f.SetReadDeadline(time.Now().Add(time.Second)) // the eviction is posted to a loop: room for a busy machine
			if _, err := f.Read(make([]byte, 1)); err != nil && !isTimeout(err) {
				closed.Add(1)
			}
		})
	}
	wg.Wait()
	if n := closed.Load(); n != 1 {
		t.Fatalf("%d flood connections closed, want 1", n)
	}
	// A flooding source at its share gets nothing more.
	refusedBefore := counterValue(b.m.refused.WithLabelValues("max_conns"))
	c2, err := dial(1)
	if err == nil {
		defer c2.Close()
		_, _ = io.WriteString(c2, "hi\n")
		closedWithin(t, bufio.NewReader(c2), c2, 2*time.Second)
	}
	if n := counterValue(b.m.refused.WithLabelValues("max_conns")); n != refusedBefore+1 {
		t.Fatalf("a flooding source at its share was not refused (refused %v -> %v)", refusedBefore, n)
	}
}

// waitAdmitted waits until the balancer has admitted n client connections.
func waitAdmitted(t *testing.T, b *Balancer, n int) {
	t.Helper()
	testkit.WaitNil(t, 5*time.Second, "the connections admitted", func() error {
		b.mu.Lock()
		got := len(b.clients)
		b.mu.Unlock()
		if got != n {
			return fmt.Errorf("%d admitted, want %d", got, n)
		}
		return nil
	})
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
