package lb

import (
	"net/netip"
	"slices"
	"time"
)

// pool is the balancer's view of its backends. It is not safe for concurrent
// use; the Balancer guards it with its mutex.
type pool struct {
	picker Picker
	order  []string // sorted addresses, the order the picker sees
	m      map[string]*backend
	cands  []Candidate // scratch for the picker, reused: no allocation per connection
}

type backend struct {
	addr   string
	ip     netip.AddrPort // addr, when it is IP:port (not a host name)
	usable bool           // passed its checks; new connections may go here
	active int            // connections being dialled or proxied
	conns  map[*proxyConn]struct{}
	m      backendMetrics
	// reached is when a connection to it last succeeded (b.mu): a timed
	// out attempt that began before it says nothing of the backend
	// (Balancer.dialFailedLocked).
	reached time.Time
}

func newPool(p Picker) *pool {
	if p == nil {
		p = LeastConn()
	}
	return &pool{picker: p, m: map[string]*backend{}}
}

// set makes the backends exactly addrs and returns those removed (with
// their connections, which the caller closes). New backends start unusable
// until their first passed check.
func (p *pool) set(addrs []string) (removed []*backend) {
	want := map[string]bool{}
	for _, a := range addrs {
		want[a] = true
		if _, ok := p.m[a]; !ok {
			ip, _ := netip.ParseAddrPort(a)
			p.m[a] = &backend{addr: a, ip: ip, conns: map[*proxyConn]struct{}{}}
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

// pick asks the picker for a backend not in skip and counts a connection
// on it; nil when the picker gives up. anyway: picked although not usable.
func (p *pool) pick(skip map[string]bool) (b *backend, anyway bool) {
	p.cands = p.cands[:0]
	for _, a := range p.order {
		be := p.m[a]
		p.cands = append(p.cands, Candidate{Addr: a, Usable: be.usable, Active: be.active})
	}
	i, anyway := p.picker.Pick(p.cands, skip)
	if i < 0 || i >= len(p.order) || skip[p.order[i]] {
		return nil, false
	}
	b = p.m[p.order[i]]
	b.active++
	return b, anyway && !b.usable
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
