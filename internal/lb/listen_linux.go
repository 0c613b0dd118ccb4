package lb

import (
	"context"
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// listen opens a TCP listener; with freeBind it may bind an address this
// host does not have (yet): the VIP on a node that does not hold it.
//
// TCP keepalive is set once on the listening socket, whose accepted sockets
// inherit it on Linux, instead of by four setsockopt calls on every accepted
// connection: it finds clients that vanished without a FIN (a node that
// lost power while watching) after keepAliveIdle + keepAliveCount *
// keepAliveInterval.
//
// With deferAccept, a connection is handed over only once the client has
// spoken (see Config.ServerSpeaksFirst).
func listen(addr string, freeBind, reusePort, deferAccept bool) (net.Listener, error) {
	lc := net.ListenConfig{KeepAlive: -1}
	lc.Control = func(network, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			set := func(level, opt, v int) {
				if serr == nil {
					serr = unix.SetsockoptInt(int(fd), level, opt, v)
				}
			}
			if freeBind {
				if network == "tcp6" {
					set(unix.SOL_IPV6, unix.IPV6_FREEBIND, 1)
				} else {
					set(unix.SOL_IP, unix.IP_FREEBIND, 1)
					// The VIP's connections may go on sending from
					// it after it is gone: a holder that lost its
					// lease removes the VIP first and resets its
					// clients after, and IPv4 routes no packet from
					// an address that is not local, unless the
					// socket is transparent (accepted sockets
					// inherit it). Without the reset a client
					// waiting for an answer waits for its own
					// timeout. IPv6 sends them as it is. Needs
					// CAP_NET_ADMIN, which a node that holds the VIP
					// has; without it the resets are lost as before.
					_ = unix.SetsockoptInt(int(fd), unix.SOL_IP, unix.IP_TRANSPARENT, 1)
				}
			}
			if reusePort {
				set(unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
			}
			// API server clients speak first (TLS ClientHello), so a
			// connection is handed to vigil only once it has data: one
			// wake-up and one empty read fewer per connection.
			if deferAccept {
				set(unix.IPPROTO_TCP, unix.TCP_DEFER_ACCEPT, 1)
			}
			set(unix.SOL_SOCKET, unix.SO_KEEPALIVE, 1)
			set(unix.IPPROTO_TCP, unix.TCP_KEEPIDLE, keepAliveIdle)
			set(unix.IPPROTO_TCP, unix.TCP_KEEPINTVL, keepAliveInterval)
			set(unix.IPPROTO_TCP, unix.TCP_KEEPCNT, keepAliveCount)
		})
		if err != nil {
			return err
		}
		return serr
	}
	return lc.Listen(context.Background(), "tcp", addr)
}

// dialControl prepares a socket to a backend before it connects: with
// TCP_QUICKACK off, the kernel does not send the handshake's last ACK on
// its own but lets it ride on the first data, which the balancer writes at
// once (it holds the client's first bytes already, see TCP_DEFER_ACCEPT):
// one packet fewer for both sides on every connection, as HAProxy does.
func dialControl(_, _ string, c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_QUICKACK, 0)
	})
	if err != nil {
		return err
	}
	return serr
}
