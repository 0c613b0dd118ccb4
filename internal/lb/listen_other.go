//go:build !linux

package lb

import (
	"context"
	"net"
)

// listen opens a TCP listener; free binding needs Linux.
func listen(addr string, _, _ bool) (net.Listener, error) {
	return (&net.ListenConfig{}).Listen(context.Background(), "tcp", addr)
}
