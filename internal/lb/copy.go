package lb

import (
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// smallBuf is the buffer interactive traffic is copied through. A read that
// fills it marks the direction as bulk, which is then spliced.
const smallBuf = 16 << 10

var bufPool = sync.Pool{New: func() any { b := make([]byte, smallBuf); return &b }}

// buffersInUse counts copy buffers taken from the pool and not yet put
// back: what the load balancer's connections hold in user space beyond
// their goroutines. An idle connection holds none.
var buffersInUse atomic.Int64

// copier copies one direction of a proxied connection.
type copier struct {
	dst, src net.Conn
	// idle, when not 0, is the idle timeout: every read pushes both
	// directions' read deadlines this far out (see proxyConn.touch).
	idle time.Duration
	pc   *proxyConn
	// last is when src's last bytes were read (pc.lastUp or pc.lastDown).
	last *atomic.Int64
	// pending are bytes read from src before, to be written first (an
	// event loop's connection handed over); bulk: splice from the start.
	pending []byte
	bulk    bool

	// For read, set up once per direction rather than per read: src's raw
	// connection (nil if it has none), the read callback bound to this
	// copier, and what the callback read.
	raw   syscall.RawConn
	ready func(fd uintptr) bool
	rbuf  *[]byte
	rn    int
	rerr  error
}

// copy copies src to dst. API server traffic is mostly small requests and
// answers, for which one read(2) and one write(2) beat the two splice(2)
// calls through a pipe that io.Copy would use; bulk transfers (large lists,
// logs, exec streams) are spliced, so their bytes never enter user space.
// The switch happens the first time a read fills the buffer.
//
// Between reads no buffer is held: read takes one from the pool only once
// src is readable, so a connection that sits idle, as most watches do,
// costs its goroutines and sockets but no buffer.
func (c *copier) copy() (int64, error) {
	var total int64
	if len(c.pending) > 0 {
		w, err := c.dst.Write(c.pending)
		total += int64(w)
		c.pending = nil
		if err != nil {
			return total, err
		}
	}
	if c.bulk {
		n, err := c.copyBulk()
		return total + n, err
	}
	if sc, ok := c.src.(syscall.Conn); ok {
		if raw, err := sc.SyscallConn(); err == nil {
			c.raw, c.ready = raw, c.readReady
		}
	}
	for {
		bp, n, rerr := c.read()
		if n > 0 {
			c.last.Store(time.Now().UnixNano())
			c.touch()
			w, werr := c.dst.Write((*bp)[:n])
			total += int64(w)
			if werr != nil {
				putBuf(bp)
				return total, werr
			}
		}
		full := bp != nil && n == len(*bp)
		if bp != nil {
			putBuf(bp)
		}
		if rerr != nil {
			if rerr == io.EOF {
				return total, nil
			}
			return total, rerr
		}
		if full {
			break
		}
	}
	n, err := c.copyBulk()
	return total + n, err
}

// copyBulk copies the rest of a bulk direction: io.Copy between two
// *net.TCPConn splices. With an idle timeout every read must push the
// deadlines, which a splice cannot; that path copies through io.Copy's own
// buffer instead.
func (c *copier) copyBulk() (int64, error) {
	var n int64
	var err error
	c.pc.bulk.Add(1)
	defer c.pc.bulk.Add(-1)
	if c.idle > 0 {
		n, err = io.Copy(struct{ io.Writer }{c.dst}, touchReader{c})
	} else {
		n, err = io.Copy(c.dst, c.src)
	}
	return n, err
}

func (c *copier) touch() {
	if c.idle > 0 {
		c.pc.touch(c.idle)
	}
}

func getBuf() *[]byte {
	buffersInUse.Add(1)
	return bufPool.Get().(*[]byte)
}

func putBuf(bp *[]byte) {
	buffersInUse.Add(-1)
	bufPool.Put(bp)
}

// touchReader reads from the copier's src and pushes the idle deadlines.
type touchReader struct{ c *copier }

func (r touchReader) Read(p []byte) (int, error) {
	n, err := r.c.src.Read(p)
	if n > 0 {
		r.c.touch()
	}
	return n, err
}

// read waits until src is readable and reads what is there into a buffer
// from the pool, which the caller puts back (bp is nil when n is 0). The
// buffer is taken only once the socket has data: one read(2) in the raw
// connection's callback both tests readiness and reads, and a read that
// would block gives the buffer back before the goroutine parks. Deadlines
// (idle and half-close timeouts) end the wait as for any read.
func (c *copier) read() (bp *[]byte, n int, err error) {
	if c.raw == nil {
		bp = getBuf()
		n, err = c.src.Read(*bp)
		if n == 0 {
			putBuf(bp)
			bp = nil
		}
		return bp, n, err
	}
	c.rbuf, c.rn, c.rerr = nil, 0, nil
	if err := c.raw.Read(c.ready); err != nil {
		return nil, 0, err
	}
	return c.rbuf, c.rn, c.rerr
}

// readReady is the raw read callback of read: false (wait, and call again)
// while a read would block.
func (c *copier) readReady(fd uintptr) bool {
	bp := getBuf()
	for {
		n, e := unix.Read(int(fd), *bp)
		switch {
		case e == unix.EINTR:
			continue
		case e == unix.EAGAIN:
			putBuf(bp)
			return false
		case e != nil:
			putBuf(bp)
			c.rerr = &net.OpError{Op: "read", Net: "tcp", Source: c.src.LocalAddr(), Addr: c.src.RemoteAddr(), Err: os.NewSyscallError("read", e)}
			return true
		case n == 0:
			putBuf(bp)
			c.rerr = io.EOF
			return true
		default:
			c.rbuf, c.rn = bp, n
			return true
		}
	}
}
