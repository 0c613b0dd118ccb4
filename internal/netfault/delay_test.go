package netfault

import (
	"bufio"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// echo serves lines back until the listener closes.
func echo(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	return ln
}

// roundTrip sends a line through c and times its echo.
func roundTrip(t *testing.T, c net.Conn, r *bufio.Reader) time.Duration {
	t.Helper()
	start := time.Now()
	if _, err := io.WriteString(c, "ping\n"); err != nil {
		t.Fatal(err)
	}
	line, err := r.ReadString('\n')
	if err != nil || line != "ping\n" {
		t.Fatalf("echo = %q, %v", line, err)
	}
	return time.Since(start)
}

func TestProxyDelaysAnswers(t *testing.T) {
	backend := echo(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := NewProxy(ln, backend.Addr().String(), slog.New(slog.DiscardHandler))
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	if d := roundTrip(t, c, r); d > 100*time.Millisecond {
		t.Fatalf("no delay set, round trip %v", d)
	}
	// An open connection follows the change.
	if err := p.Set(Delay{Latency: 150 * time.Millisecond, Jitter: 20 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		if d := roundTrip(t, c, r); d < 150*time.Millisecond || d > 2*time.Second {
			t.Fatalf("with 150ms (+20ms jitter) the round trip took %v", d)
		}
	}
	// A per-path delay leaves other clients alone.
	if err := p.Set(Delay{Latency: 150 * time.Millisecond, From: []netip.Addr{netip.MustParseAddr("127.0.0.99")}}); err != nil {
		t.Fatal(err)
	}
	if d := roundTrip(t, c, r); d > 100*time.Millisecond {
		t.Fatalf("a client the delay does not name waited %v", d)
	}
	if err := p.Set(Delay{Latency: 150 * time.Millisecond, From: []netip.Addr{netip.MustParseAddr("127.0.0.1")}}); err != nil {
		t.Fatal(err)
	}
	if d := roundTrip(t, c, r); d < 150*time.Millisecond {
		t.Fatalf("the client the delay names waited only %v", d)
	}
	// Bytes keep their order under jitter.
	if err := p.Set(Delay{Jitter: 30 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	var want strings.Builder
	for i := range 200 {
		want.WriteString(strings.Repeat(string(rune('a'+i%26)), 1+i%7) + "\n")
	}
	go func() { _, _ = io.WriteString(c, want.String()) }()
	got := make([]byte, want.Len())
	if _, err := io.ReadFull(r, got); err != nil {
		t.Fatal(err)
	}
	if string(got) != want.String() {
		t.Fatal("the proxy reordered or changed the bytes under jitter")
	}
}

func TestDelayValidate(t *testing.T) {
	for _, d := range []Delay{
		{Latency: -time.Millisecond},
		{Jitter: -time.Millisecond},
		{Latency: 2 * MaxDelay},
		{From: []netip.Addr{{}}},
	} {
		if err := d.Validate(); err == nil {
			t.Errorf("%+v accepted", d)
		}
	}
	if err := (Delay{Latency: 250 * time.Millisecond, Jitter: 10 * time.Millisecond}).Validate(); err != nil {
		t.Fatal(err)
	}
}

// Close does not wait for answers held back: a minute's delay ends at
// once, and the client sees its connection close.
func TestProxyCloseDropsHeldAnswers(t *testing.T) {
	backend := echo(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := NewProxy(ln, backend.Addr().String(), slog.New(slog.DiscardHandler))
	if err := p.Set(Delay{Latency: MaxDelay}); err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", p.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "ping\n"); err != nil {
		t.Fatal(err)
	}
	// The echo is held once the proxy has read it back from the backend;
	// a read that times out shows it is being held.
	_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if n, err := c.Read(make([]byte, 8)); err == nil {
		t.Fatalf("read %d bytes through a minute's delay", n)
	}
	start := time.Now()
	done := make(chan struct{})
	go func() { _ = p.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Close waited for a held answer")
	}
	t.Logf("Close took %v", time.Since(start))
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 8)); err == nil {
		t.Fatal("the held answer was delivered after Close")
	}
}
