package daemon

import (
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vigil-ha/vigil/internal/health"
)

// placement decides whether this node should leave the VIP to a peer: its own
// API server has failed its checks for longer than grace, while at least one
// other API server has passed every check for at least grace too. The rule
// never leaves the cluster without a holder merely because every API server
// is unhealthy at once (a shared etcd outage fails them all): then nobody
// yields and the VIP stays where it is. Nor does it move the VIP when such a
// brownout ends and the servers recover a moment apart (a storm of
// reconnections through the VIP saturates them all; whichever answers first
// is no better a home than the holder's): the peer must have answered for
// as long as the local server has failed. Nor when the brownout begins and
// the local server times out first: the peer's last check must also have
// answered briskly, within brisk (half the check timeout), since servers
// that share a load slow down together before they fail. And a node that
// yielded but saw no peer take the lock takes it back (see
// election.Config.Yield).
type placement struct {
	checker interface{ Statuses() []health.Status } // the API servers' health (health.Checker)
	grace   time.Duration
	// brisk is the slowest last check a peer's API server may have taken
	// to count as a home for the VIP; 0 for no bound.
	brisk time.Duration
	host  *hostAddrs
	log   *slog.Logger
	gauge prometheus.Gauge

	mu       sync.Mutex // guards yielding
	yielding bool
}

// yield is election.Config.Yield.
func (p *placement) yield() (string, bool) {
	local := p.host.get()
	var mine []health.Status
	healthyPeer := ""
	for _, st := range p.checker.Statuses() {
		ap, err := netip.ParseAddrPort(st.Backend)
		if err == nil && local[ap.Addr().Unmap()] {
			mine = append(mine, st)
		} else if healthyPeer == "" && p.settled(st) {
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

// settled says whether a peer's API server is Up, has passed its checks
// for at least the grace, and answered its last within brisk.
func (p *placement) settled(st health.Status) bool {
	return st.State == health.Up && !st.PassingSince.IsZero() && time.Since(st.PassingSince) >= p.grace &&
		(p.brisk == 0 || st.LastRTT <= p.brisk)
}

func (p *placement) isYielding() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.yielding
}

// hostAddrs is this host's addresses without the VIP, as the link monitor
// (netmon) last read them: current within milliseconds of a change, and
// asked on every renewal, 10 times a second by default. Its API servers
// are the backends at these addresses.
type hostAddrs struct {
	vips []netip.Addr
	src  addrSource
}

// addrSource lists every address of this host (netmon.Monitor).
type addrSource interface{ Addrs() []netip.Addr }

func newHostAddrs(vips []netip.Addr, src addrSource) *hostAddrs {
	return &hostAddrs{vips: vips, src: src}
}

// get is the addresses.
func (h *hostAddrs) get() map[netip.Addr]bool {
	m := map[netip.Addr]bool{}
	for _, a := range h.src.Addrs() {
		if !slices.Contains(h.vips, a) {
			m[a] = true
		}
	}
	return m
}

// mine are the statuses of the backends on this host.
func (h *hostAddrs) mine(sts []health.Status) []health.Status {
	local := h.get()
	var out []health.Status
	for _, st := range sts {
		if ap, err := netip.ParseAddrPort(st.Backend); err == nil && local[ap.Addr().Unmap()] {
			out = append(out, st)
		}
	}
	return out
}

func boolFloat(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
