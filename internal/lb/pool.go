package lb

import (
	"fmt"
	"slices"
)

// Policy chooses among usable backends.
type Policy int

// Policies.
const (
	// LeastConn picks the backend with the fewest active connections, ties
	// broken in turn. It suits the API server's mix of short requests and
	// watches that last for hours: round robin would pile long watches on
	// whichever backend came back up last.
	LeastConn Policy = iota
	// RoundRobin picks usable backends in turn.
	RoundRobin
)

// ParsePolicy accepts "least-conn" and "round-robin".
func ParsePolicy(s string) (Policy, error) {
	switch s {
	case "least-conn", "":
		return LeastConn, nil
	case "round-robin":
		return RoundRobin, nil
	}
	return 0, fmt.Errorf("%w: unknown balancing policy %q (least-conn or round-robin)", ErrInvalidConfig, s)
}

func (p Policy) String() string {
	if p == RoundRobin {
		return "round-robin"
	}
	return "least-conn"
}

// pool is the balancer's view of its backends. It is not safe for concurrent
// use; the Balancer guards it with its mutex.
type pool struct {
	policy Policy
	order  []string // sorted addresses, the round-robin order
	m      map[string]*backend
	next   int // round-robin position in order
}

type backend struct {
	addr   string
	usable bool // passed its checks; new connections may go here
	// tier orders backends by preference: a new connection goes to the
	// lowest tier that has a usable backend, and the policy chooses within
	// it. All backends are tier 0 unless SetTiers says otherwise.
	tier   int
	active int // connections being dialled or proxied
	conns  map[*proxyConn]struct{}
	m      backendMetrics
}

func newPool(p Policy) *pool { return &pool{policy: p, m: map[string]*backend{}} }

// set makes the backends exactly addrs and returns those removed (with
// their connections, which the caller closes). New backends start unusable
// until their first passed check.
func (p *pool) set(addrs []string) (removed []*backend) {
	want := map[string]bool{}
	for _, a := range addrs {
		want[a] = true
		if _, ok := p.m[a]; !ok {
			p.m[a] = &backend{addr: a, conns: map[*proxyConn]struct{}{}}
		}
	}
	for a, b := range p.m {
		if !want[a] {
			removed = append(removed, b)
			delete(p.m, a)
		}
	}
	p.order = p.order[:0]
	for a := range p.m {
		p.order = append(p.order, a)
	}
	slices.Sort(p.order)
	return removed
}

// pick chooses a usable backend not in skip, from the lowest tier that has
// one, and counts a connection on it; nil when there is none.
func (p *pool) pick(skip map[string]bool) *backend {
	n := len(p.order)
	tier, any := 0, false
	for _, b := range p.m {
		if b.usable && !skip[b.addr] && (!any || b.tier < tier) {
			tier, any = b.tier, true
		}
	}
	if !any {
		return nil
	}
	var best *backend
	bestAt := 0
	for i := range n {
		at := (p.next + i) % n
		b := p.m[p.order[at]]
		if !b.usable || skip[b.addr] || b.tier != tier {
			continue
		}
		if p.policy == RoundRobin {
			best, bestAt = b, at
			break
		}
		if best == nil || b.active < best.active {
			best, bestAt = b, at
		}
	}
	if best == nil {
		return nil
	}
	p.next = (bestAt + 1) % n
	best.active++
	return best
}

// pickAny is the last resort when no backend is usable: any backend not in
// skip, least connections first, checked or not. It counts a connection.
func (p *pool) pickAny(skip map[string]bool) *backend {
	var best *backend
	for _, a := range p.order {
		b := p.m[a]
		if skip[a] {
			continue
		}
		if best == nil || b.active < best.active {
			best = b
		}
	}
	if best != nil {
		best.active++
	}
	return best
}

// done ends a connection counted by pick.
func (p *pool) done(b *backend) { b.active-- }

// usable counts backends that take new connections.
func (p *pool) usableCount() int {
	c := 0
	for _, b := range p.m {
		if b.usable {
			c++
		}
	}
	return c
}
