package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/vigil-ha/vigil/internal/election"
	"github.com/vigil-ha/vigil/internal/kube"
)

// holder is the order of what becomes true when this node leads, and
// stops being true when it does not: the guard learns each lease deadline
// before the VIP is added; the balancer serves from the first lease; then
// announcements and the raft shedder for the tenure. On the way out the VIP
// goes first when another node may hold it already, and in any case before
// stop returns. Its parts (parts.go) each do one thing, and holder_test.go
// runs this order with fakes of every one.
type holder struct {
	// vip adds and removes the VIP with the lease; noVIP with --bgp-mode
	// ecmp, where the VIP is every healthy node's (ecmpAnnouncer) and the
	// lock only picks the node that prunes. lockVIP says which.
	vip     vipPart
	lockVIP bool
	fence   fencePart // the guard; noFence with --guard=false
	ann     announcer // ARP/NDP, BGP, or noAnnounce (--bgp-mode ecmp)
	// el gives the election's transition count at the start of a tenure,
	// which sets a BGP route's MED. Set once the elector is built.
	el    interface{ Status() election.Status }
	serve servePart // every --lb-port's balancer (none: a no-op)
	// redirect sends VIP:--lb-port to the balancer's --lb-listen-port
	// while this node serves (noRedirect without --lb-listen-port).
	redirect redirectPart
	shedder  *raftShedder // nil without --shed-raft-leadership or etcd
	// handoffs holds this node out of the election while vigil handoff
	// --hold says so; nil without etcd.
	handoffs *handoffs
	m        *nodeMetrics
	events   *kube.Events // nil without --kubeconfig
	cfg      Config
	log      *slog.Logger

	mu      sync.Mutex // guards cancel, since and serving
	serving bool       // whether the balancer serves (set at the first lease of a tenure)
	since   time.Time  // start of the current tenure
	cancel  context.CancelFunc
	wg      sync.WaitGroup // the shedder
}

// lease runs whenever the lease deadline moves: the guard learns it, then
// the keeper, which adds the VIP at the start of a tenure and removes it the
// moment the deadline passes.
func (h *holder) lease(deadline time.Time) {
	h.mu.Lock()
	first := !h.serving
	if first {
		h.serve.SetServing(true) // before the first packet can arrive
		// Before the VIP, too. Without the rules a client still reaches
		// an API server bound to 0.0.0.0 directly, unbalanced: loud,
		// not fatal.
		if err := h.redirect.Install(); err != nil {
			h.log.Error("cannot send the VIP's port to the load balancer; clients reach this node's API server directly", "err", err)
		} else if _, none := h.redirect.(noRedirect); !none {
			h.log.Info("VIP port sent to the load balancer (nftables)", "rules", fmt.Sprint(h.redirect))
		}
	}
	h.serving = true
	h.mu.Unlock()
	if !first {
		h.fence.Lease(deadline)
	} else if !h.fence.Arm(deadline, guardArmWait) {
		h.log.Warn("the VIP guard did not take the lease deadline in time; it will when it reads again", "waited", guardArmWait)
	}
	h.vip.Hold(deadline)
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
// (interface down or gone, adding the address fails), a handoff's hold,
// no guard listening to this vigil (or one silent for too long: half as
// long for a candidate as for the holder), or no BGP session up.
func (h *holder) eligible() error {
	if err := h.vip.Eligible(); err != nil {
		return err
	}
	if h.handoffs != nil {
		if err := h.handoffs.eligible(); err != nil {
			return err
		}
	}
	fence := h.fence.Eligible
	if !h.leading() {
		fence = h.fence.EligibleToCampaign
	}
	if err := fence(); err != nil {
		return err
	}
	return h.ann.Eligible()
}

// start runs on becoming leader, once the VIP is up: announcement at once.
func (h *holder) start(ctx context.Context) {
	h.m.leader.Set(1)
	h.m.leaderRuns.Inc()
	if h.lockVIP { // with --bgp-mode ecmp, ecmpAnnouncer says
		h.m.vipHeld.Set(1)
	}
	if h.events != nil {
		h.events.Emit(false, kube.ReasonBecameLeader, "%s became leader and holds the VIP %s on %s", h.cfg.NodeName, h.cfg.VIPString(), h.cfg.Interface)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	ctx, h.cancel = context.WithCancel(ctx)
	h.since = time.Now()
	h.ann.Announce(ctx, h.el.Status().Transitions)
	if h.shedder != nil {
		h.wg.Go(func() { h.shedder.Run(ctx) })
	}
}

// stop runs on losing leadership; it returns only once the VIP is gone.
func (h *holder) stop(sd election.StepDown) {
	reason := sd.Detail
	if sd.Cause == election.CauseExpired || sd.Cause == election.CauseLost {
		// Somebody else may hold the VIP already: it goes before anything
		// else, before any goroutine is waited for or any line logged.
		_ = h.vip.Release(reason)
	}
	h.mu.Lock()
	cancel := h.cancel
	h.cancel = nil
	h.mu.Unlock()
	wasLeading := cancel != nil
	if wasLeading {
		// Before the lock can be taken: the elector releases it only
		// after this returns, and a lease that ran out has already cost
		// the VIP above.
		h.ann.Withdraw()
		cancel()
	}
	h.wg.Wait()
	h.mu.Lock()
	serving := h.serving
	h.serving = false
	h.mu.Unlock()
	if serving {
		// While the VIP is still here, so the resets reach the clients.
		h.serve.SetServing(false)
	}
	h.fence.Lease(time.Time{})
	if err := h.vip.Release(reason); err != nil {
		// Nothing else can be done; say it loudly. The kernel drops the
		// address when its lifetime runs out.
		h.log.Error("cannot remove the VIP", "err", err)
	} else if h.lockVIP {
		h.m.vipHeld.Set(0)
	}
	if serving {
		// After the VIP: without it they match nothing.
		if err := h.redirect.Remove(); err != nil {
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

// holding tells whether this node holds the VIP, and since when: only the
// holder prunes, and only once it has held the VIP for a whole
// --prune-after.
func (h *holder) holding() (bool, time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.cancel != nil, h.since
}
