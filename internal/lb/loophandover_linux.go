package lb

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// handOver moves an established pair to the goroutine path: pending are
// bytes read from the up (or down) direction's source and not yet
// written; bulk starts that direction spliced.
func (l *evloop) handOver(p *lpair, pending []byte, up, bulk bool) {
	b := l.b
	for _, fd := range []int{p.cfd, p.sfd} {
		_ = unix.EpollCtl(l.ep, unix.EPOLL_CTL_DEL, fd, nil)
	}
	l.dropFDs(p)
	client, cerr := fdConn(p.cfd)
	server, serr := fdConn(p.sfd)
	if cerr != nil || serr != nil {
		if client != nil {
			client.Close()
		}
		if server != nil {
			server.Close()
		}
		b.log.Warn("could not hand a connection over; closing it", "err", errors.Join(cerr, serr))
		pc := p.pc
		pc.mu.Lock()
		p.closed = true
		pc.mu.Unlock()
		p.cfd, p.sfd = -1, -1
		l.release(p)
		return
	}
	st := resume{upDone: p.upDone, downDone: p.downDone, halfCloseAt: p.halfAt, bulkUp: up && bulk, bulkDown: !up && bulk}
	if len(pending) > 0 {
		buf := append([]byte(nil), pending...)
		if up {
			st.pendingUp = buf
		} else {
			st.pendingDown = buf
		}
	}
	pc := p.pc
	b.mu.Lock()
	ok := b.adoptLocked(p, client)
	b.mu.Unlock()
	if !ok {
		// Stopped serving meanwhile: as closePair with a reset.
		pc.mu.Lock()
		p.closed = true
		pc.mu.Unlock()
		reset(client)
		server.Close()
		p.cfd, p.sfd = -1, -1
		l.release(p)
		return
	}
	pc.mu.Lock()
	pc.client, pc.server, pc.lp = client, server, nil
	p.gone = true
	pc.mu.Unlock()
	if p.up > 0 {
		b.m.toBackend.Add(float64(p.up))
	}
	if p.down > 0 {
		b.m.toClient.Add(float64(p.down))
	}
	b.handovers.Add(1)
	go func() {
		defer b.wg.Done()
		b.pump(p.be, pc, st)
		b.mu.Lock()
		b.releaseLocked(client, p.src)
		b.mu.Unlock()
	}()
}

// handOverClient gives a client connection, before any backend, to the
// goroutine path (serve).
func (l *evloop) handOverClient(p *lpair) {
	b := l.b
	_ = unix.EpollCtl(l.ep, unix.EPOLL_CTL_DEL, p.cfd, nil)
	l.dropFDs(p)
	client, err := fdConn(p.cfd)
	p.cfd = -1
	pc := p.pc
	pc.mu.Lock()
	p.closed = true
	pc.mu.Unlock()
	if err != nil {
		b.log.Warn("could not hand a connection over; closing it", "err", err)
		l.release(p)
		return
	}
	b.mu.Lock()
	ok := b.adoptLocked(p, client)
	if !ok {
		b.releaseLocked(p, p.src)
	}
	b.mu.Unlock()
	if !ok {
		reset(client)
		return
	}
	go func() {
		defer b.wg.Done()
		b.serve(b.runCtx, client)
		b.mu.Lock()
		b.releaseLocked(client, p.src)
		b.mu.Unlock()
	}()
}

// fdConn turns a loop's descriptor into a net.Conn; the descriptor itself
// is closed (net.FileConn works on a duplicate). net.FileConn turns on Go's
// default TCP keepalive (15 s idle, 15 s apart, 9 probes), so the
// balancer's is set again.
func fdConn(fd int) (net.Conn, error) {
	f := os.NewFile(uintptr(fd), "")
	defer f.Close()
	c, err := net.FileConn(f)
	if err != nil {
		return nil, err
	}
	setKeepAliveConn(c)
	return c, nil
}

func setKeepAliveConn(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetKeepAliveConfig(net.KeepAliveConfig{Enable: true, Idle: keepAliveIdle * time.Second,
			Interval: keepAliveInterval * time.Second, Count: keepAliveCount})
	}
}

// resetFD closes fd with an RST (see reset).
func resetFD(fd int) {
	_ = unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 0})
	unix.Close(fd)
}

// sockaddrIP is sa's IP address, IPv4-mapped IPv6 unmapped.
func sockaddrIP(sa unix.Sockaddr) netip.Addr {
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrFrom4(a.Addr)
	case *unix.SockaddrInet6:
		return netip.AddrFrom16(a.Addr).Unmap()
	}
	return netip.Addr{}
}

// fdQueued is queued for a loop's descriptor.
func fdQueued(fd int, sent bool) bool {
	if in, err := unix.IoctlGetInt(fd, unix.SIOCINQ); err == nil && in > 0 {
		return true
	}
	if sent {
		out, err := unix.IoctlGetInt(fd, unix.SIOCOUTQ)
		return err == nil && out > 0
	}
	return false
}

// adoptLocked moves pair p's admission to client, the connection a
// goroutine serves from now on, and counts the goroutine; false when the
// balancer stopped serving or evicted p meanwhile (the caller closes it).
func (b *Balancer) adoptLocked(p *lpair, client net.Conn) bool {
	a, admitted := b.clients[p]
	if b.closed || !b.serving || !admitted {
		return false
	}
	delete(b.clients, p)
	b.clients[client] = a
	b.wg.Add(1)
	return true
}
