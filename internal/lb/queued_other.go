//go:build !linux

package lb

import "net"

// queued: the kernel queues are read on Linux only.
func queued(net.Conn, bool) bool { return false }
