//go:build !linux

package lb

import "net/netip"

// Event loops need Linux (epoll); elsewhere every connection is served by
// goroutines.

type evloop struct{}

type lpair struct {
	loop     *evloop
	closed   bool
	cfd, sfd int
	src      netip.Addr
}

type loopCmd struct {
	p        *lpair
	resetAll bool
	stop     bool
}

func (*evloop) post(loopCmd) bool    { return false }
func (*evloop) postWait(loopCmd)     {}
func (b *Balancer) startLoops() bool { return false }
func fdQueued(int, bool) bool        { return false }
