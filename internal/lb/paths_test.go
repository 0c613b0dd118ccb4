package lb

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/vigil-ha/vigil/internal/health"
	"github.com/vigil-ha/vigil/internal/testaddr"
	"github.com/vigil-ha/vigil/internal/testkit"
)

// TestDualStackListeners: a balancer on an IPv4 and an IPv6 address serves
// both with one backend set; a second address that cannot be bound fails
// New and leaves the first closed.
func TestDualStackListeners(t *testing.T) {
	if ln, err := net.Listen("tcp", "[::1]:0"); err != nil {
		t.Skipf("no IPv6 loopback here: %v", err)
	} else {
		ln.Close()
	}
	be := newBackend(t, "a", false)
	// Ports of this test binary's own: after Run returns nothing may
	// accept there, and a port the kernel handed out could be another
	// process's by then.
	b, err := New(Config{Listen: net.JoinHostPort(testaddr.Loopback(t), strconv.Itoa(testaddr.Port(t))),
		AlsoListen: []string{net.JoinHostPort("::1", strconv.Itoa(testaddr.Port(t)))}, Loops: testLoops}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	b.SetBackends([]string{be.addr()})
	b.Update(health.Status{Backend: be.addr(), State: health.Up})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()
	addrs := b.Addrs()
	if len(addrs) != 2 {
		t.Fatalf("listening on %v, want two addresses", addrs)
	}
	for _, a := range addrs {
		c, err := net.Dial("tcp", a.String())
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.WriteString(c, "hi\n")
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if got, err := bufio.NewReader(c).ReadString('\n'); err != nil || got != "a\n" {
			t.Errorf("through %s: %q, %v; want a greeting from a", a, got, err)
		}
		c.Close()
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if c, err := net.Dial("tcp", a.String()); err == nil {
			c.Close()
			t.Errorf("%s still accepts after Run returned", a)
		}
	}

	// The second address is taken, the first is free: one port of this
	// test binary's own on both (a port the kernel hands out for [::1]
	// might be another process's on 127.0.0.1).
	port := strconv.Itoa(testaddr.Port(t))
	busy, err := net.Listen("tcp", net.JoinHostPort("::1", port))
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	first := net.JoinHostPort(testaddr.Loopback(t), port)
	if _, err := New(Config{Listen: first, AlsoListen: []string{busy.Addr().String()}}, slog.New(slog.DiscardHandler)); !errors.Is(err, ErrPortInUse) {
		t.Fatalf("New with a busy second address: %v, want ErrPortInUse", err)
	}
	if ln, err := net.Listen("tcp", first); err != nil {
		t.Fatalf("the first listener was left open after New failed: %v", err)
	} else {
		ln.Close()
	}
}

// bulkEcho sends 1 MiB through c to an echoing backend and reads it back
// intact; with the event loops on, the pair has then been handed over to
// goroutines.
func bulkEcho(t *testing.T, b *Balancer, c net.Conn, r *bufio.Reader) {
	t.Helper()
	payload := make([]byte, 1<<20)
	_, _ = rand.Read(payload)
	go func() { _, _ = c.Write(payload) }()
	got := make([]byte, len(payload))
	if _, err := io.ReadFull(r, got); err != nil || !bytes.Equal(got, payload) {
		t.Fatalf("bulk echo: %v, intact %v", err, bytes.Equal(got, payload))
	}
	if n := b.handovers.Load(); (n > 0) != (testLoops == 0) {
		t.Fatalf("%d connections handed over after a bulk transfer (Loops %d)", n, testLoops)
	}
}

// TestEventLoopPaths: with the default Loops, connections are served by
// the event loops; a bulk transfer is handed over to goroutines intact, and
// a backend named by host name is dialled by the goroutine path. With
// Loops -1 no loop runs.
func TestEventLoopPaths(t *testing.T) {
	be := newBackend(t, "a", false)
	b, _ := startLB(t, Config{}, be)
	c, r, name := dial(t, b, true)
	if name != "a" {
		t.Fatalf("greeted by %q", name)
	}
	if testLoops == 0 {
		testkit.WaitFor(t, 5*time.Second, "the event loops to start", func() bool { return b.eventLoops() > 0 })
	}
	if got := b.eventLoops(); (got > 0) != (testLoops == 0) {
		t.Fatalf("%d event loops running with Loops %d", got, testLoops)
	}
	// Small exchanges stay where they are.
	for range 20 {
		_, _ = io.WriteString(c, "ping\n")
		if line, err := r.ReadString('\n'); err != nil || line != "ping\n" {
			t.Fatalf("echo: %q, %v", line, err)
		}
	}
	if n := b.handovers.Load(); n != 0 {
		t.Fatalf("%d connections handed over after small exchanges", n)
	}
	// A reader that falls behind: the echo fills the client's socket
	// while it writes in small pieces and reads nothing; then it reads
	// it all back, intact.
	slow := make([]byte, 2<<20)
	_, _ = rand.Read(slow)
	wrote := make(chan error, 1)
	go func() {
		for off := 0; off < len(slow); off += 512 {
			if _, err := c.Write(slow[off : off+512]); err != nil {
				wrote <- err
				return
			}
		}
		wrote <- nil
	}()
	time.Sleep(200 * time.Millisecond)
	echo := make([]byte, len(slow))
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.ReadFull(r, echo); err != nil || !bytes.Equal(echo, slow) {
		t.Fatalf("echo to a slow reader: %v, intact %v", err, bytes.Equal(echo, slow))
	}
	if err := <-wrote; err != nil {
		t.Fatal(err)
	}
	// Bulk both ways: handed over (loops), every byte intact.
	bulkEcho(t, b, c, r)
	c.Close()

	// A backend named by host name.
	_, port, _ := net.SplitHostPort(be.addr())
	b.SetBackends([]string{"localhost:" + port})
	b.Update(health.Status{Backend: "localhost:" + port, State: health.Up})
	c2, _, name := dial(t, b, true)
	if name != "a" {
		t.Fatalf("through a host-name backend: greeted by %q", name)
	}
	c2.Close()
}

// A backend that speaks first (a banner, SSH): with ServerSpeaksFirst a
// client that sends nothing gets the banner at once, not after the
// kernel's deferred accept gives up waiting for the client (a second).
func TestServerSpeaksFirst(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = io.WriteString(c, "banner\n")
			_ = c.Close()
		}
	})
	banner := func(b *Balancer) time.Duration {
		t.Helper()
		start := time.Now()
		c, err := net.Dial("tcp", b.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil || line != "banner\n" {
			t.Fatalf("read %q, %v; want the banner", line, err)
		}
		return time.Since(start)
	}
	start := func(cfg Config) *Balancer {
		cfg.Listen, cfg.Loops = "127.0.0.1:0", testLoops
		b, err := New(cfg, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { _ = b.Run(ctx); close(done) }()
		t.Cleanup(func() { cancel(); <-done })
		b.SetBackends([]string{ln.Addr().String()})
		b.Update(health.Status{Backend: ln.Addr().String(), State: health.Up})
		return b
	}
	fast := start(Config{ServerSpeaksFirst: true})
	for range 5 {
		// Generous: a local connection takes a millisecond; a deferred
		// accept, a second or more.
		if d := banner(fast); d > 500*time.Millisecond {
			t.Fatalf("banner after %v with ServerSpeaksFirst", d)
		}
	}
	t.Logf("banner through a balancer that assumes the client speaks first: %v", banner(start(Config{})))
}
