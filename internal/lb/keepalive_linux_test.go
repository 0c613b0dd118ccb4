package lb

import (
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestKeepAliveEverywhere: every socket the balancer proxies on has its TCP
// keepalive (keepAliveIdle, keepAliveInterval, keepAliveCount), also after
// an event loop handed the pair over to goroutines. (net.FileConn, which
// the hand-over uses, turns on Go's own keepalive defaults: 15 s, 15 s, 9
// probes, a dead peer found after two and a half minutes instead of one.)
func TestKeepAliveEverywhere(t *testing.T) {
	be := newBackend(t, "a", false)
	b, _ := startLB(t, Config{}, be)
	c, r := dialTo(t, b, "a")
	// Older than keepAliveAfter, so a loop has set the backend's
	// keepalive itself before the hand-over.
	time.Sleep(keepAliveAfter + 200*time.Millisecond)
	// Bulk both ways: with loops, the pair is handed over.
	bulkEcho(t, b, c, r)
	var conns []net.Conn
	b.mu.Lock()
	for k := range b.clients {
		if nc, ok := k.(net.Conn); ok {
			conns = append(conns, nc)
		}
	}
	for _, bk := range b.pool.m {
		for pc := range bk.conns {
			pc.mu.Lock()
			if pc.server != nil {
				conns = append(conns, pc.server)
			}
			pc.mu.Unlock()
		}
	}
	b.mu.Unlock()
	if len(conns) != 2 {
		t.Fatalf("%d goroutine-path sockets, want the client's and the backend's", len(conns))
	}
	want := [4]int{1, keepAliveIdle, keepAliveInterval, keepAliveCount}
	for _, nc := range conns {
		if got := keepAliveOf(t, nc); got != want {
			t.Errorf("%v -> %v: keepalive (on, idle, interval, count) %v, want %v", nc.LocalAddr(), nc.RemoteAddr(), got, want)
		}
	}
}

func keepAliveOf(t *testing.T, c net.Conn) (v [4]int) {
	t.Helper()
	raw, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var errs [4]error
	_ = raw.Control(func(fd uintptr) {
		v[0], errs[0] = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_KEEPALIVE)
		v[1], errs[1] = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_KEEPIDLE)
		v[2], errs[2] = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_KEEPINTVL)
		v[3], errs[3] = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_KEEPCNT)
	})
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	return v
}
