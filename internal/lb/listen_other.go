//go:build !linux

package lb

import (
	"context"
	"net"
	"syscall"
)

// dialControl: nothing to prepare elsewhere.
var dialControl func(network, address string, c syscall.RawConn) error

// listen opens a TCP listener; free binding needs Linux.
func listen(addr string, _, _, _ bool) (net.Listener, error) {
	return (&net.ListenConfig{}).Listen(context.Background(), "tcp", addr)
}
