package lb

import (
	"context"
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// listen opens a TCP listener; with freeBind it may bind an address this
// host does not have (yet): the VIP on a node that does not hold it.
func listen(addr string, freeBind bool) (net.Listener, error) {
	lc := net.ListenConfig{}
	if freeBind {
		lc.Control = func(network, _ string, c syscall.RawConn) error {
			var serr error
			err := c.Control(func(fd uintptr) {
				if network == "tcp6" {
					serr = unix.SetsockoptInt(int(fd), unix.SOL_IPV6, unix.IPV6_FREEBIND, 1)
					return
				}
				serr = unix.SetsockoptInt(int(fd), unix.SOL_IP, unix.IP_FREEBIND, 1)
			})
			if err != nil {
				return err
			}
			return serr
		}
	}
	return lc.Listen(context.Background(), "tcp", addr)
}
