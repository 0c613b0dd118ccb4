package observe

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// The watchdog is pinged only while live passes.
func TestSystemdWatchdogFollowsLive(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	t.Setenv("NOTIFY_SOCKET", sock)
	t.Setenv("WATCHDOG_USEC", "100000")
	var stuck atomic.Bool
	live := func(time.Time) error {
		if stuck.Load() {
			return errors.New("stuck")
		}
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); Systemd(ctx, live, slog.New(slog.DiscardHandler)) }()
	read := func(d time.Duration) (string, bool) {
		buf := make([]byte, 64)
		_ = conn.SetReadDeadline(time.Now().Add(d))
		n, err := conn.Read(buf)
		return string(buf[:n]), err == nil
	}
	if m, ok := read(5 * time.Second); m != "READY=1" {
		t.Fatalf("first message = %q, %v; want READY=1", m, ok)
	}
	if m, _ := read(time.Second); m != "WATCHDOG=1" {
		t.Fatalf("while live: %q, want WATCHDOG=1", m)
	}
	stuck.Store(true)
	_, _ = read(60 * time.Millisecond) // a ping already on its way
	if m, ok := read(300 * time.Millisecond); ok {
		t.Fatalf("while stuck: %q, want no ping", m)
	}
	stuck.Store(false)
	if m, _ := read(time.Second); m != "WATCHDOG=1" {
		t.Fatalf("live again: %q, want WATCHDOG=1", m)
	}
	cancel()
	<-done
	for {
		m, ok := read(time.Second)
		if !ok {
			t.Fatal("no STOPPING=1")
		}
		if m == "STOPPING=1" {
			break
		}
	}
}
