package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vigil-ha/vigil/internal/announce"
	"github.com/vigil-ha/vigil/internal/bgp"
	"github.com/vigil-ha/vigil/internal/dnat"
	"github.com/vigil-ha/vigil/internal/election"
	"github.com/vigil-ha/vigil/internal/kube"
	"github.com/vigil-ha/vigil/internal/vip"
)

// holder is the order of what becomes true when this node leads, and
// stops being true when it does not: the guard learns each lease deadline
// before the keeper adds the VIP; the balancer serves from the first lease;
// then announcements, a conflict probe and the raft shedder for the tenure.
// On the way out the VIP goes first when another node may hold it already,
// and in any case before stop returns. The parts are its fields; each does
// one thing (vip.Keeper, announce, guardProc, raftShedder, conflicts).
type holder struct {
	// keeper adds and removes the VIP with the lease; nil with --bgp-mode
	// ecmp, where the VIP is every healthy node's (ecmpAnnouncer) and the
	// lock only picks the node that prunes.
	keeper *vip.Keeper
	guard  *guardProc          // nil with --guard=false
	ann    *announce.Announcer // nil with --announce bgp
	// speaker advertises the VIP's host route with --announce bgp (nil
	// otherwise); term is the election's transitions count at the start
	// of this tenure, which sets the route's MED.
	speaker *bgp.Speaker
	term    func() int
	bal     balancers // every --lb-port's; nil without --lb-port
	// dnat sends VIP:--lb-port to the balancer's --lb-listen-port while
	// this node serves (nil without --lb-listen-port).
	dnat    []dnat.Rule
	shedder *raftShedder // nil without --shed-raft-leadership or etcd
	// handoffs holds this node out of the election while vigil handoff
	// --hold says so; nil without etcd.
	handoffs *handoffs
	m        *nodeMetrics
	events   *kube.Events // nil without --kubeconfig
	cfg      Config
	log      *slog.Logger

	conflicts *conflicts
	// holderChanged is when the observed holder last changed (UnixNano).
	holderChanged atomic.Int64

	mu      sync.Mutex // guards group, cancel, since and serving
	serving bool       // whether the balancer serves (set at the first lease of a tenure)
	since   time.Time  // start of the current tenure
	group   *announce.Group
	cancel  context.CancelFunc
	wg      sync.WaitGroup // the refresher and the shedder
}

// lease runs whenever the lease deadline moves: the guard learns it, then
// the keeper, which adds the VIP at the start of a tenure and removes it the
// moment the deadline passes.
func (h *holder) lease(deadline time.Time) {
	h.mu.Lock()
	first := !h.serving
	if first && h.bal != nil {
		h.bal.SetServing(true) // before the first packet can arrive
	}
	if first && h.dnat != nil {
		// Before the VIP, too. Without the rules a client still reaches
		// an API server bound to 0.0.0.0 directly, unbalanced: loud,
		// not fatal.
		if err := dnat.Install(h.dnat); err != nil {
			h.log.Error("cannot send the VIP's port to the load balancer; clients reach this node's API server directly", "err", err)
		} else {
			h.log.Info("VIP port sent to the load balancer (nftables)", "rules", fmt.Sprint(h.dnat))
		}
	}
	h.serving = true
	h.mu.Unlock()
	if h.guard != nil {
		if !first {
			h.guard.Lease(deadline)
		} else if !h.guard.Arm(deadline, guardArmWait) {
			h.log.Warn("the VIP guard did not take the lease deadline in time; it will when it reads again", "waited", guardArmWait)
		}
	}
	if h.keeper != nil {
		h.keeper.Hold(deadline)
	}
}

// guardArmWait bounds how long a new holder waits for its first deadline to
// reach the guard before it adds the VIP. A write to a listening guard takes
// microseconds; the bound matters only for a guard that stopped reading.
const guardArmWait = 100 * time.Millisecond

// leading tells whether this node holds the lock (from its first lease
// until the step-down).
func (h *holder) leading() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.serving
}

// eligible is why this node cannot hold the VIP now: the keeper's reasons
// (interface down or gone, adding the address fails) or, with a guard, that
// no guard listens to this vigil.
func (h *holder) eligible() error {
	if h.keeper != nil {
		if err := h.keeper.Eligible(); err != nil {
			return err
		}
	}
	if h.handoffs != nil {
		if err := h.handoffs.eligible(); err != nil {
			return err
		}
	}
	if h.guard != nil {
		if err := h.guard.Eligible(); err != nil {
			return err
		}
	}
	if h.speaker != nil {
		return h.speaker.Eligible(context.Background())
	}
	return nil
}

// start runs on becoming leader, once the VIP is up: announcement at once.
func (h *holder) start(ctx context.Context) {
	h.m.leader.Set(1)
	h.m.leaderRuns.Inc()
	if h.keeper != nil { // with --bgp-mode ecmp, ecmpAnnouncer says
		h.m.vipHeld.Set(1)
	}
	if h.events != nil {
		h.events.Emit(false, kube.ReasonBecameLeader, "%s became leader and holds the VIP %s on %s", h.cfg.NodeName, h.cfg.VIPString(), h.cfg.Interface)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	ctx, h.cancel = context.WithCancel(ctx)
	h.since = time.Now()
	if h.speaker != nil {
		actx, cancel := context.WithTimeout(ctx, time.Second)
		err := h.speaker.Advertise(actx, h.cfg.VIPAddrs(), bgp.MED(h.term()))
		cancel()
		if err != nil {
			h.log.Error("cannot advertise the VIP over BGP", "err", err)
		}
	} else if h.ann != nil {
		h.group = announce.Start(ctx, h.ann, h.keeper.Valid)
		h.conflicts.Kick()
	}
	if h.shedder != nil {
		h.wg.Go(func() { h.shedder.Run(ctx) })
	}
}

// stop runs on losing leadership; it returns only once the VIP is gone.
func (h *holder) stop(sd election.StepDown) {
	reason := sd.Detail
	if h.keeper != nil && (sd.Cause == election.CauseExpired || sd.Cause == election.CauseLost) {
		// Somebody else may hold the VIP already: it goes before anything
		// else, before any goroutine is waited for or any line logged.
		_ = h.keeper.Release(reason)
	}
	if h.speaker != nil {
		// Before the lock can be taken: the elector releases it only after
		// this returns, and a lease that ran out has already cost the VIP
		// above. The withdrawal is queued on every session here.
		h.withdraw()
	}
	h.mu.Lock()
	wasLeading := h.cancel != nil
	if h.cancel != nil {
		h.cancel()
		h.cancel = nil
	}
	h.group.Stop()
	h.group = nil
	h.mu.Unlock()
	h.wg.Wait()
	h.mu.Lock()
	serving := h.serving
	h.serving = false
	h.mu.Unlock()
	if h.bal != nil && serving {
		// While the VIP is still here, so the resets reach the clients.
		h.bal.SetServing(false)
	}
	if h.guard != nil {
		h.guard.Lease(time.Time{})
	}
	if h.keeper == nil {
		// --bgp-mode ecmp: the VIP is not the lock's.
	} else if err := h.keeper.Release(reason); err != nil {
		// Nothing else can be done; say it loudly. The kernel drops the
		// address when its lifetime runs out.
		h.log.Error("cannot remove the VIP", "err", err)
	} else {
		h.m.vipHeld.Set(0)
	}
	if h.dnat != nil && serving {
		// After the VIP: without it they match nothing.
		if err := dnat.Remove(); err != nil {
			h.log.Error("cannot remove the VIP port's nftables rules; they match nothing without the VIP", "err", err)
		}
	}
	h.m.leader.Set(0)
	if h.events != nil && wasLeading {
		// Losing the lock is worth a warning; a clean stop or a yield is
		// not.
		warn := sd.Cause != election.CauseShutdown && sd.Cause != election.CauseYield
		h.events.Emit(warn, kube.ReasonSteppedDown, "%s stepped down and removed the VIP %s: %s", h.cfg.NodeName, h.cfg.VIPString(), reason)
	}
}

// withdraw withdraws the VIP's route, bounded: a speaker that does not
// answer must not hold up the step-down.
func (h *holder) withdraw() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := h.speaker.Withdraw(ctx); err != nil {
		h.log.Error("cannot withdraw the VIP's route; routers drop it when the session ends", "err", err)
	}
}

// holding tells whether this node holds the VIP, and since when: only the
// holder prunes, and only once it has held the VIP for a whole
// --prune-after.
func (h *holder) holding() (bool, time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.cancel != nil, h.since
}
