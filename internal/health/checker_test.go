package health

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/vigil-ha/vigil/internal/testaddr"
	"github.com/vigil-ha/vigil/internal/testkit"
	"github.com/vigil-ha/vigil/internal/validate"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// apiserver is a stand-in /readyz server whose answer a test switches.
type apiserver struct {
	srv  *httptest.Server
	mode atomic.Value // "ok", "503", "hang"
	hang chan struct{}
	// checks counts the /readyz requests.
	checks atomic.Int64
}

func newAPIServer(t *testing.T) *apiserver {
	a := &apiserver{hang: make(chan struct{})}
	a.mode.Store("ok")
	a.srv = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/readyz" {
			http.NotFound(w, r)
			return
		}
		a.checks.Add(1)
		switch a.mode.Load().(string) {
		case "503":
			http.Error(w, "shutting down", http.StatusServiceUnavailable)
		case "hang":
			select {
			case <-a.hang:
			case <-r.Context().Done():
			}
		default:
			_, _ = w.Write([]byte("ok"))
		}
	}))
	t.Cleanup(func() {
		close(a.hang)
		a.srv.Close()
	})
	return a
}

func (a *apiserver) backend() string { return strings.TrimPrefix(a.srv.URL, "https://") }

func (a *apiserver) tls() *tls.Config {
	pool := x509.NewCertPool()
	pool.AddCert(a.srv.Certificate())
	return &tls.Config{RootCAs: pool}
}

// changes records OnChange calls.
type changes struct {
	mu  sync.Mutex
	all []Status
}

func (c *changes) add(s Status) {
	c.mu.Lock()
	c.all = append(c.all, s)
	c.mu.Unlock()
}

func (c *changes) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.all)
}

func (c *changes) last(backend string) (Status, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := len(c.all) - 1; i >= 0; i-- {
		if c.all[i].Backend == backend {
			return c.all[i], true
		}
	}
	return Status{}, false
}

func newChecker(t *testing.T, cfg Config) (*Checker, *changes) {
	t.Helper()
	ch := &changes{}
	cfg.OnChange = ch.add
	c, err := New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c, ch
}

func TestCheckerFollowsBackendHealth(t *testing.T) {
	a := newAPIServer(t)
	b := a.backend()
	c, ch := newChecker(t, Config{TLS: a.tls()})
	c.Set([]string{b})
	state := func(s State, cause Cause) func() bool {
		return func() bool { st, ok := ch.last(b); return ok && st.State == s && st.Cause == cause }
	}
	testkit.WaitFor(t, 2*time.Second, "up", state(Up, NoCause))

	a.mode.Store("503")
	testkit.WaitFor(t, 3*time.Second, "draining", state(Down, Draining))
	if st, _ := c.Status(b); !strings.Contains(st.LastError, "503") {
		t.Errorf("LastError = %q, want the HTTP status", st.LastError)
	}
	a.mode.Store("ok")
	testkit.WaitFor(t, 3*time.Second, "up again", state(Up, NoCause))

	// A hung server is unreachable, not dead: no answer within the
	// timeout does not prove its process gone. Generous bound; the
	// defaults give at most interval + fall*timeout = 1.6 s.
	a.mode.Store("hang")
	took := testkit.WaitFor(t, 5*time.Second, "unreachable after hanging", state(Down, Unreachable))
	t.Logf("hung backend ejected after %v", took)
	a.mode.Store("ok")
	testkit.WaitFor(t, 3*time.Second, "up after hang", state(Up, NoCause))

	// A closed server (refused connections) is dead: its process is gone.
	a.srv.Close()
	took = testkit.WaitFor(t, 5*time.Second, "dead after close", state(Down, Dead))
	t.Logf("closed backend ejected after %v", took)
}

// SetPace slows the checks of the backends it says to, Wake checks one
// at once, and a pace cleared takes effect at the next Wake.
func TestPaceAndWake(t *testing.T) {
	a := newAPIServer(t)
	b := a.backend()
	c, ch := newChecker(t, Config{TLS: a.tls(), Interval: 20 * time.Millisecond})
	// Up backends every hour, the others at Interval: what the agent
	// does while the feed vouches for its backends.
	c.SetPace(func(st Status) time.Duration {
		if st.State == Up {
			return time.Hour
		}
		return 0
	})
	c.Set([]string{b})
	testkit.WaitFor(t, 2*time.Second, "up", func() bool { st, ok := ch.last(b); return ok && st.State == Up })
	n := a.checks.Load()
	testkit.Always(t, 300*time.Millisecond, "no check of an up backend paced at an hour", func() bool { return a.checks.Load() == n })
	c.Wake(b)
	testkit.WaitFor(t, 2*time.Second, "the woken check", func() bool { return a.checks.Load() == n+1 })
	// Passive health still works: a failed dial takes it down, and a
	// down backend is checked at Interval until it is up again.
	c.MarkDead(b, errors.New("connection refused"))
	testkit.WaitFor(t, 2*time.Second, "up again after its checks", func() bool { st, ok := ch.last(b); return ok && st.State == Up })
	c.SetPace(nil)
	c.Wake(b)
	n = a.checks.Load()
	testkit.WaitFor(t, 2*time.Second, "checks at Interval again", func() bool { return a.checks.Load() >= n+5 })
}

func TestCheckerWrongCAIsDown(t *testing.T) {
	a := newAPIServer(t)
	c, ch := newChecker(t, Config{TLS: &tls.Config{RootCAs: x509.NewCertPool()}}) // trusts no CA
	c.Set([]string{a.backend()})
	// Down, but the process answers: not Dead.
	testkit.WaitFor(t, 3*time.Second, "down", func() bool {
		st, ok := ch.last(a.backend())
		return ok && st.State == Down && st.Cause == Unreachable
	})
	st, _ := c.Status(a.backend())
	if !strings.Contains(st.LastError, "certificate") {
		t.Errorf("LastError = %q, want a certificate error", st.LastError)
	}
}

func TestCheckerHealthPortAndInsecure(t *testing.T) {
	a := newAPIServer(t)
	p := a.srv.Listener.Addr().(*net.TCPAddr).Port
	// Traffic goes to port 1 (nothing there); checks go to the server.
	c, ch := newChecker(t, Config{Port: p, TLS: &tls.Config{InsecureSkipVerify: true}})
	c.Set([]string{"127.0.0.1:1"})
	testkit.WaitFor(t, 3*time.Second, "up via the health port", func() bool { st, ok := ch.last("127.0.0.1:1"); return ok && st.State == Up })
}

func TestCheckerMarkDeadAndSet(t *testing.T) {
	a, b := newAPIServer(t), newAPIServer(t)
	c, ch := newChecker(t, Config{TLS: &tls.Config{InsecureSkipVerify: true}, Interval: time.Hour}) // only the first check runs
	c.Set([]string{a.backend(), b.backend()})
	testkit.WaitFor(t, 3*time.Second, "both up", func() bool {
		s1, ok1 := ch.last(a.backend())
		s2, ok2 := ch.last(b.backend())
		return ok1 && ok2 && s1.State == Up && s2.State == Up
	})
	c.MarkDead(a.backend(), errors.New("connection refused"))
	if st, _ := ch.last(a.backend()); st.State != Down || st.Cause != Dead {
		t.Fatalf("after MarkDead: %v", st)
	}
	c.Set([]string{b.backend()})
	if _, ok := c.Status(a.backend()); ok {
		t.Fatal("removed backend still has a status")
	}
	c.MarkDead(a.backend(), errors.New("late")) // no effect, no panic
	if got := c.Statuses(); len(got) != 1 || got[0].Backend != b.backend() {
		t.Fatalf("Statuses = %v", got)
	}
	c.Close()
	c.Close() // twice is fine
	c.Set([]string{a.backend()})
	if len(c.Statuses()) != 1 {
		t.Fatal("Set after Close started a probe")
	}
}

// TestDialFailed: what a failed data-path connection proves decides what
// it does to the backend.
func TestDialFailed(t *testing.T) {
	a := newAPIServer(t)
	b := a.backend()
	c, ch := newChecker(t, Config{TLS: &tls.Config{InsecureSkipVerify: true}, Interval: time.Hour}) // only the first check runs
	c.Set([]string{b})
	testkit.WaitFor(t, 3*time.Second, "up", func() bool { st, ok := ch.last(b); return ok && st.State == Up })
	opErr := func(errno syscall.Errno) error {
		return &net.OpError{Op: "dial", Net: "tcp", Err: &os.SyscallError{Syscall: "connect", Err: errno}}
	}
	expect := func(step string, s State, cause Cause) {
		t.Helper()
		if st, _ := c.Status(b); st.State != s || st.Cause != cause {
			t.Fatalf("%s: %v cause %v, want %v cause %v", step, st.State, st.Cause, s, cause)
		}
	}
	// This host's own shortages say nothing about the backend.
	for _, e := range []error{opErr(syscall.EADDRNOTAVAIL), opErr(syscall.EMFILE), context.Canceled} {
		c.DialFailed(b, e)
		c.DialFailed(b, e)
		expect(fmt.Sprintf("after %v twice", e), Up, NoCause)
	}
	// A timeout is one failed check: one is not enough (fall 2), two are,
	// and the cause is Unreachable, not Dead.
	c.DialFailed(b, context.DeadlineExceeded)
	expect("after one timeout", Up, NoCause)
	c.DialFailed(b, opErr(syscall.EHOSTUNREACH))
	expect("after a timeout and no route", Down, Unreachable)
	// A refused connection proves the process gone.
	c.DialFailed(b, opErr(syscall.ECONNREFUSED))
	expect("after a refused connection", Down, Dead)
	if got := ch.count(); got != 3 { // up, unreachable, dead
		t.Errorf("%d changes reported, want 3", got)
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	for _, cfg := range []Config{
		{Path: "readyz"},
		{Port: 70000},
		{Interval: -1},
		{Rise: -1},
	} {
		if _, err := New(cfg, slog.New(slog.DiscardHandler)); !errors.Is(err, validate.ErrInvalid) {
			t.Errorf("New(%+v) = %v, want validate.ErrInvalid", cfg, err)
		}
	}
}

// A TCP check passes while the backend accepts connections, whatever it
// speaks, and finds it dead once it refuses them.
func TestCheckerTCP(t *testing.T) {
	addr := net.JoinHostPort(testaddr.Loopback(t), strconv.Itoa(testaddr.Port(t)))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	go func() { // accepts and says nothing, as a non-HTTP service might
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	c, ch := newChecker(t, Config{Scheme: SchemeTCP, Interval: 50 * time.Millisecond})
	c.Set([]string{addr})
	testkit.WaitFor(t, 3*time.Second, "up", func() bool { st, ok := ch.last(addr); return ok && st.State == Up })
	_ = ln.Close()
	testkit.WaitFor(t, 3*time.Second, "dead once closed", func() bool {
		st, ok := ch.last(addr)
		return ok && st.State == Down && st.Cause == Dead
	})
}
