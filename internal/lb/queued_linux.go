package lb

import (
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// queued tells whether c holds bytes in its kernel queues: received and
// not yet read (SIOCINQ), or, with sent, sent and not yet acknowledged
// (SIOCOUTQ). A request that reached the socket before the balancer read
// it shows only here. Unacknowledged bytes count only towards a backend:
// a client delays its acknowledgement of an answer it has long received
// (up to 40 ms on Linux) when it has nothing to send.
func queued(c net.Conn, sent bool) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	q := false
	_ = raw.Control(func(fd uintptr) {
		if in, err := unix.IoctlGetInt(int(fd), unix.SIOCINQ); err == nil && in > 0 {
			q = true
			return
		}
		if sent {
			out, err := unix.IoctlGetInt(int(fd), unix.SIOCOUTQ)
			q = err == nil && out > 0
		}
	})
	return q
}
