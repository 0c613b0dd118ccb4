package lb

import (
	"net"
	"net/netip"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// accept takes every waiting connection from listener i.
func (l *evloop) accept(i int, now time.Time) {
	if i >= len(l.lns) {
		return
	}
	b := l.b
	for {
		fd, sa, err := unix.Accept4(l.lns[i], unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
		if err != nil {
			switch err {
			case unix.EAGAIN:
				l.acceptBackoff = 0
			case unix.EINTR, unix.ECONNABORTED:
				continue
			default:
				// Out of descriptors and the like: try again later (a
				// new connection's edge would also wake us).
				l.acceptBackoff = min(max(2*l.acceptBackoff, 5*time.Millisecond), time.Second)
				l.acceptAt = now.Add(l.acceptBackoff)
				b.log.Warn("accept failed", "err", os.NewSyscallError("accept4", err), "retry_in", l.acceptBackoff)
			}
			return
		}
		l.admit(fd, sockaddrIP(sa), now)
	}
}

// admit applies the limits to a new client connection and starts its
// connection to a backend.
func (l *evloop) admit(fd int, src netip.Addr, now time.Time) {
	b := l.b
	p := &lpair{loop: l, cfd: fd, sfd: -1, src: src}
	p.pc = &proxyConn{lp: p}
	b.mu.Lock()
	limit, ok, evict := b.admitLocked(p, src)
	b.mu.Unlock()
	b.evict(evict)
	if !ok {
		b.refused(limit) // before the reset, as in serve
		resetFD(fd)
		return
	}
	p.cseq = l.nextSeq()
	l.pairs[p] = struct{}{}
	if err := unix.EpollCtl(l.ep, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{
		Events: unix.EPOLLIN | unix.EPOLLRDHUP | unix.EPOLLET, Fd: int32(fd), Pad: p.cseq}); err != nil {
		l.closePair(p, true)
		return
	}
	l.sides[int32(fd)] = side{p: p, seq: p.cseq, client: true}
	l.dial(p, now)
}

func (l *evloop) nextSeq() int32 {
	l.seq++
	if l.seq < evFirstSeq {
		l.seq = evFirstSeq
	}
	return l.seq
}

// dial picks a backend and starts connecting to it, trying others while
// attempts are left; with none left the client is turned away.
func (l *evloop) dial(p *lpair, now time.Time) {
	b := l.b
	for p.attempt < b.cfg.Attempts {
		p.attempt++
		b.mu.Lock()
		be, anyway := b.pool.pick(p.tried)
		b.mu.Unlock()
		if be == nil {
			break
		}
		p.be, p.anyway = be, anyway
		if !be.ip.IsValid() {
			// A host name: the goroutine path resolves and dials it.
			b.mu.Lock()
			b.pool.done(be)
			b.mu.Unlock()
			p.be = nil
			l.handOverClient(p)
			return
		}
		p.dialAt = now
		err := l.connect(p, be.ip)
		if err == nil {
			p.dialGen++
			l.dialQ.push(fifoItem{p: p, at: now.Add(b.cfg.DialTimeout), gen: p.dialGen})
			return
		}
		l.dialFailed(p, err)
	}
	l.reject(p)
}

// connect opens a non-blocking connection to ap and puts it in the loop.
func (l *evloop) connect(p *lpair, ap netip.AddrPort) error {
	var sa unix.Sockaddr
	family := unix.AF_INET
	if ap.Addr().Is4() {
		sa = &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}
	} else {
		family = unix.AF_INET6
		sa = &unix.SockaddrInet6{Port: int(ap.Port()), Addr: ap.Addr().As16()}
	}
	fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return os.NewSyscallError("socket", err)
	}
	// See dialControl: the handshake's last ACK rides on the request,
	// unless the backend may be waiting for it to speak first.
	if !l.b.cfg.ServerSpeaksFirst {
		_ = unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_QUICKACK, 0)
	}
	_ = unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
	if err := unix.Connect(fd, sa); err != nil && err != unix.EINPROGRESS && err != unix.EINTR {
		unix.Close(fd)
		return os.NewSyscallError("connect", err)
	}
	p.sfd = fd
	p.sseq = l.nextSeq()
	if err := unix.EpollCtl(l.ep, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{
		Events: unix.EPOLLIN | unix.EPOLLOUT | unix.EPOLLRDHUP | unix.EPOLLET, Fd: int32(fd), Pad: p.sseq}); err != nil {
		unix.Close(fd)
		p.sfd = -1
		return os.NewSyscallError("epoll_ctl", err)
	}
	l.sides[int32(fd)] = side{p: p, seq: p.sseq}
	return nil
}

// dialFailed ends a failed attempt to reach p.be: counted, reported to
// passive health checking, and the backend released.
func (l *evloop) dialFailed(p *lpair, err error) {
	b := l.b
	if p.sfd >= 0 {
		delete(l.sides, int32(p.sfd))
		unix.Close(p.sfd)
		p.sfd = -1
	}
	be := p.be
	p.be = nil
	if p.tried == nil {
		p.tried = map[string]bool{}
	}
	p.tried[be.addr] = true
	err = &net.OpError{Op: "dial", Net: "tcp", Addr: net.TCPAddrFromAddrPort(be.ip), Err: err}
	b.mu.Lock()
	b.pool.done(be)
	report := b.dialFailedLocked(be, p.dialAt, err)
	b.mu.Unlock()
	if report {
		// Not on the loop's thread: what health checking does with it
		// may reach back into the balancer.
		go b.cfg.OnDialError(be.addr, err)
	}
}

// reject turns the client away: no backend took it.
func (l *evloop) reject(p *lpair) {
	l.b.noBackend(p.src.String())
	l.closePair(p, true)
}

// event handles readiness of one side of a pair.
func (l *evloop) event(s side, events uint32, now time.Time) {
	p := s.p
	if !s.client && !p.conn {
		l.connected(p, now)
		return
	}
	if !p.conn {
		return // the client's data waits until the backend answers
	}
	rdhup := events&(unix.EPOLLRDHUP|unix.EPOLLHUP|unix.EPOLLERR) != 0
	l.forward(p, s.client, rdhup, now)
}

// connected finishes a connection attempt whose socket became writable
// (or failed).
func (l *evloop) connected(p *lpair, now time.Time) {
	b := l.b
	soerr, err := unix.GetsockoptInt(p.sfd, unix.SOL_SOCKET, unix.SO_ERROR)
	switch {
	case err != nil:
		l.dialFailed(p, os.NewSyscallError("getsockopt", err))
		l.dial(p, now)
		return
	case soerr == int(unix.EINPROGRESS) || soerr == int(unix.EALREADY):
		return
	case soerr != 0:
		l.dialFailed(p, os.NewSyscallError("connect", unix.Errno(soerr)))
		l.dial(p, now)
		return
	}
	be := p.be
	b.mu.Lock()
	be.reached = now
	if !b.stillWantedLocked(p, be, p.anyway) {
		b.mu.Unlock()
		l.closePair(p, false)
		return
	}
	be.conns[p.pc] = struct{}{}
	p.conn = true
	be.m.active.Inc()
	be.m.accepted.Inc()
	b.mu.Unlock()
	l.ageQ.push(fifoItem{p: p, at: now.Add(keepAliveAfter)})
	// The client spoke first (TCP_DEFER_ACCEPT): its bytes are waiting,
	// and their edge was seen while connecting. Read until empty. So may
	// the backend's (a banner, with Config.ServerSpeaksFirst, or an
	// immediate close): their edge came with this one, and the
	// edge-triggered loop would not report them again.
	l.forward(p, true, true, now)
	if !p.closed && !p.gone && p.sfd >= 0 {
		l.forward(p, false, true, now)
	}
}

// forward copies what src has to dst: up is client to backend. With
// drain, it reads until the socket is empty; otherwise a short read is
// taken to mean empty, as the edge-triggered epoll reports new bytes
// again.
func (l *evloop) forward(p *lpair, up, drain bool, now time.Time) {
	src, dst := p.sfd, p.cfd
	if up {
		src, dst = p.cfd, p.sfd
	}
	if (up && p.upDone) || (!up && p.downDone) {
		return
	}
	for {
		n, err := unix.Read(src, l.buf)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			return
		case err != nil:
			l.closePair(p, false) // reset by the peer: end the pair
			return
		case n == 0:
			l.finish(p, up, now)
			return
		}
		if up {
			p.up += int64(n)
			p.pc.lastUp.Store(now.UnixNano())
		} else {
			p.down += int64(n)
			p.pc.lastDown.Store(now.UnixNano())
		}
		w, err := writeAll(dst, l.buf[:n])
		if err == unix.EAGAIN {
			// The reader is slower than the writer: the goroutine path
			// waits for it, holding what is left.
			l.handOver(p, l.buf[w:n], up, false)
			return
		}
		if err != nil {
			l.closePair(p, false)
			return
		}
		if n == len(l.buf) {
			l.handOver(p, nil, up, true) // bulk: spliced from here on
			return
		}
		if !drain {
			return
		}
	}
}

// writeAll writes b to fd until done or the socket is full (EAGAIN).
func writeAll(fd int, b []byte) (int, error) {
	w := 0
	for w < len(b) {
		n, err := unix.Write(fd, b[w:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return w, err
		}
		w += n
	}
	return w, nil
}

// finish passes on the end of one direction: a FIN from src becomes a
// shutdown of dst's writing; with both ends finished the pair closes,
// otherwise the other side has HalfCloseTimeout to finish too.
func (l *evloop) finish(p *lpair, up bool, now time.Time) {
	if up {
		p.upDone = true
	} else {
		p.downDone = true
	}
	if p.upDone && p.downDone {
		l.closePair(p, false)
		return
	}
	dst := p.cfd
	if up {
		dst = p.sfd
	}
	if err := unix.Shutdown(dst, unix.SHUT_WR); err != nil {
		l.closePair(p, false)
		return
	}
	p.halfAt = now.Add(l.b.cfg.HalfCloseTimeout)
	if l.b.cfg.HalfCloseTimeout <= keepAliveAfter {
		l.halfQ.push(fifoItem{p: p, at: p.halfAt})
	} else {
		l.halfSoonQ.push(fifoItem{p: p, at: now.Add(keepAliveAfter)})
	}
}

// expire acts on the deadlines due at now.
func (l *evloop) expire(now time.Time) {
	for it, ok := l.dialQ.due(now); ok; it, ok = l.dialQ.due(now) {
		if p := it.p; !p.closed && !p.gone && !p.conn && p.dialGen == it.gen && p.sfd >= 0 {
			if established(p.sfd) {
				// The backend answered in time; this loop, busy with a
				// storm of events, has not read that one yet. Failing it
				// would count a healthy backend as silent.
				l.connected(p, now)
				continue
			}
			l.dialFailed(p, os.ErrDeadlineExceeded)
			l.dial(p, now)
		}
	}
	for it, ok := l.halfSoonQ.due(now); ok; it, ok = l.halfSoonQ.due(now) {
		if p := it.p; !p.closed && !p.gone {
			l.halfQ.push(fifoItem{p: p, at: p.halfAt})
		}
	}
	for it, ok := l.halfQ.due(now); ok; it, ok = l.halfQ.due(now) {
		if p := it.p; !p.closed && !p.gone {
			l.b.m.closed.WithLabelValues("timeout").Inc()
			l.closePair(p, false)
		}
	}
	for it, ok := l.ageQ.due(now); ok; it, ok = l.ageQ.due(now) {
		if p := it.p; !p.closed && !p.gone && !p.kaSet {
			setKeepAlive(p.sfd)
			p.kaSet = true
		}
	}
	if !l.acceptAt.IsZero() && !l.acceptAt.After(now) {
		l.acceptAt = time.Time{}
		for i := range l.lns {
			l.accept(i, now)
		}
	}
}

// setKeepAlive turns on TCP keepalive as the dialer of the goroutine path
// does.
func setKeepAlive(fd int) {
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_KEEPALIVE, 1)
	_ = unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_KEEPIDLE, keepAliveIdle)
	_ = unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_KEEPINTVL, keepAliveInterval)
	_ = unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_KEEPCNT, keepAliveCount)
}

// closePair ends p: its descriptors closed (the client's with an RST when
// reset), its backend and client slots released.
func (l *evloop) closePair(p *lpair, reset bool) {
	if p.closed || p.gone {
		return
	}
	pc := p.pc
	pc.mu.Lock()
	p.closed = true
	pc.mu.Unlock()
	l.dropFDs(p)
	if p.cfd >= 0 {
		if reset {
			resetFD(p.cfd)
		} else {
			unix.Close(p.cfd)
		}
	}
	if p.sfd >= 0 {
		unix.Close(p.sfd)
	}
	l.release(p)
}

// dropFDs forgets p's descriptors (the caller closes them, which also
// takes them out of the epoll set, or hands them over after removing them).
func (l *evloop) dropFDs(p *lpair) {
	delete(l.pairs, p)
	if p.cfd >= 0 {
		delete(l.sides, int32(p.cfd))
	}
	if p.sfd >= 0 {
		delete(l.sides, int32(p.sfd))
	}
}

// release gives back what p held in the balancer.
func (l *evloop) release(p *lpair) {
	b := l.b
	b.mu.Lock()
	if be := p.be; be != nil {
		if p.conn {
			delete(be.conns, p.pc)
			be.m.active.Dec()
		}
		b.pool.done(be)
	}
	b.releaseLocked(p, p.src)
	b.mu.Unlock()
	if p.up > 0 {
		b.m.toBackend.Add(float64(p.up))
	}
	if p.down > 0 {
		b.m.toClient.Add(float64(p.down))
	}
}

// established reports whether the TCP socket fd has finished connecting
// (TCP_ESTABLISHED, include/net/tcp_states.h).
func established(fd int) bool {
	const tcpEstablished = 1
	info, err := unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO)
	return err == nil && info.State == tcpEstablished
}
