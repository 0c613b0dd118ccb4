package lb

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The event-loop data path.
//
// A proxied connection served by goroutines costs two goroutines, Go's
// bookkeeping of two sockets, and threads handing goroutines to each other
// on every event: about 5 context switches per short connection against
// HAProxy's 3 (docs/lb.md, "Where a new connection's time goes"). The
// loops serve connections the way HAProxy does instead: each loop is one
// goroutine waiting in its own epoll set (edge-triggered) on raw
// descriptors, accepting, connecting without blocking, and copying small
// reads through one buffer per loop.
//
// A loop keeps a connection for its whole life unless it turns into
// something the goroutine path does better: a read that fills the buffer
// (bulk: the goroutine path splices it, so its bytes never enter user
// space) or a write that would block (a slow reader: the goroutine path
// waits on it). Such a connection is handed over: its descriptors leave the
// loop's epoll and become net.Conns, and the goroutine path carries on
// from the same state. A backend named by host name instead of an IP
// address is dialled by the goroutine path too.
//
// Everything else behaves as on the goroutine path: the same limits, the
// same picker and retries, the same passive health checking, half-close
// timeout, TCP keepalive towards backends, and the same ways of closing
// connections from outside (dead backend, drain, VIP moved), which reach a
// loop as commands through an eventfd.

// loopBuf is a loop's copy buffer; a read that fills it hands the
// connection over to be spliced.
const loopBuf = smallBuf

// keepAliveAfter: a loop connection to a backend that lives this long gets
// TCP keepalive. Short connections, most of those a loop serves, end
// before and save the four setsockopt calls.
const keepAliveAfter = time.Second

// yieldEvery: a busy loop lets the process's other goroutines run at
// least this often.
const yieldEvery = time.Millisecond

// Event kinds in the upper half of an epoll event's data.
const (
	evWake     int32 = 0 // the loop's eventfd
	evListener int32 = 1 // a listener; Fd is the index in lns
	evFirstSeq int32 = 2 // a connection's side: its sequence number
)

// evloop is one event loop.
type evloop struct {
	b      *Balancer
	ep     int
	wake   int   // eventfd
	lns    []int // duplicates of the balancer's listeners
	buf    []byte
	events []unix.EpollEvent
	sides  map[int32]side // by descriptor
	pairs  map[*lpair]struct{}
	seq    int32

	// Deadlines: connection attempts (DialTimeout), keepalive for
	// connections that live (keepAliveAfter), half-closed connections
	// (first after keepAliveAfter, then, still half-closed, at their
	// HalfCloseTimeout: most finish closing within milliseconds, and a
	// queue holding each for the full timeout would hold every closed
	// pair for a minute).
	dialQ, ageQ, halfSoonQ, halfQ fifo
	acceptAt                      time.Time // retry accepting after an error (zero: no retry due)
	acceptBackoff                 time.Duration

	mu      sync.Mutex // guards cmds and woken
	cmds    []loopCmd
	woken   bool
	exited  chan struct{}
	stopped bool // a stop command was processed
}

// side is one descriptor of a pair.
type side struct {
	p      *lpair
	seq    int32
	client bool
}

// lpair is one client connection and its backend connection, while a loop
// owns them.
type lpair struct {
	loop     *evloop
	pc       *proxyConn
	cfd, sfd int // -1 when not open
	cseq     int32
	sseq     int32
	src      netip.Addr
	be       *backend // picked backend; counted in its active until released
	anyway   bool
	attempt  int
	dialGen  int
	tried    map[string]bool
	conn     bool // connected and registered in be.conns
	upDone   bool // the client finished sending (FIN passed on)
	downDone bool
	halfAt   time.Time
	kaSet    bool
	closed   bool // under pc.mu: the descriptors are (being) closed
	gone     bool // handed over to the goroutine path
	up, down int64
}

// loopCmd asks a loop to close one pair, reset every client (resetAll),
// or stop; ack is closed when done (for a stop, postWait waits for the
// loop to exit instead).
type loopCmd struct {
	p        *lpair
	resetAll bool
	stop     bool
	ack      chan struct{}
}

// fifo is a queue of deadlines that arrive in order: every entry of one
// queue has the same delay, so the earliest is always at the head.
type fifo struct {
	items []fifoItem
	head  int
}

type fifoItem struct {
	p   *lpair
	at  time.Time
	gen int
}

func (q *fifo) push(it fifoItem) { q.items = append(q.items, it) }

func (q *fifo) peek() (fifoItem, bool) {
	if q.head == len(q.items) {
		return fifoItem{}, false
	}
	return q.items[q.head], true
}

// due pops and returns the head if it is due at now.
func (q *fifo) due(now time.Time) (fifoItem, bool) {
	it, ok := q.peek()
	if !ok || it.at.After(now) {
		return fifoItem{}, false
	}
	q.pop()
	return it, true
}

func (q *fifo) pop() {
	q.items[q.head] = fifoItem{}
	q.head++
	if q.head == len(q.items) {
		q.items, q.head = q.items[:0], 0
	} else if q.head > 1024 && q.head > len(q.items)/2 {
		n := copy(q.items, q.items[q.head:])
		q.items, q.head = q.items[:n], 0
	}
}

// loopsFor is how many loops a balancer runs: cfg.Loops, or one per CPU
// the process may use, at most four: a control plane's connection rate
// needs no more, and a loop waiting in epoll holds an OS thread.
func loopsFor(cfg Config) int {
	if cfg.Loops != 0 {
		return cfg.Loops
	}
	return min(runtime.GOMAXPROCS(0), 4)
}

// startLoops starts the event loops; false when this balancer uses the
// goroutine path (see Config.Loops), or when a loop could not be set up.
func (b *Balancer) startLoops() bool {
	n := loopsFor(b.cfg)
	if n < 1 || b.cfg.IdleTimeout > 0 || b.cfg.customDial {
		return false
	}
	var loops []*evloop
	for range n {
		l, err := b.newLoop()
		if err != nil {
			b.log.Warn("event loop unavailable; serving connections with goroutines", "err", err)
			for _, l := range loops {
				l.closeFDs()
			}
			return false
		}
		loops = append(loops, l)
	}
	// The loops accept on their duplicates. The originals would stay in
	// Go's own poller, which would then wake a thread for every new
	// connection for nothing: closed. (Addr still answers.)
	for _, ln := range append([]net.Listener{b.ln}, b.also...) {
		ln.Close()
	}
	b.mu.Lock()
	b.loops = loops
	b.mu.Unlock()
	for _, l := range loops {
		go l.run()
	}
	return true
}

func (b *Balancer) newLoop() (*evloop, error) {
	l := &evloop{b: b, ep: -1, wake: -1, buf: make([]byte, loopBuf), events: make([]unix.EpollEvent, 128),
		sides: map[int32]side{}, pairs: map[*lpair]struct{}{}, seq: evFirstSeq, exited: make(chan struct{})}
	var err error
	if l.ep, err = unix.EpollCreate1(unix.EPOLL_CLOEXEC); err != nil {
		return nil, os.NewSyscallError("epoll_create1", err)
	}
	if l.wake, err = unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC); err != nil {
		l.closeFDs()
		return nil, os.NewSyscallError("eventfd", err)
	}
	if err := unix.EpollCtl(l.ep, unix.EPOLL_CTL_ADD, l.wake, &unix.EpollEvent{Events: unix.EPOLLIN, Pad: evWake}); err != nil {
		l.closeFDs()
		return nil, os.NewSyscallError("epoll_ctl", err)
	}
	for i, ln := range append([]net.Listener{b.ln}, b.also...) {
		fd, err := dupListener(ln)
		if err == nil {
			l.lns = append(l.lns, fd)
			// Edge-triggered and exclusive: a new connection wakes one
			// loop, which accepts until the queue is empty.
			err = unix.EpollCtl(l.ep, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{
				Events: unix.EPOLLIN | unix.EPOLLET | unix.EPOLLEXCLUSIVE, Fd: int32(i), Pad: evListener})
		}
		if err != nil {
			l.closeFDs()
			return nil, err
		}
	}
	return l, nil
}

// dupListener duplicates ln's descriptor for a loop: the loop accepts on
// it and closes it when it stops.
func dupListener(ln net.Listener) (int, error) {
	tl, ok := ln.(*net.TCPListener)
	if !ok {
		return -1, errors.New("not a TCP listener")
	}
	raw, err := tl.SyscallConn()
	if err != nil {
		return -1, err
	}
	fd, derr := -1, error(nil)
	if err := raw.Control(func(f uintptr) { fd, derr = unix.FcntlInt(f, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
		return -1, err
	}
	if derr != nil {
		return -1, os.NewSyscallError("fcntl", derr)
	}
	return fd, nil
}

func (l *evloop) closeFDs() {
	for _, fd := range l.lns {
		unix.Close(fd)
	}
	l.lns = nil
	if l.wake >= 0 {
		unix.Close(l.wake)
	}
	if l.ep >= 0 {
		unix.Close(l.ep)
	}
}

// post hands cmd to the loop; false if the loop has exited.
func (l *evloop) post(cmd loopCmd) bool {
	l.mu.Lock()
	if l.stopped {
		l.mu.Unlock()
		return false
	}
	l.cmds = append(l.cmds, cmd)
	wake := !l.woken
	l.woken = true
	l.mu.Unlock()
	if wake {
		var one = [8]byte{1}
		_, _ = unix.Write(l.wake, one[:])
	}
	return true
}

// postWait posts cmd and waits until the loop has carried it out (or has
// exited, which closes everything it owned).
func (l *evloop) postWait(cmd loopCmd) {
	cmd.ack = make(chan struct{})
	if !l.post(cmd) {
		<-l.exited
		return
	}
	select {
	case <-cmd.ack:
	case <-l.exited:
	}
}

func (l *evloop) run() {
	defer close(l.exited)
	defer l.closeFDs()
	yielded := time.Now()
	for {
		n := l.wait()
		now := time.Now()
		if now.Sub(yielded) > yieldEvery {
			// A loop that always finds events never blocks, and would
			// keep its P from the rest of the process (health checks,
			// the election's renewals) until the scheduler preempts it.
			runtime.Gosched()
			yielded = now
		}
		for i := range n {
			ev := l.events[i]
			switch ev.Pad {
			case evWake:
				if l.commands() {
					return
				}
			case evListener:
				l.accept(int(ev.Fd), now)
			default:
				s, ok := l.sides[ev.Fd]
				if !ok || s.seq != ev.Pad || s.p.closed || s.p.gone {
					continue // closed earlier in this batch
				}
				l.event(s, ev.Events, now)
			}
		}
		l.expire(time.Now())
	}
}

// wait returns how many events are ready. It first looks without blocking
// and without telling the scheduler (a raw system call): under load there
// usually are events, and the thread keeps its P instead of handing it
// off as a blocking system call does, which would wake another thread.
func (l *evloop) wait() int {
	for {
		n, _, e := unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, uintptr(l.ep), uintptr(unsafe.Pointer(&l.events[0])), uintptr(len(l.events)), 0, 0, 0)
		if e == 0 && n > 0 {
			return int(n)
		}
		k, err := unix.EpollWait(l.ep, l.events, l.timeout())
		if err == nil {
			return k
		}
		if err != unix.EINTR {
			l.b.log.Error("epoll_wait failed", "err", err)
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// timeout is the epoll wait in milliseconds until the earliest deadline.
func (l *evloop) timeout() int {
	var next time.Time
	for _, q := range []*fifo{&l.dialQ, &l.ageQ, &l.halfSoonQ, &l.halfQ} {
		if it, ok := q.peek(); ok && (next.IsZero() || it.at.Before(next)) {
			next = it.at
		}
	}
	if !l.acceptAt.IsZero() && (next.IsZero() || l.acceptAt.Before(next)) {
		next = l.acceptAt
	}
	if next.IsZero() {
		return -1
	}
	d := time.Until(next)
	if d <= 0 {
		return 0
	}
	return int((d + time.Millisecond - 1) / time.Millisecond)
}

// commands carries out posted commands; true when the loop is to exit.
func (l *evloop) commands() bool {
	var buf [8]byte
	_, _ = unix.Read(l.wake, buf[:])
	l.mu.Lock()
	cmds := l.cmds
	l.cmds, l.woken = nil, false
	l.mu.Unlock()
	stop := false
	for _, c := range cmds {
		switch {
		case c.stop:
			stop = true
		case c.resetAll:
			for p := range l.pairs {
				l.closePair(p, true)
			}
		case c.p != nil:
			if c.p.gone {
				c.p.pc.close() // the goroutine path has it now
			} else {
				l.closePair(c.p, false)
			}
		}
		if c.ack != nil && !c.stop {
			close(c.ack)
		}
	}
	if stop {
		l.mu.Lock()
		l.stopped = true
		l.mu.Unlock()
		for p := range l.pairs {
			l.closePair(p, false)
		}
		// A stop is acknowledged by the loop's exit, once run has closed
		// the listeners too: until then the kernel would still complete
		// connections to them.
	}
	return stop
}

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
	b.mu.Lock()
	b.pool.done(be)
	b.mu.Unlock()
	b.m.dialErrors.WithLabelValues(be.addr).Inc()
	err = &net.OpError{Op: "dial", Net: "tcp", Addr: net.TCPAddrFromAddrPort(be.ip), Err: err}
	b.log.Debug("backend refused a connection; trying another", "backend", be.addr, "err", err)
	if b.cfg.OnDialError != nil {
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
	a, admitted := b.clients[p] // not when evicted meanwhile
	ok := !b.closed && b.serving && admitted
	if ok {
		delete(b.clients, p)
		b.clients[client] = a
		b.wg.Add(1)
	}
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
	a, admitted := b.clients[p] // not when evicted meanwhile
	ok := !b.closed && b.serving && admitted
	if ok {
		delete(b.clients, p)
		b.clients[client] = a
		b.wg.Add(1)
	} else {
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
