package daemon

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/vigil-ha/vigil/internal/health"
	"github.com/vigil-ha/vigil/internal/netmon"
	"github.com/vigil-ha/vigil/internal/testkit"
)

// readyz is a /readyz server on addr whose health a test switches.
func readyz(t *testing.T, addr string, ok *atomic.Bool) string {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("cannot listen on %s: %v", addr, err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if !ok.Load() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
		}
	}))
	srv.Listener = ln
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return ln.Addr().String()
}

// TestPlacement uses two real /readyz servers: one on 127.0.0.1, which is
// this host's address (the local API server), one on 127.0.0.2, which is
// not in the host's address list (a peer's).
func TestPlacement(t *testing.T) {
	var localOK, peerOK atomic.Bool
	localOK.Store(true)
	peerOK.Store(true)
	local := readyz(t, "127.0.0.1:0", &localOK)
	peer := readyz(t, "127.0.0.2:0", &peerOK)
	c, err := health.New(health.Config{TLS: &tls.Config{InsecureSkipVerify: true}, Interval: 50 * time.Millisecond}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Set([]string{local, peer})
	mon, err := netmon.New(slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer mon.Close()
	p := &placement{checker: c, grace: 300 * time.Millisecond, host: newHostAddrs([]netip.Addr{netip.MustParseAddr("10.0.0.100")}, mon),
		log: slog.New(slog.DiscardHandler), gauge: prometheus.NewGauge(prometheus.GaugeOpts{Name: "g"})}
	if !p.host.get()[netip.MustParseAddr("127.0.0.1")] || p.host.get()[netip.MustParseAddr("127.0.0.2")] {
		t.Skip("this host's address list is not as the test expects (127.0.0.1 only on lo)")
	}
	stays := func(d time.Duration, want bool) {
		t.Helper()
		testkit.Always(t, d, fmt.Sprintf("yield = %v", want), func() bool { _, y := p.yield(); return y == want })
	}
	becomes := func(d time.Duration, want bool) string {
		t.Helper()
		var r string
		testkit.WaitFor(t, d, fmt.Sprintf("yield = %v", want), func() bool {
			var y bool
			r, y = p.yield()
			return y == want
		})
		return r
	}
	waitUp := func() {
		t.Helper()
		testkit.WaitFor(t, 3*time.Second, "both backends up", func() bool {
			a, _ := c.Status(local)
			b, _ := c.Status(peer)
			return a.State == health.Up && b.State == health.Up
		})
	}
	waitUp()
	stays(200*time.Millisecond, false)

	// Local fails: no yield within the grace, yield after it.
	localOK.Store(false)
	failed := time.Now()
	reason := becomes(3*time.Second, true)
	if since := time.Since(failed); since < 250*time.Millisecond {
		t.Fatalf("yielded %v after the local API server failed, before the grace", since)
	}
	if !strings.Contains(reason, local) || !strings.Contains(reason, peer) {
		t.Fatalf("reason %q does not name the local server and the healthy peer", reason)
	}
	if !p.isYielding() {
		t.Fatal("isYielding = false while yielding")
	}

	// Every API server fails: nobody yields (the VIP stays where it is).
	peerOK.Store(false)
	becomes(3*time.Second, false)
	stays(300*time.Millisecond, false)

	// The peer comes back: yield again; the local comes back: stop.
	peerOK.Store(true)
	becomes(3*time.Second, true)
	localOK.Store(true)
	becomes(3*time.Second, false)
}

// statuses is a health checker's verdicts, set by the test.
type statuses struct {
	mu  sync.Mutex
	sts []health.Status
}

func (s *statuses) Statuses() []health.Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.sts)
}

func (s *statuses) set(sts ...health.Status) {
	s.mu.Lock()
	s.sts = sts
	s.mu.Unlock()
}

// In virtual time the grace is exact: a node whose API server has failed
// for 1 ns less than the grace stays, and yields at the grace, with a
// healthy peer; without one it never yields, however long it fails.
func TestPlacementGraceIsExact(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const grace = 2 * time.Second
		local, peer := "127.0.0.1:6443", "127.0.0.2:6443"
		s := &statuses{}
		gauge := prometheus.NewGauge(prometheus.GaugeOpts{Name: "g"})
		host := fixedAddrs{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("10.0.0.100")} // the VIP's is not the host's
		p := &placement{checker: s, grace: grace, brisk: 300 * time.Millisecond, host: newHostAddrs([]netip.Addr{netip.MustParseAddr("10.0.0.100")}, host),
			log: slog.New(slog.DiscardHandler), gauge: gauge}
		failed := time.Now()
		s.set(health.Status{Backend: local, State: health.Down, FailingSince: failed, LastError: "HTTP 500"},
			health.Status{Backend: peer, State: health.Up, PassingSince: failed.Add(-time.Hour)})
		testkit.HappensAt(t, grace, "yield to a healthy peer", func() bool { _, y := p.yield(); return y })
		reason, y := p.yield()
		if !y || !strings.Contains(reason, local) || !strings.Contains(reason, peer) || !strings.Contains(reason, "failing for 2s") {
			t.Fatalf("at the grace: yield = %v, %q; want a yield naming both servers and 2s", y, reason)
		}
		if v := testutil.ToFloat64(gauge); v != 1 || !p.isYielding() {
			t.Fatalf("yielding gauge %v, isYielding %v", v, p.isYielding())
		}
		// The peer fails too: nobody yields, however long it lasts.
		s.set(health.Status{Backend: local, State: health.Down, FailingSince: failed},
			health.Status{Backend: peer, State: health.Down, FailingSince: time.Now()})
		time.Sleep(time.Hour)
		if _, y := p.yield(); y {
			t.Fatal("yielded with no healthy peer")
		}
		if v := testutil.ToFloat64(gauge); v != 0 {
			t.Fatalf("yielding gauge %v after the yield ended", v)
		}
		// A brownout ends: the peer answers again first, while the local
		// server still fails. No yield until the peer has passed its
		// checks for the grace, then a yield at it.
		recovered := time.Now()
		s.set(health.Status{Backend: local, State: health.Down, FailingSince: failed},
			health.Status{Backend: peer, State: health.Up, PassingSince: recovered})
		testkit.HappensAt(t, grace, "yield to a peer that has passed its checks since the brownout", func() bool { _, y := p.yield(); return y })
		// A brownout begins: the local server times out first while the
		// peer still passes, slowly. A peer whose last check took longer
		// than brisk is no home; once it answers briskly again, it is.
		s.set(health.Status{Backend: local, State: health.Down, FailingSince: failed},
			health.Status{Backend: peer, State: health.Up, PassingSince: recovered, LastRTT: 301 * time.Millisecond})
		if _, y := p.yield(); y {
			t.Fatal("yielded to a peer whose last check took 301ms, above brisk (300ms)")
		}
		s.set(health.Status{Backend: local, State: health.Down, FailingSince: failed},
			health.Status{Backend: peer, State: health.Up, PassingSince: recovered, LastRTT: 300 * time.Millisecond})
		if _, y := p.yield(); !y {
			t.Fatal("no yield to a peer whose last check took brisk exactly")
		}
		// A peer still Up but failing its checks (fewer than fall
		// failures) is no home either.
		s.set(health.Status{Backend: local, State: health.Down, FailingSince: failed},
			health.Status{Backend: peer, State: health.Up, FailingSince: time.Now()})
		if _, y := p.yield(); y {
			t.Fatal("yielded to a peer that is failing its checks")
		}
		// A local server that has not failed (FailingSince zero) never
		// yields.
		s.set(health.Status{Backend: local, State: health.Up, PassingSince: recovered},
			health.Status{Backend: peer, State: health.Up, PassingSince: recovered})
		time.Sleep(time.Hour)
		if _, y := p.yield(); y {
			t.Fatal("yielded with a healthy local API server")
		}
	})
}

// fixedAddrs is a host's address list that does not change.
type fixedAddrs []netip.Addr

func (f fixedAddrs) Addrs() []netip.Addr { return slices.Clone(f) }

// The host's addresses are the monitor's, without the VIP's: an API server
// on the VIP's address is not this node's.
func TestHostAddrsLeaveTheVIPOut(t *testing.T) {
	vip := netip.MustParseAddr("10.0.0.100")
	h := newHostAddrs([]netip.Addr{vip}, fixedAddrs{netip.MustParseAddr("10.0.0.11"), vip})
	mine := h.mine([]health.Status{{Backend: "10.0.0.11:6443"}, {Backend: "10.0.0.100:6443"}, {Backend: "10.0.0.12:6443"}})
	if len(mine) != 1 || mine[0].Backend != "10.0.0.11:6443" {
		t.Fatalf("mine = %+v, want the API server at 10.0.0.11 only", mine)
	}
}
