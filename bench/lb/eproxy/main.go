//go:build linux

// Command eproxy is a minimal epoll event-loop TCP proxy: one loop per CPU,
// each on its own SO_REUSEPORT listener and locked OS thread, with
// non-blocking connect and read/write through one buffer per loop.
// bench/lb/cpu.sh measures it beside vigil's balancer, miniproxy and
// HAProxy, to tell what the event-loop model gains over goroutines.
//
//	eproxy LISTEN BACKEND...
package main

import (
	"fmt"
	"net/netip"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

type half struct {
	fd      int
	peer    *half
	pending []byte // read from peer, not yet written to fd
	eof     bool   // peer sent FIN, forwarded as shutdown once pending is out
	shut    bool
	conn    *pair
}

type pair struct {
	c, s       half
	connecting bool
	closed     bool
}

type loop struct {
	ep       int
	ln       int
	backends []unix.Sockaddr
	next     int
	byFD     map[int]*half
	buf      []byte
}

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: eproxy LISTEN BACKEND...")
		os.Exit(2)
	}
	la := netip.MustParseAddrPort(os.Args[1])
	var bes []unix.Sockaddr
	for _, a := range os.Args[2:] {
		ap := netip.MustParseAddrPort(a)
		bes = append(bes, &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()})
	}
	n := runtime.GOMAXPROCS(0)
	done := make(chan error)
	for i := range n {
		go func() { done <- run(la, bes, i) }()
	}
	fmt.Fprintln(os.Stderr, <-done)
	os.Exit(1)
}

func run(la netip.AddrPort, bes []unix.Sockaddr, start int) error {
	runtime.LockOSThread()
	ln, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	_ = unix.SetsockoptInt(ln, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
	_ = unix.SetsockoptInt(ln, unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
	_ = unix.SetsockoptInt(ln, unix.IPPROTO_TCP, unix.TCP_DEFER_ACCEPT, 1)
	if err := unix.Bind(ln, &unix.SockaddrInet4{Port: int(la.Port()), Addr: la.Addr().As4()}); err != nil {
		return err
	}
	if err := unix.Listen(ln, 4096); err != nil {
		return err
	}
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return err
	}
	l := &loop{ep: ep, ln: ln, backends: bes, next: start, byFD: map[int]*half{}, buf: make([]byte, 16<<10)}
	if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, ln, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(ln)}); err != nil {
		return err
	}
	evs := make([]unix.EpollEvent, 128)
	for {
		n, err := unix.EpollWait(ep, evs, -1)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		for _, ev := range evs[:n] {
			fd := int(ev.Fd)
			if fd == ln {
				l.accept()
				continue
			}
			h := l.byFD[fd]
			if h == nil || h.conn.closed {
				continue
			}
			l.event(h, ev.Events)
		}
	}
}

func (l *loop) accept() {
	for {
		cfd, _, err := unix.Accept4(l.ln, unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
		if err != nil {
			return
		}
		sfd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			unix.Close(cfd)
			continue
		}
		_ = unix.SetsockoptInt(sfd, unix.IPPROTO_TCP, unix.TCP_QUICKACK, 0)
		l.next++
		err = unix.Connect(sfd, l.backends[l.next%len(l.backends)])
		if err != nil && err != unix.EINPROGRESS {
			unix.Close(cfd)
			unix.Close(sfd)
			continue
		}
		p := &pair{connecting: true}
		p.c = half{fd: cfd, conn: p}
		p.s = half{fd: sfd, conn: p}
		p.c.peer, p.s.peer = &p.s, &p.c
		l.byFD[cfd], l.byFD[sfd] = &p.c, &p.s
		ev := uint32(unix.EPOLLIN | unix.EPOLLOUT | unix.EPOLLRDHUP | unix.EPOLLET)
		_ = unix.EpollCtl(l.ep, unix.EPOLL_CTL_ADD, sfd, &unix.EpollEvent{Events: ev, Fd: int32(sfd)})
		_ = unix.EpollCtl(l.ep, unix.EPOLL_CTL_ADD, cfd, &unix.EpollEvent{Events: ev, Fd: int32(cfd)})
	}
}

func (l *loop) event(h *half, ev uint32) {
	p := h.conn
	if p.connecting {
		if h != &p.s {
			return // the client's bytes wait until the backend is connected
		}
		if ev&(unix.EPOLLOUT|unix.EPOLLERR|unix.EPOLLHUP) == 0 {
			return
		}
		if e, _ := unix.GetsockoptInt(p.s.fd, unix.SOL_SOCKET, unix.SO_ERROR); e != 0 {
			l.close(p)
			return
		}
		p.connecting = false
		l.pump(&p.c) // client -> server
		if !p.closed {
			l.pump(&p.s)
		}
		return
	}
	if ev&unix.EPOLLOUT != 0 {
		l.flush(h)
		if p.closed {
			return
		}
		l.pump(h.peer)
		if p.closed {
			return
		}
	}
	if ev&(unix.EPOLLIN|unix.EPOLLRDHUP|unix.EPOLLHUP|unix.EPOLLERR) != 0 {
		l.pump(h)
	}
}

// pump reads from src and writes to its peer until src would block, the
// peer's socket is full, or src ended.
func (l *loop) pump(src *half) {
	dst := src.peer
	p := src.conn
	for len(dst.pending) == 0 && !dst.eof {
		n, err := unix.Read(src.fd, l.buf)
		if err == unix.EINTR {
			continue
		}
		if err == unix.EAGAIN {
			return
		}
		if err != nil {
			l.close(p)
			return
		}
		if n == 0 {
			dst.eof = true
			l.flush(dst)
			return
		}
		w, err := unix.Write(dst.fd, l.buf[:n])
		if err != nil && err != unix.EAGAIN {
			l.close(p)
			return
		}
		if w < 0 {
			w = 0
		}
		if w < n {
			dst.pending = append(dst.pending[:0], l.buf[w:n]...)
			return
		}
	}
}

// flush writes dst's pending bytes, and forwards a FIN once they are out.
func (l *loop) flush(dst *half) {
	p := dst.conn
	for len(dst.pending) > 0 {
		w, err := unix.Write(dst.fd, dst.pending)
		if err == unix.EAGAIN {
			return
		}
		if err != nil {
			l.close(p)
			return
		}
		dst.pending = dst.pending[w:]
	}
	dst.pending = nil
	if dst.eof && !dst.shut {
		dst.shut = true
		if dst.peer.shut {
			l.close(p)
			return
		}
		_ = unix.Shutdown(dst.fd, unix.SHUT_WR)
	}
}

func (l *loop) close(p *pair) {
	if p.closed {
		return
	}
	p.closed = true
	delete(l.byFD, p.c.fd)
	delete(l.byFD, p.s.fd)
	unix.Close(p.c.fd)
	unix.Close(p.s.fd)
}
