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
	dialAt   time.Time // when the current attempt began
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
