package daemon

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vigil-ha/vigil/internal/announce"
	"github.com/vigil-ha/vigil/internal/election"
	"github.com/vigil-ha/vigil/internal/kube"
)

// Conflict detection: every node asks the segment, every conflictInterval
// and right after each takeover, who answers for the VIP (an ARP probe or a
// neighbour solicitation). The only hardware address that may answer is the
// current holder's, which the lock record carries. Anything else is a
// conflict: a node whose vigil is stopped together with its guard, a stray
// address vigil does not manage (another interface, another host), or a
// foreign machine given the VIP by mistake.
const (
	// conflictInterval keeps a conflict reported within about 5 s (one
	// interval plus the probe's wait), at one broadcast per node per
	// interval.
	conflictInterval = 3 * time.Second
	// conflictWait is how long a probe collects answers: ARP on one
	// segment answers in well under a millisecond; 200 ms leaves room for a
	// loaded host.
	conflictWait = 200 * time.Millisecond
	// conflictSettle skips probes this soon after the holder changed: the
	// old holder's last answers may still be in flight.
	conflictSettle = time.Second
	// conflictFresh is how recent this node's view of the holder must be
	// for a probe to be judged against it. Candidates read the lock every
	// retry period; a node that cannot read it (etcd down, still claiming
	// its name) does not know whom to expect.
	conflictFresh = time.Second
)

// ConflictReport is what /status says about VIP conflicts.
type ConflictReport struct {
	// MACs answering for the VIP besides the holder's, at the last probe.
	MACs []string `json:"macs,omitempty"`
	// Since is when the current conflict was first seen.
	Since *time.Time `json:"since,omitempty"`
	// Total counts conflicts seen since start (one per episode and MAC).
	Total int `json:"total"`
	// Untracked counts the conflicting MACs past the caps (a probe keeps
	// announce.MaxProbeMACs, an episode maxConflictMACs): a flood of replies
	// with random MACs is counted, not kept.
	Untracked int `json:"untracked,omitempty"`
	// LastProbe is when the last probe finished; LastError why it failed.
	LastProbe *time.Time `json:"lastProbe,omitempty"`
	LastError string     `json:"lastError,omitempty"`
}

// conflicts runs the probes of one node.
type conflicts struct {
	iface string
	links announce.Links // the interface's index and MAC (netmon)
	// vips are the VIP's addresses; each is probed (dual-stack: ARP and
	// NDP).
	vips []netip.Addr
	// el says who holds the lock, and changed when that last changed
	// (UnixNano): see expected. el is set once the elector is built,
	// before Run.
	el      interface{ Status() election.Status }
	changed *atomic.Int64
	kick    chan struct{}
	events  *kube.Events // nil without --kubeconfig
	log     *slog.Logger
	total   prometheus.Counter
	gauge   prometheus.Gauge
	// untracked counts MACs past the caps (ConflictReport.Untracked).
	untracked prometheus.Counter

	mu     sync.Mutex // guards report and active
	report ConflictReport
	active map[string]bool // MACs of the current episode
}

// expected returns the holder ("" when none), the MAC it announces, when
// the holder last changed, and whether that view is fresh (this node read
// or renewed the lock a moment ago).
func (c *conflicts) expected() (holder, mac string, changed time.Time, fresh bool) {
	st := c.el.Status()
	return st.Holder, st.HolderMAC, time.Unix(0, c.changed.Load()), time.Since(st.Seen) < conflictFresh
}

// Kick asks for a probe now (after a takeover).
func (c *conflicts) Kick() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// Report returns a snapshot for /status.
func (c *conflicts) Report() ConflictReport {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := c.report
	r.MACs = slices.Clone(r.MACs)
	return r
}

// Run probes until ctx is done.
func (c *conflicts) Run(ctx context.Context) {
	t := time.NewTicker(conflictInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-c.kick:
			// After a takeover the old holder needs a moment to go.
			settle := time.NewTimer(conflictSettle)
			select {
			case <-ctx.Done():
				settle.Stop()
				return
			case <-settle.C:
			}
		}
		c.probeOnce()
	}
}

func (c *conflicts) probeOnce() {
	holder, mac, changed, fresh := c.expected()
	if !fresh || time.Since(changed) < conflictSettle || (holder != "" && mac == "") {
		return // no current view, just changed, or a holder too old to say its MAC
	}
	ifi, err := c.links.InterfaceByName(c.iface)
	var macs []net.HardwareAddr
	more := 0
	for _, vip := range c.vips {
		if err != nil {
			break
		}
		var m []net.HardwareAddr
		var n int
		m, n, err = announce.Probe(ifi, vip, conflictWait)
		macs = append(macs, m...)
		more += n
	}
	now := time.Now()
	// A holder change during the probe makes its answers ambiguous.
	if _, mac2, changed2, _ := c.expected(); mac2 != mac || !changed2.Equal(changed) {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.report.LastProbe = &now
	if err != nil {
		c.report.LastError = err.Error()
		return
	}
	c.report.LastError = ""
	var bad []string
	for _, m := range macs {
		if s := m.String(); !strings.EqualFold(s, mac) {
			bad = append(bad, s)
		}
	}
	slices.Sort(bad)
	bad = slices.Compact(bad) // one machine answering for both families
	c.report.MACs = bad
	if len(bad) == 0 {
		if c.active != nil {
			c.log.Info("VIP conflict over: only the holder answers for the VIP")
		}
		c.active, c.report.Since = nil, nil
		c.gauge.Set(0)
		return
	}
	c.gauge.Set(1)
	if c.active == nil {
		c.active = map[string]bool{}
		c.report.Since = &now
	}
	c.untrack(more)
	if len(bad) > maxConflictMACs {
		c.report.MACs = bad[:maxConflictMACs]
	}
	for _, m := range bad {
		if c.active[m] {
			continue
		}
		if len(c.active) >= maxConflictMACs {
			c.untrack(1)
			continue
		}
		c.active[m] = true
		c.report.Total++
		c.total.Inc()
		c.log.Warn("VIP conflict: another machine answers for the VIP", "mac", m, "holder_mac", mac)
		if c.events != nil {
			c.events.Emit(true, kube.ReasonVIPConflict, "hardware address %s answers for the VIP %s besides the holder's (%s)", m, joinAddrs(c.vips), orNone(mac))
		}
	}
}

// maxConflictMACs bounds the MACs one conflict episode tracks (and logs,
// and sends Events for); more are counted in Untracked.
const maxConflictMACs = announce.MaxProbeMACs

// untrack counts n conflicting MACs that are not tracked. c.mu is held.
func (c *conflicts) untrack(n int) {
	if n <= 0 {
		return
	}
	if c.report.Untracked == 0 {
		c.log.Warn("VIP conflict: more hardware addresses answer for the VIP than are tracked; counting the rest (a flood of ARP or NDP replies?)", "tracked", maxConflictMACs)
	}
	c.report.Untracked += n
	if c.untracked != nil {
		c.untracked.Add(float64(n))
	}
}

func joinAddrs(as []netip.Addr) string {
	s := make([]string, len(as))
	for i, a := range as {
		s[i] = a.String()
	}
	return strings.Join(s, ",")
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}
