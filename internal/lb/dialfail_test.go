package lb

import (
	"net"
	"os"
	"syscall"
	"testing"
	"time"
)

// TestTimeoutAfterAReachIsNotReported: a timed-out attempt to a backend
// that another connection reached since the attempt began is the path's
// loss (a burst of reconnecting clients overflowing a queue), not the
// backend's: it is not reported to passive health checking. A timeout with
// no such connection, and a refused attempt, are. Both data paths record
// the reach (TestMain runs this with event loops, then goroutines).
func TestTimeoutAfterAReachIsNotReported(t *testing.T) {
	be := newBackend(t, "a", false)
	b, _ := startLB(t, Config{}, be)
	before := time.Now()
	if _, _, name := dial(t, b, true); name != "a" {
		t.Fatalf("greeted by %q", name)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	bk := b.pool.m[be.addr()]
	if !bk.reached.After(before) {
		t.Fatalf("a connection reached the backend, yet its last reach is %v (the dial began %v)", bk.reached, before)
	}
	timeout := &net.OpError{Op: "dial", Net: "tcp", Err: os.ErrDeadlineExceeded}
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	if b.dialFailedLocked(bk, before, timeout) {
		t.Error("a timeout begun before a connection reached the backend was reported")
	}
	if !b.dialFailedLocked(bk, bk.reached.Add(time.Millisecond), timeout) {
		t.Error("a timeout begun after the last reach was not reported")
	}
	if !b.dialFailedLocked(bk, before, refused) {
		t.Error("a refused attempt was not reported")
	}
}
