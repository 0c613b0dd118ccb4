package lb

import (
	"net"
	"time"

	"github.com/vigil-ha/vigil/internal/health"
)

// SetBackends makes the backend set exactly addrs (host:port each). New
// backends take traffic once Update reports them up; connections to removed
// ones are closed at once so their clients reconnect to a member that is
// still in the cluster.
func (b *Balancer) SetBackends(addrs []string) {
	b.mu.Lock()
	removed := b.pool.set(addrs)
	for _, be := range b.pool.m {
		if be.m.active == nil {
			be.m = b.m.forBackend(be.addr)
		}
	}
	var conns []*proxyConn
	for _, be := range removed {
		for c := range be.conns {
			conns = append(conns, c)
		}
		b.cancelClose(be.addr)
		b.m.forget(be.addr)
		b.log.Info("backend removed", "backend", be.addr, "closing", len(be.conns))
	}
	b.m.usable.Set(float64(b.pool.usableCount()))
	b.m.known.Set(float64(len(b.pool.m)))
	b.mu.Unlock()
	closeAll(conns)
}

// Update applies a health change of one backend. Up takes new
// connections; down, for any cause, takes none. What happens to its
// established connections depends on the cause (see health.Cause):
//
//   - Dead (refused: the process is gone): closed at once, so their clients
//     reconnect to a live server now;
//   - Unreachable (silent: paused, overloaded, or powered off): left alone
//     until UnreachableGrace after it stopped answering, then closed;
//   - Draining (answering, failing /readyz): left to finish until
//     DrainTimeout.
//
// A backend that comes back up before its deadline keeps every connection.
func (b *Balancer) Update(st health.Status) {
	b.mu.Lock()
	be, ok := b.pool.m[st.Backend]
	if !ok || b.closed {
		b.mu.Unlock()
		return
	}
	be.usable = st.State == health.Up
	b.m.backendUp.WithLabelValues(be.addr).Set(boolFloat(be.usable))
	b.m.usable.Set(float64(b.pool.usableCount()))
	if be.usable || st.Cause == health.Dead {
		b.cancelClose(be.addr)
	}
	var conns []*proxyConn
	if st.State == health.Down && len(be.conns) > 0 {
		now := time.Now()
		switch st.Cause {
		case health.Dead:
			for c := range be.conns {
				conns = append(conns, c)
			}
		case health.Unreachable:
			since := st.FailingSince
			if since.IsZero() || since.After(now) {
				since = now
			}
			if b.closeAt(be.addr, since.Add(b.cfg.UnreachableGrace), "backend_unreachable") {
				b.log.Info("backend unreachable; its connections are kept for the grace period, in case it answers again",
					"backend", be.addr, "connections", len(be.conns), "grace", b.cfg.UnreachableGrace, "err", st.LastError)
			}
		case health.Draining:
			if b.closeAt(be.addr, now.Add(b.cfg.DrainTimeout), "drain_timeout") {
				b.log.Info("backend draining; its connections may finish", "backend", be.addr, "connections", len(be.conns), "timeout", b.cfg.DrainTimeout)
			}
		}
	}
	b.mu.Unlock()
	if len(conns) > 0 {
		b.log.Info("closing connections to a dead backend", "backend", st.Backend, "connections", len(conns))
		b.m.closed.WithLabelValues("backend_dead").Add(float64(len(conns)))
		closeAll(conns)
	}
}

// closeAt arranges for addr's connections to be closed at t, unless one is
// due earlier already; it reports whether it set a new deadline. b.mu is
// held.
func (b *Balancer) closeAt(addr string, t time.Time, reason string) bool {
	if p := b.closing[addr]; p != nil {
		if !p.at.After(t) {
			return false
		}
		p.timer.Stop()
	}
	p := &pendingClose{at: t}
	p.timer = time.AfterFunc(time.Until(t), func() { b.closeBackend(addr, p, reason) })
	b.closing[addr] = p
	return true
}

// cancelClose drops addr's pending close. b.mu is held.
func (b *Balancer) cancelClose(addr string) {
	if p := b.closing[addr]; p != nil {
		p.timer.Stop()
		delete(b.closing, addr)
	}
}

// SetServing turns forwarding on (this node holds the VIP) or off. Turning
// it off resets every client connection, including those still waiting for
// a backend: the daemon does so just before it removes the VIP, while the
// resets can still leave from the VIP. Once the address is gone this node
// cannot send from it, and a client whose request was already acknowledged
// would wait for an answer that never comes.
func (b *Balancer) SetServing(on bool) {
	b.mu.Lock()
	b.serving = on
	var clients []net.Conn
	n := 0
	loops := b.loops
	if !on {
		for c := range b.clients {
			if c, ok := c.(net.Conn); ok {
				clients = append(clients, c)
			}
		}
		n = len(b.clients)
	}
	b.mu.Unlock()
	if n > 0 {
		b.log.Info("resetting client connections: this node no longer serves the VIP", "connections", n)
		b.m.closed.WithLabelValues("vip_moved").Add(float64(n))
	}
	for _, c := range clients {
		reset(c) // its serve goroutine closes the backend side
	}
	if !on && n > len(clients) {
		// The loops' own: each resets its clients and is done before
		// this returns, while the resets can still leave from the VIP.
		for _, l := range loops {
			l.postWait(loopCmd{resetAll: true})
		}
	}
}

// proxied returns every established connection.
func (b *Balancer) proxied() []*proxyConn {
	b.mu.Lock()
	defer b.mu.Unlock()
	var conns []*proxyConn
	for _, be := range b.pool.m {
		for c := range be.conns {
			conns = append(conns, c)
		}
	}
	return conns
}

// CloseAll closes every established connection.
func (b *Balancer) CloseAll(reason string) {
	conns := b.proxied()
	if len(conns) > 0 {
		b.log.Info("closing all proxied connections", "reason", reason, "connections", len(conns))
	}
	closeAll(conns)
}

// Busy counts the proxied connections in the middle of an exchange (see
// proxyConn.busy) and returns how many there are in all. A planned
// handoff moves the VIP when none is busy: a connection idle at the move
// is closed cleanly (its client reconnects), one with a request in flight
// would lose it.
func (b *Balancer) Busy(quiet time.Duration) (busy, total int) {
	now := time.Now().UnixNano()
	conns := b.proxied()
	for _, c := range conns { // the kernel queues are read outside the lock
		if c.busy(now, quiet) {
			busy++
		}
	}
	return busy, len(conns)
}

// BackendInfo describes one backend for status output.
type BackendInfo struct {
	Address     string `json:"address"`
	Usable      bool   `json:"usable"`
	Connections int    `json:"connections"`
}

// Backends returns the current backends, sorted by address.
func (b *Balancer) Backends() []BackendInfo {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]BackendInfo, 0, len(b.pool.order))
	for _, a := range b.pool.order {
		be := b.pool.m[a]
		out = append(out, BackendInfo{Address: a, Usable: be.usable, Connections: len(be.conns)})
	}
	return out
}

// CloseConnections closes every connection to backend addr now, whatever
// its health: for a backend that stays in the set under the same address
// but is no longer what it was (an etcd member removed from the cluster
// whose address is also a seed).
func (b *Balancer) CloseConnections(addr, reason string) {
	b.mu.Lock()
	var conns []*proxyConn
	if be, ok := b.pool.m[addr]; ok {
		for c := range be.conns {
			conns = append(conns, c)
		}
	}
	b.mu.Unlock()
	if len(conns) > 0 {
		b.log.Info("closing connections to a backend", "backend", addr, "reason", reason, "connections", len(conns))
	}
	closeAll(conns)
}

// closeBackend closes addr's connections when its pending close p is due,
// if the backend is still down and p was not replaced or cancelled.
func (b *Balancer) closeBackend(addr string, p *pendingClose, reason string) {
	b.mu.Lock()
	if b.closing[addr] != p {
		b.mu.Unlock()
		return
	}
	delete(b.closing, addr)
	be, ok := b.pool.m[addr]
	var conns []*proxyConn
	if ok && !be.usable {
		for c := range be.conns {
			conns = append(conns, c)
		}
	}
	b.mu.Unlock()
	if len(conns) > 0 {
		b.log.Info("closing connections to a backend", "backend", addr, "reason", reason, "connections", len(conns))
		b.m.closed.WithLabelValues(reason).Add(float64(len(conns)))
	}
	closeAll(conns)
}
