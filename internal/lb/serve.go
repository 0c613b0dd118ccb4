package lb

import (
	"context"
	"errors"
	"net"
	"os"
	"time"
)

// serve forwards one client connection, trying up to Attempts backends.
func (b *Balancer) serve(ctx context.Context, client net.Conn) {
	tried := map[string]bool{}
	for range b.cfg.Attempts {
		b.mu.Lock()
		be, anyway := b.pool.pick(tried)
		b.mu.Unlock()
		if be == nil {
			break
		}
		tried[be.addr] = true
		started := time.Now()
		dctx, cancel := context.WithTimeout(ctx, b.cfg.DialTimeout)
		server, err := b.cfg.Dial(dctx, "tcp", be.addr)
		cancel()
		if err != nil {
			b.mu.Lock()
			b.pool.done(be)
			report := ctx.Err() == nil && b.dialFailedLocked(be, started, err)
			b.mu.Unlock()
			if ctx.Err() != nil {
				break
			}
			if report {
				b.cfg.OnDialError(be.addr, err)
			}
			continue
		}
		b.proxy(be, &proxyConn{client: client, server: server}, anyway)
		return
	}
	if ctx.Err() == nil {
		b.noBackend(client.RemoteAddr().String())
	}
	reset(client)
}

// dialFailedLocked counts a failed attempt to reach be, begun at started,
// and says whether to report it to passive health checking
// (Config.OnDialError). A timeout is not reported when a later attempt
// reached be: a backend that accepts connections is there, and the lost
// SYN was the path's (a burst of thousands of reconnecting clients
// overflows queues, and TCP resends a SYN only after a second). Its health
// checks still judge it. b.mu is held.
func (b *Balancer) dialFailedLocked(be *backend, started time.Time, err error) bool {
	b.m.dialErrors.WithLabelValues(be.addr).Inc()
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() && be.reached.After(started) {
		b.log.Debug("a connection attempt timed out while others reached the backend; trying another", "backend", be.addr, "err", err)
		return false
	}
	b.log.Debug("backend refused a connection; trying another", "backend", be.addr, "err", err)
	return b.cfg.OnDialError != nil
}

// noBackend counts and logs (at most every 5 s) a client turned away
// because no backend took its connection.
func (b *Balancer) noBackend(client string) {
	b.m.rejected.Inc()
	b.mu.Lock()
	logIt := time.Since(b.lastNoB) > 5*time.Second
	if logIt {
		b.lastNoB = time.Now()
	}
	n := len(b.pool.m)
	b.mu.Unlock()
	if logIt {
		b.log.Warn("no usable backend; closing client connections (logged every 5s)", "backends_known", n, "client", client)
	}
}

// proxy copies both ways until both sides are done or the pair is closed.
// anyway: the picker chose be although it was not usable (a last resort).
func (b *Balancer) proxy(be *backend, pc *proxyConn, anyway bool) {
	b.mu.Lock()
	be.reached = time.Now() // the dial just succeeded
	if !b.stillWantedLocked(pc.client, be, anyway) {
		b.pool.done(be)
		b.mu.Unlock()
		pc.close()
		return
	}
	be.conns[pc] = struct{}{}
	be.m.active.Inc()
	be.m.accepted.Inc()
	b.mu.Unlock()
	b.pump(be, pc, resume{})
}

// resume is where an event loop's connection stands when it is handed
// over to goroutines (see evloop.handOver); the zero value is a new one.
type resume struct {
	upDone, downDone       bool      // that direction finished (FIN passed on)
	halfCloseAt            time.Time // when one has: its deadline
	pendingUp, pendingDown []byte    // read, not yet written
	bulkUp, bulkDown       bool      // splice from the start
}

// pump copies both ways until both sides are done or the pair is closed,
// then releases be; be.conns holds pc already.
func (b *Balancer) pump(be *backend, pc *proxyConn, st resume) {
	if b.cfg.IdleTimeout > 0 {
		pc.touch(b.cfg.IdleTimeout)
	}
	// A direction that finished gives the other its half-close deadline:
	// its reads are from the side that has not finished.
	if st.upDone {
		pc.finished.Add(1)
		_ = pc.server.SetReadDeadline(st.halfCloseAt)
	}
	if st.downDone {
		pc.finished.Add(1)
		_ = pc.client.SetReadDeadline(st.halfCloseAt)
	}
	done := make(chan int64, 1)
	if st.upDone {
		done <- 0
	} else {
		go func() {
			done <- b.pipe(&copier{dst: pc.server, src: pc.client, idle: b.cfg.IdleTimeout, pc: pc, last: &pc.lastUp,
				pending: st.pendingUp, bulk: st.bulkUp})
		}()
	}
	var down int64
	if !st.downDone {
		down = b.pipe(&copier{dst: pc.client, src: pc.server, idle: b.cfg.IdleTimeout, pc: pc, last: &pc.lastDown,
			pending: st.pendingDown, bulk: st.bulkDown})
	}
	up := <-done
	pc.close()
	b.m.toBackend.Add(float64(up))
	b.m.toClient.Add(float64(down))

	b.mu.Lock()
	delete(be.conns, pc)
	b.pool.done(be)
	be.m.active.Dec()
	b.mu.Unlock()
}

// pipe runs one direction. On a clean end of its source it half-closes
// the destination, so the other direction can finish (a client that shut
// down writing still reads the answer), and gives that direction
// HalfCloseTimeout to do so: its reads from dst get that deadline. On an
// error, a deadline among them, it closes the pair, or the other direction
// could wait forever on a peer that is gone.
func (b *Balancer) pipe(c *copier) int64 {
	dst := c.dst
	n, err := c.copy()
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			b.m.closed.WithLabelValues("timeout").Inc()
		}
		c.pc.close()
		return n
	}
	if c.pc.finished.Add(1) == 2 {
		// The other direction ended cleanly too: both peers finished
		// sending and everything was forwarded, so closing sends the FIN
		// that a half-close would, one system call sooner (the common end
		// of a short connection, as HAProxy ends it).
		c.pc.close()
		return n
	}
	if cw, ok := dst.(interface{ CloseWrite() error }); ok {
		if cw.CloseWrite() == nil {
			// The other direction reads from dst. With an idle timeout,
			// its next read would push this deadline out again: the
			// idle timeout then stands in for this one only while bytes
			// still flow.
			_ = dst.SetReadDeadline(time.Now().Add(b.cfg.HalfCloseTimeout))
			return n
		}
	}
	c.pc.close()
	return n
}
