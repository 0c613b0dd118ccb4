package lb

import (
	"net"
	"net/netip"
	"time"
)

// admitLocked admits a new client connection from src, under key (its
// net.Conn or loop pair): admitted and counted, or not (limit names the
// connection limit reached; empty when this node does not serve, and the
// connection is a stray). b.mu is held.
//
// At the total limit a source under its fair share still gets in: the
// oldest connection of the source holding the most is evicted for it
// (returned as evict, for the caller to close outside the lock), as long as
// that source holds at least two more than the newcomer's would. A flood of
// idle connections from a few addresses (or, with IPv6, many) then cannot
// keep a new client out: shares even out, and only a source already at
// its share is refused. Oldest, not most idle: the flood's first
// connections are its oldest, and the busy connections of a real client
// behind a NAT are its newest.
func (b *Balancer) admitLocked(key any, src netip.Addr) (limit string, ok bool, evict any) {
	switch {
	case !b.serving:
		return "", false, nil
	case b.cfg.MaxConnsPerSource > 0 && b.sources[src] >= b.cfg.MaxConnsPerSource:
		limit = "max_conns_per_source"
	case b.cfg.MaxConns > 0 && len(b.clients) >= b.cfg.MaxConns:
		limit = "max_conns"
		if victim, ok := b.victimLocked(src); ok {
			evict = victim
			b.releaseLocked(victim, b.clients[victim].src)
			limit = ""
		}
	}
	if limit != "" {
		if time.Since(b.lastCap) > 5*time.Second {
			b.lastCap = time.Now()
			b.log.Warn("connection limit reached; resetting new connections (logged every 5s)", "limit", limit,
				"connections", len(b.clients), "max_conns", b.cfg.MaxConns, "max_conns_per_source", b.cfg.MaxConnsPerSource, "client", src.String())
		}
		return limit, false, nil
	}
	b.clients[key] = admitted{src: src, at: time.Now()}
	b.sources[src]++
	return "", true, evict
}

// victimLocked picks the connection to evict for a newcomer from src at
// the total limit: the oldest of the source holding the most, if it holds
// at least two more than src would with the newcomer. b.mu is held.
func (b *Balancer) victimLocked(src netip.Addr) (any, bool) {
	var top netip.Addr
	most := 0
	for s, n := range b.sources {
		if n > most || (n == most && s.Less(top)) {
			top, most = s, n
		}
	}
	if top == src || most < b.sources[src]+2 {
		return nil, false
	}
	var victim any
	var oldest time.Time
	for k, a := range b.clients {
		if a.src == top && (victim == nil || a.at.Before(oldest)) {
			victim, oldest = k, a.at
		}
	}
	return victim, victim != nil
}

// evict closes a connection admitLocked evicted (nil: none), counted in
// vigil_lb_connections_closed_total{reason="fair_share"}.
func (b *Balancer) evict(key any) {
	switch c := key.(type) {
	case nil:
		return
	case net.Conn:
		reset(c) // its serve goroutine closes the backend side
	case *lpair:
		c.loop.post(loopCmd{p: c})
	}
	b.m.closed.WithLabelValues("fair_share").Inc()
	b.mu.Lock()
	log := time.Since(b.lastEvict) > 5*time.Second
	if log {
		b.lastEvict = time.Now()
	}
	b.mu.Unlock()
	if log {
		b.log.Warn("connection limit reached; evicting the oldest connection of the source with the most, for a source under its share (logged every 5s)", "max_conns", b.cfg.MaxConns)
	}
}

// refused counts a connection turned away (and reset) by admitLocked
// over a limit; a stray one (limit "") is not counted.
func (b *Balancer) refused(limit string) {
	if limit != "" {
		b.m.refused.WithLabelValues(limit).Inc()
	}
}

// stillWantedLocked tells whether a connection to be, just established
// for the client key, may be proxied: be may have gone down or been
// removed while it was dialled, or this node may have stopped serving or
// reset the client. b.mu is held.
func (b *Balancer) stillWantedLocked(key any, be *backend, anyway bool) bool {
	_, ok := b.clients[key]
	return ok && !b.closed && b.serving && b.pool.m[be.addr] == be && (be.usable || anyway)
}

// releaseLocked forgets an admitted client connection and its slot of
// src; one forgotten already (evicted, or released) is left alone. b.mu is
// held.
func (b *Balancer) releaseLocked(key any, src netip.Addr) {
	if _, ok := b.clients[key]; !ok {
		return
	}
	delete(b.clients, key)
	if b.sources[src]--; b.sources[src] <= 0 {
		delete(b.sources, src)
	}
}
