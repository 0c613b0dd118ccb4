package agent

import (
	"context"
	"net"
	"sync/atomic"
	"time"

	"github.com/vigil-ha/vigil/internal/lb"
)

// Preference tiers: new connections go to the lowest tier with a usable
// backend, least connections within it.
const (
	tierLocal = 0 // on this host
	tierNear  = 1 // latency within twice the best remote backend's, plus slack
	tierFar   = 2 // slower, or not measured yet
	tierSeed  = 3 // a seed (--server, --etcd-endpoints) not learned from the cluster
)

// nearSlack keeps backends in one tier when their latencies differ by
// noise: on one L2 segment they all answer in well under a millisecond.
const nearSlack = time.Millisecond

// rankLoop re-ranks the backends every second by what the health checks
// measure.
func (a *Agent) rankLoop(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		a.rank()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (a *Agent) rank() {
	local := map[string]bool{}
	addrs, err := a.localAddrs()
	if err == nil {
		for _, ip := range addrs {
			local[ip.String()] = true
		}
	}
	for _, u := range a.upstreams() {
		u.picker.setTiers(tiers(u, local))
	}
}

// tieredPicker is the agent's lb.Picker. A new connection goes to the
// lowest tier that has a usable backend, least connections within it. When
// no backend at all passes its checks, it goes to any backend, least
// connections first, instead of being reset: checks can all fail at once
// for reasons that are not the backends' (an overloaded or briefly cut-off
// worker), and a client turned away backs off, often for many seconds
// (gRPC's reconnect backoff), while a dial would have worked. A backend
// that refuses still fails fast.
type tieredPicker struct {
	tiers atomic.Pointer[map[string]int] // written by rank, read by Pick
	next  int                            // Pick's turn; the balancer serialises Pick
}

func (*tieredPicker) String() string { return "least-conn within tiers (local, near, far, seed)" }

func (p *tieredPicker) setTiers(t map[string]int) { p.tiers.Store(&t) }

// tier of addr: tierLocal until rank has placed it (rank runs every second
// and right after the backends change).
func (p *tieredPicker) tier(addr string) int {
	if m := p.tiers.Load(); m != nil {
		return (*m)[addr]
	}
	return tierLocal
}

// Pick implements lb.Picker.
func (p *tieredPicker) Pick(bs []lb.Candidate, tried map[string]bool) (int, bool) {
	best, found, anyUsable := 0, false, false
	for _, b := range bs {
		if !b.Usable {
			continue
		}
		anyUsable = true
		if t := p.tier(b.Addr); !tried[b.Addr] && (!found || t < best) {
			best, found = t, true
		}
	}
	if found {
		return lb.LeastConnFrom(bs, tried, &p.next, func(c lb.Candidate) bool { return p.tier(c.Addr) == best }), false
	}
	if anyUsable {
		return -1, false // the usable ones were tried: give up
	}
	last := -1
	for i, b := range bs {
		if !tried[b.Addr] && (last < 0 || b.Active < bs[last].Active) {
			last = i
		}
	}
	return last, last >= 0
}

func tiers(u *upstream, local map[string]bool) map[string]int {
	backends := u.backends()
	out := make(map[string]int, len(backends))
	lat := map[string]time.Duration{}
	var best time.Duration
	for _, b := range backends {
		host, _, _ := net.SplitHostPort(b)
		switch {
		case !u.isLearned(b):
			out[b] = tierSeed
		case local[host]:
			out[b] = tierLocal
		default:
			if d, ok := u.checker.Latency(b); ok {
				lat[b] = d
				if best == 0 || d < best {
					best = d
				}
			}
		}
	}
	for _, b := range backends {
		if _, done := out[b]; done {
			continue
		}
		if d, ok := lat[b]; ok && d <= 2*best+nearSlack {
			out[b] = tierNear
		} else {
			out[b] = tierFar
		}
	}
	return out
}

func (a *Agent) localAddrs() ([]net.IP, error) {
	if a.cfg.LocalAddrs != nil {
		return a.cfg.LocalAddrs()
	}
	ifas, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	var out []net.IP
	for _, ifa := range ifas {
		if n, ok := ifa.(*net.IPNet); ok {
			out = append(out, n.IP)
		}
	}
	return out, nil
}
