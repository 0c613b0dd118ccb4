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
	// dataFirst: src is known to have data to read at once (a client
	// accepted with TCP_DEFER_ACCEPT), so the first read need not wait
	// for it without a buffer.
	dataFirst bool
	// idle, when not 0, is the idle timeout: every read pushes both
	// directions' read deadlines this far out (see proxyConn.touch).
	idle time.Duration
	pc   *proxyConn

	// For waitReadable, set up once per direction rather than per read:
	// src's raw connection (nil if it has none), the peek callback bound
	// to this copier, its one-byte buffer and the error it saw.
	raw     syscall.RawConn
	ready   func(fd uintptr) bool
	peek    [1]byte
	peekErr error
}

// copy copies src to dst. API server traffic is mostly small requests and
// answers, for which one read(2) and one write(2) beat the two splice(2)
// calls through a pipe that io.Copy would use; bulk transfers (large lists,
// logs, exec streams) are spliced, so their bytes never enter user space.
// The switch happens the first time a read fills the buffer.
//
// Between reads no buffer is held: the copier waits until src is readable
// (waitReadable) and only then takes one from the pool, so a connection
// that sits idle, as most watches do, costs its goroutines and sockets but
// no buffer.
func (c *copier) copy() (int64, error) {
	var total int64
	if sc, ok := c.src.(syscall.Conn); ok {
		if raw, err := sc.SyscallConn(); err == nil {
			c.raw, c.ready = raw, c.peekReady
		}
	}
	first := true
	for {
		if !first || !c.dataFirst {
			if err := c.waitReadable(); err != nil {
				return total, err
			}
		}
		first = false
		bp := bufPool.Get().(*[]byte)
		buffersInUse.Add(1)
		buf := *bp
		n, rerr := c.src.Read(buf)
		if n > 0 {
			c.touch()
			w, werr := c.dst.Write(buf[:n])
			total += int64(w)
			if werr != nil {
				putBuf(bp)
				return total, werr
			}
		}
		putBuf(bp)
		if rerr != nil {
			if rerr == io.EOF {
				return total, nil
			}
			return total, rerr
		}
		if n == len(buf) {
			break
		}
	}
	// Bulk from here on: io.Copy between two *net.TCPConn splices. With an
	// idle timeout every read must push the deadlines, which a splice
	// cannot; that path copies through io.Copy's own buffer instead.
	var n int64
	var err error
	if c.idle > 0 {
		n, err = io.Copy(struct{ io.Writer }{c.dst}, touchReader{c})
	} else {
		n, err = io.Copy(c.dst, c.src)
	}
	return total + n, err
}

func (c *copier) touch() {
	if c.idle > 0 {
		c.pc.touch(c.idle)
	}
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

// waitReadable blocks until src has data or its peer has finished sending
// (then it returns nil, and the read that follows gets the data or EOF), or
// until an error or deadline ends the wait, which it returns. It reads
// nothing: a one-byte MSG_PEEK tells whether a read would block. A socket
// error (a reset) is reported to one call only, and the peek is that call,
// so its error is returned here, not left for the read.
func (c *copier) waitReadable() error {
	if c.raw == nil {
		return nil
	}
	c.peekErr = nil
	if err := c.raw.Read(c.ready); err != nil {
		return err
	}
	return c.peekErr
}

// peekReady is the raw read callback of waitReadable: true once a read
// would not block.
func (c *copier) peekReady(fd uintptr) bool {
	for {
		_, _, e := unix.Recvfrom(int(fd), c.peek[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		switch e {
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return false
		case nil:
			return true
		default:
			c.peekErr = &net.OpError{Op: "read", Net: "tcp", Source: c.src.LocalAddr(), Addr: c.src.RemoteAddr(), Err: os.NewSyscallError("recvfrom", e)}
			return true
		}
	}
}
