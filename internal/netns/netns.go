// Package netns runs code inside a named network namespace (as created by
// `ip netns add`). Sockets opened inside belong to that namespace for their
// whole life, whichever goroutine or thread uses them afterwards; that is how
// the lab and the tests talk to hosts in namespaces without adding anything
// to the root namespace.
package netns

import (
	"context"
	"fmt"
	"net"
	"runtime"

	"github.com/vishvananda/netns"
)

// Do runs fn on an OS thread switched into namespace name, then switches
// back. fn must not start goroutines that expect to be in the namespace: only
// the calling thread is.
func Do(name string, fn func() error) error {
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("current netns: %w", err)
	}
	defer orig.Close()
	target, err := netns.GetFromName(name)
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("open netns %s: %w", name, err)
	}
	defer target.Close()
	if err := netns.Set(target); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("enter netns %s: %w", name, err)
	}
	ferr := fn()
	if err := netns.Set(orig); err != nil {
		// Stay locked: the runtime then retires this thread instead of
		// reusing one stuck in the wrong namespace.
		return fmt.Errorf("leave netns %s: %w", name, err)
	}
	runtime.UnlockOSThread()
	return ferr
}

// Dialer returns a gRPC-style dialer whose TCP connections start in
// namespace name.
func Dialer(name string) func(ctx context.Context, addr string) (net.Conn, error) {
	return func(ctx context.Context, addr string) (net.Conn, error) {
		var c net.Conn
		err := Do(name, func() error {
			var d net.Dialer
			var err error
			c, err = d.DialContext(ctx, "tcp", addr)
			return err
		})
		return c, err
	}
}

// ListenUDP opens a UDP socket in namespace name.
func ListenUDP(name string, laddr *net.UDPAddr) (*net.UDPConn, error) {
	var c *net.UDPConn
	err := Do(name, func() error {
		var err error
		c, err = net.ListenUDP("udp", laddr)
		return err
	})
	return c, err
}
