package lb

import (
	"fmt"
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vigil-ha/vigil/internal/health"
	"github.com/vigil-ha/vigil/internal/nstest"
	"github.com/vigil-ha/vigil/internal/testkit"
)

// silentBackend listens but never accepts, with its accept queue full, so
// the kernel drops further SYNs: a connection attempt gets no answer, as to
// a powered-off machine.
func silentBackend(t *testing.T) string {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", sa.(*unix.SockaddrInet4).Port)
	for range 3 { // fill the queue; these are never accepted
		if c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond); err == nil {
			t.Cleanup(func() { c.Close() })
		}
	}
	if c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond); err == nil {
		c.Close()
		nstest.Unavailable(t, "a full accept queue still answers SYNs here")
	}
	return addr
}

// TestSilentBackendTimesOutAndIsRetried: a connection attempt that gets
// no answer is given up after DialTimeout, reported (passive health
// checking), and the client is served by another backend.
func TestSilentBackendTimesOutAndIsRetried(t *testing.T) {
	good := newBackend(t, "a", false)
	silent := silentBackend(t)
	b, errs := startLB(t, Config{DialTimeout: 300 * time.Millisecond, Picker: RoundRobin()}, good)
	b.SetBackends([]string{silent, good.addr()})
	b.Update(health.Status{Backend: silent, State: health.Up})
	b.Update(health.Status{Backend: good.addr(), State: health.Up})
	slow := 0
	for range 4 {
		start := time.Now()
		_, _, name := dial(t, b, true)
		if name != "a" {
			t.Fatalf("greeted by %q, want a", name)
		}
		if time.Since(start) >= 300*time.Millisecond {
			slow++
		}
	}
	testkit.WaitFor(t, 2*time.Second, "a failed attempt reported for the silent backend", func() bool { return errs.count(silent) > 0 })
	if slow == 0 {
		t.Fatalf("%d connections waited for the dial timeout, %d failed attempts reported for the silent backend; want both above 0", slow, errs.count(silent))
	}
}
