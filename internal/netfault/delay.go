// Package netfault makes networks gray on purpose, with what this kernel
// has: a TCP proxy that delays what a service answers (there is no netem,
// and nftables' queue verdict has no module here), and nftables rules that
// drop a share of packets or one direction of a path. The lab puts the
// proxy in front of every etcd member's client port and has the members
// advertise it, so every client of etcd goes through it; tests put it in
// front of an embedded etcd.
package netfault

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"time"
)

// MaxDelay bounds a delay or a jitter: more is a typo, not a fault.
const MaxDelay = time.Minute

// Delay says how late the proxy hands on what the service answers.
type Delay struct {
	// Latency is added to every answer.
	Latency time.Duration `json:"latency"`
	// Jitter adds a further uniform 0..Jitter to each chunk. Bytes keep
	// their order: a chunk never overtakes the one before it.
	Jitter time.Duration `json:"jitter"`
	// From, when not empty, limits the delay to connections from these
	// client addresses (a per-path delay); others pass at once.
	From []netip.Addr `json:"from,omitempty"`
}

// Validate refuses a negative or absurd delay.
func (d Delay) Validate() error {
	switch {
	case d.Latency < 0 || d.Jitter < 0:
		return fmt.Errorf("netfault: a delay cannot be negative (latency %v, jitter %v)", d.Latency, d.Jitter)
	case d.Latency > MaxDelay || d.Jitter > MaxDelay:
		return fmt.Errorf("netfault: latency %v or jitter %v is over %v", d.Latency, d.Jitter, MaxDelay)
	}
	for _, a := range d.From {
		if !a.IsValid() {
			return errors.New("netfault: an invalid client address in the delay's From")
		}
	}
	return nil
}

// applies tells whether the delay applies to a client at a.
func (d Delay) applies(a netip.Addr) bool {
	if len(d.From) == 0 {
		return true
	}
	for _, f := range d.From {
		if f == a.Unmap() {
			return true
		}
	}
	return false
}

// Proxy forwards TCP connections to Target, delaying what flows back from
// it by the Delay in force when each chunk arrives. Requests pass at once:
// the service sees them on time and its own health is untouched, and every
// answer a client waits for is late. Connections already open follow
// changes of the delay.
type Proxy struct {
	ln  net.Listener
	log *slog.Logger

	mu     sync.Mutex
	target string
	delay  Delay
	conns  map[net.Conn]struct{}
	done   bool
	wg     sync.WaitGroup
	// stop is closed by Close: an answer held back (for up to MaxDelay)
	// is dropped then, so that Close does not wait for it.
	stop chan struct{}
}

// NewProxy serves ln, forwarding to target.
func NewProxy(ln net.Listener, target string, log *slog.Logger) *Proxy {
	p := &Proxy{ln: ln, target: target, log: log, conns: map[net.Conn]struct{}{}, stop: make(chan struct{})}
	p.wg.Add(1)
	go p.serve()
	return p
}

// Addr is where the proxy listens.
func (p *Proxy) Addr() net.Addr { return p.ln.Addr() }

// Set changes the delay.
func (p *Proxy) Set(d Delay) error {
	if err := d.Validate(); err != nil {
		return err
	}
	p.mu.Lock()
	p.delay = d
	p.mu.Unlock()
	return nil
}

// Retarget sends new connections to target from now on, and closes the
// ones open (their clients reconnect, to target): what answers at the
// proxy's address is now another service, as when a machine is rebuilt
// with the old one's address.
func (p *Proxy) Retarget(target string) {
	p.mu.Lock()
	p.target = target
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
}

// Delay returns the delay in force.
func (p *Proxy) Delay() Delay {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.delay
}

// Close stops listening, closes every connection and waits for them.
func (p *Proxy) Close() error {
	err := p.ln.Close()
	p.mu.Lock()
	if !p.done {
		close(p.stop)
	}
	p.done = true
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
	return err
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

func (p *Proxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				p.log.Warn("delay proxy stopped accepting", "err", err)
			}
			return
		}
		p.wg.Add(1)
		go p.handle(c)
	}
}

func (p *Proxy) handle(client net.Conn) {
	defer p.wg.Done()
	if !p.track(client) {
		_ = client.Close()
		return
	}
	defer p.untrack(client)
	defer client.Close()
	p.mu.Lock()
	target := p.target
	p.mu.Unlock()
	server, err := net.DialTimeout("tcp", target, 5*time.Second)
	if err != nil {
		p.log.Debug("delay proxy cannot reach its target", "target", target, "err", err)
		return
	}
	if !p.track(server) {
		_ = server.Close()
		return
	}
	defer p.untrack(server)
	defer server.Close()
	var from netip.Addr
	if a, ok := client.RemoteAddr().(*net.TCPAddr); ok {
		from = a.AddrPort().Addr().Unmap()
	}
	done := make(chan struct{}, 2)
	go func() {
		_, _ = io.Copy(server, client)
		closeWrite(server)
		done <- struct{}{}
	}()
	go func() {
		p.delayed(client, server, from)
		closeWrite(client)
		done <- struct{}{}
	}()
	<-done
	<-done
}

// chunk is what one read returned, and when it may be written on.
type chunk struct {
	b   []byte
	due time.Time
}

// delayed copies src to dst, each chunk held until its due time: arrival
// plus the delay in force then, never before the chunk ahead of it.
func (p *Proxy) delayed(dst io.Writer, src io.Reader, from netip.Addr) {
	q := make(chan chunk, 1024)
	go func() {
		defer close(q)
		var last time.Time
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				due := time.Now()
				if d := p.Delay(); d.applies(from) {
					due = due.Add(d.Latency)
					if d.Jitter > 0 {
						due = due.Add(rand.N(d.Jitter))
					}
				}
				if due.Before(last) {
					due = last
				}
				last = due
				// A copy of what was read: most reads are a few hundred
				// bytes, and a fresh 32 KiB buffer for each made this proxy
				// one of the lab's busiest processes (its garbage).
				q <- chunk{bytes.Clone(buf[:n]), due}
			}
			if err != nil {
				return
			}
		}
	}()
	failed := false
	for c := range q {
		if failed {
			continue // drain, so the reader ends
		}
		if w := time.Until(c.due); w > 0 {
			t := time.NewTimer(w)
			select {
			case <-t.C:
			case <-p.stop:
				t.Stop()
				failed = true
				if cl, ok := src.(io.Closer); ok {
					_ = cl.Close()
				}
				continue
			}
		}
		if _, err := dst.Write(c.b); err != nil {
			failed = true
			if cl, ok := src.(io.Closer); ok {
				_ = cl.Close()
			}
		}
	}
}

func closeWrite(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
		return
	}
	_ = c.Close()
}
