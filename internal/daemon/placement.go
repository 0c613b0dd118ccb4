package daemon

import (
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vigil-ha/vigil/internal/health"
)

// localAddrsTTL is how long the host's address list is cached between
// placement checks (asked every renewal, 10 times a second by default).
const localAddrsTTL = 5 * time.Second

// placement decides whether this node should leave the VIP to a peer: its own
// API server has failed its checks for longer than grace, while at least one
// other API server passes them. The rule never leaves the cluster without a
// holder merely because every API server is unhealthy at once (a shared etcd
// outage fails them all): then nobody yields and the VIP stays where it is.
// And a node that yielded but saw no peer take the lock takes it back (see
// election.Config.Yield).
type placement struct {
	checker *health.Checker
	grace   time.Duration
	vips    []netip.Addr
	log     *slog.Logger
	gauge   prometheus.Gauge

	mu       sync.Mutex // guards local and localAt
	local    map[netip.Addr]bool
	localAt  time.Time
	yielding bool
}

// yield is election.Config.Yield.
func (p *placement) yield() (string, bool) {
	local := p.localAddrs()
	var mine []health.Status
	healthyPeer := ""
	for _, st := range p.checker.Statuses() {
		ap, err := netip.ParseAddrPort(st.Backend)
		if err == nil && local[ap.Addr().Unmap()] {
			mine = append(mine, st)
		} else if st.State == health.Up && healthyPeer == "" {
			healthyPeer = st.Backend
		}
	}
	reason, yield := "", false
	if len(mine) > 0 && healthyPeer != "" {
		yield = true
		for _, st := range mine {
			if st.FailingSince.IsZero() || time.Since(st.FailingSince) < p.grace {
				yield = false
				break
			}
		}
		if yield {
			st := mine[0]
			reason = fmt.Sprintf("local API server %s failing for %v (%s), while %s is healthy",
				st.Backend, time.Since(st.FailingSince).Round(100*time.Millisecond), st.LastError, healthyPeer)
		}
	}
	p.mu.Lock()
	changed := p.yielding != yield
	p.yielding = yield
	p.mu.Unlock()
	if changed {
		p.gauge.Set(boolFloat(yield))
		if !yield {
			p.log.Info("local API server healthy again (or no healthy peer); taking part in the election normally")
		}
	}
	return reason, yield
}

func (p *placement) isYielding() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.yielding
}

// localAddrs is this host's addresses, without the VIP.
func (p *placement) localAddrs() map[netip.Addr]bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if time.Since(p.localAt) < localAddrsTTL {
		return p.local
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		p.log.Warn("cannot list this host's addresses; health-aware placement keeps the last list", "err", err)
		return p.local
	}
	m := map[netip.Addr]bool{}
	for _, a := range addrs {
		if pfx, err := netip.ParsePrefix(a.String()); err == nil && !slices.Contains(p.vips, pfx.Addr()) {
			m[pfx.Addr().Unmap()] = true
		}
	}
	p.local, p.localAt = m, time.Now()
	return m
}

func boolFloat(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
