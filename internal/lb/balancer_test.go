package lb

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/vigil-ha/vigil/internal/health"
	"github.com/vigil-ha/vigil/internal/testkit"
	"github.com/vigil-ha/vigil/internal/validate"
)

// testLoops is Config.Loops for the balancers the tests start.
var testLoops int

// TestMain runs every test twice: connections served by the event loops
// (the default), then by goroutines (Config.Loops -1).
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		testLoops = -1
		code = m.Run()
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// tcpBackend reads one line from each connection (clients speak first, as TLS
// clients do; the balancer only accepts a connection once it has data), then
// greets it with its name and a newline and echoes; or, when hung, reads and
// never answers.
type tcpBackend struct {
	name string
	ln   net.Listener
	hang bool

	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
}

func newBackend(t *testing.T, name string, hang bool) *tcpBackend {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &tcpBackend{name: name, ln: ln, hang: hang}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			b.mu.Lock()
			b.conns = append(b.conns, c)
			b.mu.Unlock()
			b.wg.Add(1)
			go func() {
				defer b.wg.Done()
				if b.hang {
					_, _ = io.Copy(io.Discard, c)
					return
				}
				r := bufio.NewReader(c)
				if _, err := r.ReadString('\n'); err != nil {
					return
				}
				if _, err := io.WriteString(c, b.name+"\n"); err != nil {
					return
				}
				_, _ = io.Copy(c, r)
				_ = c.(*net.TCPConn).CloseWrite()
			}()
		}
	}()
	t.Cleanup(b.kill)
	return b
}

func (b *tcpBackend) addr() string { return b.ln.Addr().String() }

// kill closes the listener and resets every connection, as a killed process.
func (b *tcpBackend) kill() {
	b.ln.Close()
	b.mu.Lock()
	for _, c := range b.conns {
		_ = c.(*net.TCPConn).SetLinger(0)
		c.Close()
	}
	b.mu.Unlock()
	b.wg.Wait()
}

type dialErrs struct {
	mu   sync.Mutex
	seen map[string]int
}

func (d *dialErrs) add(b string, _ error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.seen == nil {
		d.seen = map[string]int{}
	}
	d.seen[b]++
}

func (d *dialErrs) count(b string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.seen[b]
}

// startLB runs a balancer on loopback over backends, all marked up.
func startLB(t *testing.T, cfg Config, backends ...*tcpBackend) (*Balancer, *dialErrs) {
	t.Helper()
	cfg.Listen = "127.0.0.1:0"
	return startLBWith(t, cfg, func(cfg Config) (*Balancer, error) { return New(cfg, slog.New(slog.DiscardHandler)) }, backends...)
}

// startLBWith is startLB with cfg.Listen as given and the balancer made by
// newLB (in another network namespace, say).
func startLBWith(t *testing.T, cfg Config, newLB func(Config) (*Balancer, error), backends ...*tcpBackend) (*Balancer, *dialErrs) {
	t.Helper()
	errs := &dialErrs{}
	cfg.OnDialError = errs.add
	if cfg.Loops == 0 {
		cfg.Loops = testLoops
	}
	b, err := newLB(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var addrs []string
	for _, be := range backends {
		addrs = append(addrs, be.addr())
	}
	b.SetBackends(addrs)
	for _, a := range addrs {
		b.Update(health.Status{Backend: a, State: health.Up})
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return b, errs
}

// dial connects through the balancer, says hello, and returns the conn and
// the name of the backend that greeted it ("" for a hung backend or a closed
// conn).
func dial(t *testing.T, b *Balancer, greet bool) (net.Conn, *bufio.Reader, string) {
	t.Helper()
	c, err := net.Dial("tcp", b.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := io.WriteString(c, "hi\n"); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(c)
	if !greet {
		return c, r, ""
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	name, err := r.ReadString('\n')
	_ = c.SetReadDeadline(time.Time{})
	if err != nil {
		return c, r, ""
	}
	return c, r, name[:len(name)-1]
}

// dialTo dials through b until a connection lands on the backend named
// name (round robin gets there within a turn).
func dialTo(t *testing.T, b *Balancer, name string) (net.Conn, *bufio.Reader) {
	t.Helper()
	for range 10 {
		if c, r, got := dial(t, b, true); got == name {
			return c, r
		}
	}
	t.Fatalf("10 connections and none went to %s", name)
	return nil, nil
}

// closedWithin reports how long until the server side closes c (a read
// returns an error), failing the test after d.
func closedWithin(t *testing.T, r *bufio.Reader, c net.Conn, d time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	_ = c.SetReadDeadline(start.Add(d))
	for {
		_, err := r.ReadByte()
		if err == nil {
			continue
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("connection still open after %v", d)
		}
		return time.Since(start)
	}
}

func TestForwardsAndBalances(t *testing.T) {
	bes := []*tcpBackend{newBackend(t, "a", false), newBackend(t, "b", false), newBackend(t, "c", false)}
	for _, name := range []string{"least-conn", "round-robin"} {
		t.Run(name, func(t *testing.T) {
			policy, err := ParsePolicy(name)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := startLB(t, Config{Picker: policy}, bes...)
			seen := map[string]int{}
			var open []net.Conn
			for range 9 { // kept open: least-conn must spread them evenly
				c, _, name := dial(t, b, true)
				seen[name]++
				open = append(open, c)
			}
			for _, n := range []string{"a", "b", "c"} {
				if seen[n] != 3 {
					t.Fatalf("backend spread %v, want 3 each", seen)
				}
			}
			for _, c := range open {
				c.Close()
			}
		})
	}
	t.Run("bytes intact both ways", func(t *testing.T) {
		b, _ := startLB(t, Config{}, bes...)
		c, r, _ := dial(t, b, true)
		payload := make([]byte, 4<<20)
		_, _ = rand.Read(payload)
		go func() {
			_, _ = c.Write(payload)
			_ = c.(*net.TCPConn).CloseWrite() // half-close: the echo must still come back
		}()
		got, err := io.ReadAll(r)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, payload) {
			t.Fatalf("echo differs: got %d bytes, want %d", len(got), len(payload))
		}
	})
}

func TestRefusedBackendRetriedElsewhere(t *testing.T) {
	a, bb := newBackend(t, "a", false), newBackend(t, "b", false)
	b, errs := startLB(t, Config{Picker: RoundRobin()}, a, bb)
	a.kill() // still marked up: the balancer learns from the refusal
	for range 6 {
		_, _, name := dial(t, b, true)
		if name != "b" {
			t.Fatalf("client got %q, want b (a refuses connections)", name)
		}
	}
	if errs.count(a.addr()) == 0 {
		t.Fatal("dial errors to the dead backend were not reported")
	}
}

func TestDeadBackendConnectionsClosed(t *testing.T) {
	hung := newBackend(t, "hung", true)
	b, _ := startLB(t, Config{}, hung)
	c, r, _ := dial(t, b, false)
	waitConns(t, b, 1)
	b.Update(health.Status{Backend: hung.addr(), State: health.Down, Cause: health.Dead})
	took := closedWithin(t, r, c, 2*time.Second)
	t.Logf("client connection closed %v after the backend was found dead", took)
	waitConns(t, b, 0)
}

func TestBackendResetMidStream(t *testing.T) {
	a := newBackend(t, "a", false)
	b, _ := startLB(t, Config{}, a)
	c, r, name := dial(t, b, true)
	if name != "a" {
		t.Fatalf("greeted by %q", name)
	}
	a.kill()
	closedWithin(t, r, c, 2*time.Second)
	waitConns(t, b, 0)
}

func TestDrainingBackendKeepsConnectionsUntilTimeout(t *testing.T) {
	a, bb := newBackend(t, "a", false), newBackend(t, "b", false)
	const drain = 2 * time.Second
	b, _ := startLB(t, Config{Picker: RoundRobin(), DrainTimeout: drain}, a, bb)
	ca, ra := dialTo(t, b, "a")
	b.Update(health.Status{Backend: a.addr(), State: health.Down, Cause: health.Draining})
	draining := time.Now()
	// The draining connection still works...
	if _, err := ca.Write([]byte("x\n")); err != nil {
		t.Fatal(err)
	}
	_ = ca.SetReadDeadline(time.Now().Add(drain))
	line, err := ra.ReadString('\n')
	if err != nil && time.Since(draining) < drain {
		t.Fatalf("draining connection closed after %v, before the drain timeout: %v", time.Since(draining), err)
	}
	if err == nil && line != "x\n" {
		t.Fatalf("draining connection echoed %q", line)
	}
	// ...new connections go elsewhere...
	for range 4 {
		if _, _, name := dial(t, b, true); name != "b" {
			t.Fatalf("new connection went to %q while a drains", name)
		}
	}
	// ...and it is closed at the drain timeout.
	closedWithin(t, ra, ca, drain+5*time.Second)
	if took := time.Since(draining); took < drain-100*time.Millisecond {
		t.Fatalf("draining connection closed after %v, before the drain timeout %v", took, drain)
	}
}

// TestUnreachableBackendKeepsConnectionsForGrace: a backend that stops
// answering (a paused kube-apiserver) takes no new connections, but keeps
// its established ones if it answers again within the grace period; one
// that stays silent has them closed when the grace ends, counted from when
// it stopped answering.
func TestUnreachableBackendKeepsConnectionsForGrace(t *testing.T) {
	a, bb := newBackend(t, "a", false), newBackend(t, "b", false)
	const grace = 1500 * time.Millisecond
	b, _ := startLB(t, Config{Picker: RoundRobin(), UnreachableGrace: grace}, a, bb)
	ca, ra := dialTo(t, b, "a")
	echo := func(step string) {
		t.Helper()
		if _, err := ca.Write([]byte("x\n")); err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		_ = ca.SetReadDeadline(time.Now().Add(2 * time.Second))
		if line, err := ra.ReadString('\n'); err != nil || line != "x\n" {
			t.Fatalf("%s: echo %q, %v", step, line, err)
		}
	}
	// Down, then up again before the grace ends: nothing is closed.
	silent := time.Now()
	b.Update(health.Status{Backend: a.addr(), State: health.Down, Cause: health.Unreachable, FailingSince: silent})
	for range 4 {
		if _, _, name := dial(t, b, true); name != "b" {
			t.Fatalf("new connection went to %q while a is unreachable", name)
		}
	}
	time.Sleep(grace / 2)
	b.Update(health.Status{Backend: a.addr(), State: health.Up})
	time.Sleep(grace) // past where the grace would have ended
	echo("after a came back")

	// Down for good: closed when the grace ends, counted from FailingSince.
	silent = time.Now().Add(-grace / 2)
	b.Update(health.Status{Backend: a.addr(), State: health.Down, Cause: health.Unreachable, FailingSince: silent})
	echo("within the grace")
	closedWithin(t, ra, ca, 5*time.Second)
	if took := time.Since(silent); took < grace-100*time.Millisecond {
		t.Fatalf("closed %v after the backend went silent, before the grace %v", took, grace)
	}
}

// TestUnreachableThenDeadClosesAtOnce: a paused backend whose process is
// then killed (its port refuses) has its connections closed at once.
func TestUnreachableThenDeadClosesAtOnce(t *testing.T) {
	a := newBackend(t, "a", false)
	b, _ := startLB(t, Config{UnreachableGrace: time.Hour}, a)
	c, r, _ := dial(t, b, true)
	b.Update(health.Status{Backend: a.addr(), State: health.Down, Cause: health.Unreachable, FailingSince: time.Now()})
	b.Update(health.Status{Backend: a.addr(), State: health.Down, Cause: health.Dead})
	closedWithin(t, r, c, 2*time.Second)
}

func TestDrainingThenDeadClosesAtOnce(t *testing.T) {
	a := newBackend(t, "a", false)
	b, _ := startLB(t, Config{DrainTimeout: time.Hour}, a)
	c, r, _ := dial(t, b, true)
	b.Update(health.Status{Backend: a.addr(), State: health.Down, Cause: health.Draining})
	b.Update(health.Status{Backend: a.addr(), State: health.Down, Cause: health.Dead})
	closedWithin(t, r, c, 2*time.Second)
}

func TestRemovedBackendAndCloseAll(t *testing.T) {
	a, bb := newBackend(t, "a", false), newBackend(t, "b", false)
	b, _ := startLB(t, Config{Picker: RoundRobin()}, a, bb)
	c1, r1, n1 := dial(t, b, true)
	c2, r2, n2 := dial(t, b, true)
	if n1 == n2 {
		t.Fatalf("both connections went to %s", n1)
	}
	// Remove whichever backend c1 uses.
	keep := bb.addr()
	if n1 == "b" {
		keep = a.addr()
	}
	b.SetBackends([]string{keep})
	closedWithin(t, r1, c1, 2*time.Second)
	// c2 stays until CloseAll.
	if _, err := c2.Write([]byte("y\n")); err != nil {
		t.Fatal(err)
	}
	_ = c2.SetReadDeadline(time.Now().Add(2 * time.Second))
	if line, err := r2.ReadString('\n'); err != nil || line != "y\n" {
		t.Fatalf("kept connection: %q %v", line, err)
	}
	b.CloseAll("test")
	closedWithin(t, r2, c2, 2*time.Second)
}

// refused checks that a connection to the balancer is reset or closed at
// once (the reset may even beat the end of the client's connect).
func refused(t *testing.T, b *Balancer) {
	t.Helper()
	c, err := net.Dial("tcp", b.Addr().String())
	if err != nil {
		return
	}
	defer c.Close()
	if _, err := io.WriteString(c, "hi\n"); err != nil {
		return
	}
	closedWithin(t, bufio.NewReader(c), c, 2*time.Second)
}

func TestNoUsableBackendClosesClient(t *testing.T) {
	a := newBackend(t, "a", false)
	b, _ := startLB(t, Config{}, a)
	b.Update(health.Status{Backend: a.addr(), State: health.Down, Cause: health.Draining})
	refused(t, b)
	b.SetBackends(nil) // no backends at all: same, no panic
	refused(t, b)
}

// lastResort picks the first backend not tried, usable or not (anyway).
type lastResort struct{}

func (lastResort) Pick(bs []Candidate, tried map[string]bool) (int, bool) {
	for i, b := range bs {
		if !tried[b.Addr] {
			return i, true
		}
	}
	return -1, false
}

// A picker may send a connection to a backend that failed its checks (the
// worker agent does when every check failed): the balancer serves it.
func TestPickerLastResort(t *testing.T) {
	a := newBackend(t, "a", false)
	b, _ := startLB(t, Config{Picker: lastResort{}}, a)
	// Every check failed (say the client host was overloaded), but the
	// backend answers: the client is served, not reset.
	b.Update(health.Status{Backend: a.addr(), State: health.Down, Cause: health.Dead})
	if _, _, got := dial(t, b, true); got != "a" {
		t.Fatalf("served by %q, want a", got)
	}
	// A refusing backend still fails the client at once.
	a.kill()
	refused(t, b)
}

func TestNewErrors(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	log := slog.New(slog.DiscardHandler)
	if _, err := New(Config{Listen: busy.Addr().String()}, log); !errors.Is(err, ErrPortInUse) {
		t.Fatalf("listen on a busy port: %v, want ErrPortInUse", err)
	}
	for _, l := range []string{"", "6443", "127.0.0.1", ":6443"} {
		if _, err := New(Config{Listen: l}, log); !errors.Is(err, validate.ErrInvalid) {
			t.Errorf("New(Listen %q) = %v, want validate.ErrInvalid", l, err)
		}
	}
}

func waitConns(t *testing.T, b *Balancer, want int) {
	t.Helper()
	testkit.WaitNil(t, 3*time.Second, "the connections tracked", func() error {
		n := 0
		for _, be := range b.Backends() {
			n += be.Connections
		}
		if n != want {
			return fmt.Errorf("%d tracked, want %d", n, want)
		}
		return nil
	})
}

func TestStandbyAndSetServing(t *testing.T) {
	hung := newBackend(t, "hung", true)
	b, _ := startLB(t, Config{Standby: true}, hung)
	// Not serving: accepted and reset at once.
	refused(t, b)

	b.SetServing(true)
	c, r, _ := dial(t, b, false)
	if _, err := c.Write([]byte("request")); err != nil {
		t.Fatal(err)
	}
	waitConns(t, b, 1)
	// Stepping down resets the client at once, although the backend
	// never answered and is healthy.
	b.SetServing(false)
	took := closedWithin(t, r, c, 2*time.Second)
	t.Logf("client reset %v after SetServing(false)", took)
	waitConns(t, b, 0)
}

// Busy: a connection whose client sent last (a request in flight) is busy;
// once the backend answered and quiet passed it is not; a hung backend
// keeps its connection busy.
func TestBusy(t *testing.T) {
	echo, hung := newBackend(t, "echo", false), newBackend(t, "hung", true)
	b, _ := startLB(t, Config{Picker: RoundRobin()}, echo)
	if busy, total := b.Busy(time.Millisecond); busy != 0 || total != 0 {
		t.Fatalf("no connections: busy %d of %d", busy, total)
	}
	c, r := dialTo(t, b, "echo") // greeted: the backend answered last
	testkit.WaitFor(t, time.Second, "answered and quiet: one connection, not busy", func() bool {
		busy, total := b.Busy(10 * time.Millisecond)
		return busy == 0 && total == 1
	})
	if _, err := io.WriteString(c, "ping\n"); err != nil {
		t.Fatal(err)
	}
	if busy, _ := b.Busy(time.Hour); busy != 1 {
		t.Fatalf("within quiet of a byte: busy %d, want 1", busy)
	}
	if _, err := r.ReadString('\n'); err != nil { // the echo
		t.Fatal(err)
	}
	testkit.WaitFor(t, time.Second, "echoed and quiet: not busy", func() bool {
		busy, _ := b.Busy(10 * time.Millisecond)
		return busy == 0
	})
	// A request that is never answered stays busy (for inFlight). Round
	// robin sends one of two new connections to each backend.
	b.SetBackends([]string{echo.addr(), hung.addr()})
	b.Update(health.Status{Backend: hung.addr(), State: health.Up})
	dial(t, b, false)
	dial(t, b, false)
	testkit.WaitFor(t, 2*time.Second, "the two new connections proxied", func() bool {
		_, total := b.Busy(0)
		return total == 3
	})
	// Quiet for longer than 10 ms, and still busy: its request is in flight.
	testkit.WaitFor(t, time.Second, "a request to a hung backend, busy", func() bool {
		busy, _ := b.Busy(10 * time.Millisecond)
		return busy == 1
	})
	testkit.Always(t, 100*time.Millisecond, "a request to a hung backend, busy", func() bool {
		busy, _ := b.Busy(10 * time.Millisecond)
		return busy == 1
	})
}
