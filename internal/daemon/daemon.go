package daemon

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/vigil-ha/vigil/internal/announce"
	"github.com/vigil-ha/vigil/internal/discovery"
	"github.com/vigil-ha/vigil/internal/election"
	"github.com/vigil-ha/vigil/internal/etcdcluster"
	"github.com/vigil-ha/vigil/internal/health"
	"github.com/vigil-ha/vigil/internal/kube"
	"github.com/vigil-ha/vigil/internal/kubelite"
	"github.com/vigil-ha/vigil/internal/lb"
	"github.com/vigil-ha/vigil/internal/membership"
	"github.com/vigil-ha/vigil/internal/observe"
	"github.com/vigil-ha/vigil/internal/vip"
)

// shedInterval is how often the VIP holder checks whether its own etcd member
// leads raft. Raft leadership only lands on it after an etcd election, which
// is rare; checking every 2 s keeps the window in which one crash costs both
// a VIP failover and an etcd election short, at a cost of one Status call per
// member.
const shedInterval = 2 * time.Second

// shedTimeout bounds one check and move: the members' Status answers (half
// a second at most) and etcd's MoveLeader, which returns once the new
// leader has taken over, normally within a few heartbeats.
const shedTimeout = 3 * time.Second

// shedBackoff and shedMaxBackoff space out tries after a failed move.
const (
	shedBackoff    = 10 * time.Second
	shedMaxBackoff = time.Minute
)

// Run validates cfg, prepares the node and runs until ctx is cancelled. Errors
// it returns are configuration or environment errors; an unreachable etcd is
// not one of them (it is retried).
//
// Start order: everything that can fail on bad input or a busy port (the
// VIP's interface, the load balancer's and the metrics listeners) is set up
// before the guard, the lock or any goroutine, so a refused start leaves
// nothing behind.
func Run(ctx context.Context, cfg Config, log *slog.Logger) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	tc, err := cfg.tlsConfig()
	if err != nil {
		return err
	}
	htc, err := cfg.healthTLS()
	if err != nil {
		return err
	}
	log = log.With("node", cfg.NodeName)
	vm, err := vip.New(vip.Config{Address: cfg.VIP, Interface: cfg.Interface, Lifetime: cfg.VIPLifetime}, log)
	if err != nil {
		return err
	}
	ann, err := announce.New(announce.Config{Interface: cfg.Interface, Address: cfg.VIP.Addr(), Interval: cfg.AnnounceInterval}, log)
	if err != nil {
		return err
	}
	defer ann.Close()
	if err := ann.Prepare(); err != nil {
		log.Warn("cannot prepare announcements; will retry when leading", "err", err)
	}
	// A VIP left behind by a crash of this node must go before anything
	// else: this process does not lead yet.
	if err := vm.Remove("stale address from an earlier run; this node does not lead"); err != nil {
		return err
	}

	m := newNodeMetrics()
	var checker *health.Checker
	var bal *lb.Balancer
	if cfg.LBPort != 0 {
		policy, _ := lb.ParsePolicy(cfg.LBPolicy) // validated
		bal, err = lb.New(lb.Config{
			Listen:       netip.AddrPortFrom(cfg.VIP.Addr(), uint16(cfg.LBPort)).String(),
			Picker:       policy,
			FreeBind:     true,
			DrainTimeout: cfg.LBDrainTimeout,
			MaxConns:     cfg.LBMaxConns, MaxConnsPerSource: cfg.LBMaxConnsPerSource, IdleTimeout: cfg.LBIdleTimeout,
			// Passive checking: a refused connection ejects the backend
			// before its next health check; a timed-out one counts as a
			// failed check.
			OnDialError: func(b string, err error) { checker.DialFailed(b, err) },
			Metrics:     m.reg,
			Standby:     true, // serving only while holding the VIP
		}, log)
		if err != nil {
			return fmt.Errorf("%w: %w", ErrConfig, err)
		}
	}
	var metricsLn net.Listener
	if cfg.MetricsAddress != "" {
		if metricsLn, err = listenMetrics(cfg.MetricsAddress); err != nil {
			if bal != nil {
				bal.Close()
			}
			return err
		}
	}
	var mac string
	if ifi, ierr := net.InterfaceByName(cfg.Interface); ierr == nil {
		mac = ifi.HardwareAddr.String()
	}
	checker, err = health.New(health.Config{
		Path: cfg.HealthPath, Port: cfg.HealthPort, TLS: htc,
		Interval: cfg.HealthInterval, Timeout: cfg.HealthTimeout, Rise: cfg.HealthRise, Fall: cfg.HealthFall,
		OnChange: func(st health.Status) {
			if bal != nil {
				bal.Update(st)
			}
		},
		Metrics: m.reg,
	}, log)
	if err == nil {
		err = runNode(ctx, cfg, tc, log, vm, ann, mac, m, checker, bal, metricsLn)
		checker.Close()
		return err
	}
	if bal != nil {
		bal.Close()
	}
	if metricsLn != nil {
		metricsLn.Close()
	}
	return fmt.Errorf("%w: %w", ErrConfig, err)
}

// runNode is Run once every listener is open.
func runNode(ctx context.Context, cfg Config, tc *tls.Config, log *slog.Logger, vm *vip.Manager, ann *announce.Announcer, mac string,
	m *nodeMetrics, checker *health.Checker, bal *lb.Balancer, metricsLn net.Listener) error {
	// Components that must outlive the elector's shutdown (the balancer
	// closes its connections only after the VIP is gone) run on their own
	// context, cancelled after the elector has stepped down.
	cctx, stopComponents := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() {
		stopComponents()
		wg.Wait()
	}()
	if bal != nil {
		wg.Add(1)
		go func() { defer wg.Done(); _ = bal.Run(cctx) }()
	}
	var guard *guardProc
	if cfg.GuardSocket != "" {
		gctx, stopGuard := context.WithCancel(context.Background())
		g := connectGuard(gctx, cfg.GuardSocket, cfg, log)
		guard = g
		defer func() { stopGuard(); g.Close() }()
	} else if cfg.GuardBinary != "" {
		// Its own context: the guard must outlive the VIP's removal at
		// shutdown, and is stopped only after it.
		gctx, stopGuard := context.WithCancel(context.Background())
		g, err := startGuard(gctx, cfg.GuardBinary, cfg, log)
		if err != nil {
			stopGuard()
			if metricsLn != nil {
				metricsLn.Close()
			}
			return err
		}
		guard = g
		defer func() { stopGuard(); g.Close() }()
	}
	// etcd, when given, serves the etcd election, API server discovery,
	// membership checks and raft leadership shedding; with the Kubernetes
	// election it is optional.
	// One connection to etcd for the whole process (etcdcluster): the
	// lock, discovery and membership share it and its member list.
	var etcd *etcdcluster.Cluster
	var etcdLock *election.EtcdLock
	var err error
	if len(cfg.EtcdEndpoints) > 0 {
		if etcd, err = etcdcluster.New(etcdcluster.Config{Endpoints: cfg.EtcdEndpoints, TLS: tc, ListInterval: discovery.DefaultInterval}, log.With("component", "etcd")); err != nil {
			return err
		}
		defer etcd.Close()
		etcdLock = election.NewEtcdLockOn(etcd, cfg.LockKey, log)
	}
	// The Kubernetes API, when given, serves the Lease election, Events,
	// EndpointSlice discovery and Node deletion.
	var kc kubernetes.Interface
	var events *kube.Events
	if cfg.Kubeconfig != "" {
		if kc, err = kube.NewClient(cfg.Kubeconfig); err != nil {
			return fmt.Errorf("%w: %w", ErrConfig, err)
		}
		ref := kube.NodeRef(cfg.NodeName)
		if cfg.Election == ElectionKubernetes {
			ref = kube.LeaseRef(cfg.LeaseNamespace, cfg.LeaseName)
		}
		events = kube.NewEvents(kc, ref, cfg.NodeName, log)
		// After the elector has stepped down (the last Event is queued
		// then), before the process ends.
		defer events.Close(eventsFlushTimeout)
	}
	var lock election.Lock
	var prober election.Prober
	switch cfg.Election {
	case ElectionKubernetes:
		lock = election.NewLeaseLock(kc.CoordinationV1(), cfg.LeaseNamespace, cfg.LeaseName)
	default:
		lock, prober = etcdLock, etcdLock
	}

	dcfg := discovery.Config{
		Port: cfg.BackendPort, Static: cfg.Backends,
		OnChange: func(b []string) {
			if bal != nil {
				bal.SetBackends(b)
			}
			checker.Set(b)
		},
	}
	if cfg.discovers(DiscoveryEtcd) {
		dcfg.Members = etcd
	}
	var disc *discovery.Discovery
	if cfg.discovers(DiscoveryKubernetes) {
		hc, err := kube.HTTPClient(cfg.Kubeconfig)
		if err != nil {
			return fmt.Errorf("%w: %w", ErrConfig, err)
		}
		// disc is set before Run starts the follower, the only caller.
		dcfg.Published = kubelite.NewAPIServers(hc, func([]string) { disc.PublishedChanged() }, log)
	}
	// No source and no static backend (--discovery none, no --lb-port):
	// nothing to check or balance, the VIP alone.
	if dcfg.Members != nil || dcfg.Published != nil || len(dcfg.Static) > 0 {
		if disc, err = discovery.New(dcfg, log); err != nil {
			return fmt.Errorf("%w: %w", ErrConfig, err)
		}
		wg.Add(1)
		go func() { defer wg.Done(); _ = disc.Run(cctx) }()
	}

	h := &holder{ann: ann, lock: etcdLock, bal: bal, m: m, cfg: cfg, log: log, disc: disc, kube: kc, events: events, guard: guard}
	h.keeper = vip.NewKeeper(vm, vip.KeeperConfig{
		OnStray: func() {
			m.strays.Inc()
			if events != nil {
				events.Emit(true, kube.ReasonStrayVIP, "%s removed the VIP %s from %s: it does not hold the lock, yet the address was there", cfg.NodeName, cfg.VIP, cfg.Interface)
			}
		},
		OnRestored: func() {
			m.restored.Inc()
			if h.keeper.Valid() {
				if err := ann.Once(); err != nil {
					log.Warn("announcement failed", "err", err)
				}
			}
		},
	}, log)
	wg.Add(1)
	go func() { defer wg.Done(); _ = h.keeper.Run(cctx) }()
	if etcdLock != nil {
		// Every node observes the members and publishes its view; the
		// VIP holder also prunes what a majority agrees is gone.
		mlog := log.With("component", "membership")
		if cfg.PruneAfter > 0 && cfg.PruneAfter < QuietPruneAfter {
			mlog.Warn("--prune-after is short: removing a powered-off member this soon after its death can stall etcd, and with it the VIP, for up to 5 s while etcd's leader times out its writes to that machine; use 30s or more (minutes in production)", "prune_after", cfg.PruneAfter)
		}
		members, err := membership.New(membership.Config{Etcd: etcd}, mlog)
		if err != nil {
			return fmt.Errorf("%w: %w", ErrConfig, err)
		}
		defer members.Close()
		if cfg.PruneDeleteNode {
			h.nodes = newNodeReaper(kc, cfg.PruneAfter, mlog)
		}
		obs := membership.NewObserver(members, membership.ObserverConfig{
			Node: cfg.NodeName, Member: cfg.EtcdMemberName, PruneAfter: cfg.PruneAfter,
			Holding: h.holding, OnRound: h.membersObserved, OnPruned: h.pruned,
		}, mlog)
		wg.Add(1)
		go func() { defer wg.Done(); obs.Run(cctx) }()
	}
	ecfg := election.Config{
		Identity:        cfg.NodeName,
		MAC:             mac,
		Eligible:        h.eligible,
		Lock:            lock,
		Prober:          prober,
		LeaseDuration:   cfg.LeaseDuration,
		RenewDeadline:   cfg.RenewDeadline,
		RetryPeriod:     cfg.RetryPeriod,
		ReleaseOnCancel: true,
		Callbacks: election.Callbacks{
			OnLease:          h.lease,
			OnStartedLeading: h.start,
			OnStoppedLeading: h.stop,
			OnNewLeader: func(string) {
				m.transitions.Inc()
				h.holderChanged.Store(time.Now().UnixNano())
			},
			OnRenew: m.observeRenew,
		},
	}
	var pl *placement
	if cfg.HealthGrace > 0 {
		pl = &placement{checker: checker, grace: cfg.HealthGrace, vip: cfg.VIP.Addr(), log: log, gauge: m.yielding}
		ecfg.Yield = pl.yield
		ecfg.YieldFor = yieldFor(cfg.LeaseDuration)
	}
	el, err := election.New(ecfg, log)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	h.conflicts = &conflicts{
		iface: cfg.Interface, vip: cfg.VIP.Addr(), kick: make(chan struct{}, 1), events: events, log: log,
		total: m.conflicts, gauge: m.conflict,
		expected: func() (string, string, time.Time, bool) {
			st := el.Status()
			return st.Holder, st.HolderMAC, time.Unix(0, h.holderChanged.Load()), time.Since(st.Seen) < conflictFresh
		},
	}
	wg.Add(1)
	go func() { defer wg.Done(); h.conflicts.Run(cctx) }()
	if metricsLn != nil {
		done := observe.Serve(cctx, metricsLn, m.reg, func() any { return report(cfg, el, checker, bal, pl, disc, h.conflicts) }, log)
		defer func() { stopComponents(); <-done }()
	}
	log.Info("vigil starting", "vip", cfg.VIP.String(), "interface", cfg.Interface, "election", cfg.Election,
		"lease_duration", cfg.LeaseDuration, "renew_deadline", cfg.RenewDeadline, "retry_period", cfg.RetryPeriod,
		"lb_port", cfg.LBPort, "backend_port", cfg.BackendPort, "health_grace", cfg.HealthGrace)
	if cfg.Election == ElectionEtcd {
		// A second process with this node name is refused here, before it
		// campaigns. Revoked after the step-down, so a restart claims the
		// name at once.
		claim, err := etcdLock.ClaimName(ctx, cfg.NodeName, el.Instance(), log)
		if errors.Is(err, election.ErrDuplicateIdentity) {
			return err
		}
		if err == nil { // otherwise ctx is done and el.Run returns at once
			defer claim.Close()
		}
	}
	if cfg.Election == ElectionKubernetes && etcdLock != nil {
		// Nodes still on the etcd election may hold the VIP. Retire that
		// election first: it waits until its holder has released the lock or
		// let it expire, and then marks it so no etcd candidate takes it
		// again. Only then may this node campaign on the Lease.
		if err := election.Retire(ctx, etcdLock, "lease "+cfg.LeaseNamespace+"/"+cfg.LeaseName, cfg.RetryPeriod, log); err != nil {
			log.Debug("stopped before the etcd election was retired", "err", err) // ctx is done: Run returns at once
		}
	}
	err = el.Run(ctx)
	h.stop(election.StepDown{Cause: election.CauseShutdown, Detail: "shutting down"}) // idempotent; covers a Run that returned while leading
	stopComponents()
	wg.Wait()
	log.Info("vigil stopped")
	return err
}

// eventsFlushTimeout bounds how long a stopping vigil waits for its last
// Events (the step-down) to reach the API server.
const eventsFlushTimeout = 2 * time.Second

// yieldFor is how long a node whose API server fails stands by before it
// takes a free lock anyway. A healthy peer takes a released lock within a
// retry period (it watches the key) and an expired one at the same moment as
// the yielding node would; three lease durations leave it ample room.
func yieldFor(lease time.Duration) time.Duration { return 3 * lease }

// holder is what a leader holds: the VIP (through its keeper), its announcer
// and the raft leadership shedder.
type holder struct {
	keeper *vip.Keeper
	guard  *guardProc // nil with --guard=false
	ann    *announce.Announcer
	lock   *election.EtcdLock
	bal    *lb.Balancer // nil without --lb-port
	m      *nodeMetrics

	nodes *nodeReaper // nil without --prune-delete-node
	// memberSeries are the members with a vigil_member_unreachable_seconds
	// series; used by membersObserved only.
	memberSeries map[string]bool
	disc         *discovery.Discovery // nil without any backend source
	kube         kubernetes.Interface // nil without --kubeconfig
	events       *kube.Events         // nil without --kubeconfig
	cfg          Config
	log          *slog.Logger

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
	h.serving = true
	h.mu.Unlock()
	if h.guard != nil {
		if !first {
			h.guard.Lease(deadline)
		} else if !h.guard.Arm(deadline, guardArmWait) {
			h.log.Warn("the VIP guard did not take the lease deadline in time; it will when it reads again", "waited", guardArmWait)
		}
	}
	h.keeper.Hold(deadline)
}

// guardArmWait bounds how long a new holder waits for its first deadline to
// reach the guard before it adds the VIP. A write to a listening guard takes
// microseconds; the bound matters only for a guard that stopped reading.
const guardArmWait = 100 * time.Millisecond

// eligible is why this node cannot hold the VIP now: the keeper's reasons
// (interface down or gone, adding the address fails) or, with a guard, that
// no guard listens to this vigil.
func (h *holder) eligible() error {
	if err := h.keeper.Eligible(); err != nil {
		return err
	}
	if h.guard != nil {
		return h.guard.Eligible()
	}
	return nil
}

// start runs on becoming leader, once the VIP is up: announcement at once.
func (h *holder) start(ctx context.Context) {
	h.m.leader.Set(1)
	h.m.leaderRuns.Inc()
	h.m.vipHeld.Set(1)
	if h.events != nil {
		h.events.Emit(false, kube.ReasonBecameLeader, "%s became leader and holds the VIP %s on %s", h.cfg.NodeName, h.cfg.VIP, h.cfg.Interface)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	ctx, h.cancel = context.WithCancel(ctx)
	h.since = time.Now()
	h.group = announce.Start(ctx, h.ann, h.keeper.Valid)
	h.conflicts.Kick()
	if h.cfg.ShedRaftLeadership && h.lock != nil {
		h.wg.Add(1)
		go func() {
			defer h.wg.Done()
			h.shed(ctx)
		}()
	}
}

// stop runs on losing leadership; it returns only once the VIP is gone.
func (h *holder) stop(sd election.StepDown) {
	reason := sd.Detail
	if sd.Cause == election.CauseExpired || sd.Cause == election.CauseLost {
		// Somebody else may hold the VIP already: it goes before anything
		// else, before any goroutine is waited for or any line logged.
		_ = h.keeper.Release(reason)
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
	if err := h.keeper.Release(reason); err != nil {
		// Nothing else can be done; say it loudly. The kernel drops the
		// address when its lifetime runs out.
		h.log.Error("cannot remove the VIP", "err", err)
	} else {
		h.m.vipHeld.Set(0)
	}
	h.m.leader.Set(0)
	if h.events != nil && wasLeading {
		// Losing the lock is worth a warning; a clean stop or a yield is
		// not.
		warn := sd.Cause != election.CauseShutdown && sd.Cause != election.CauseYield
		h.events.Emit(warn, kube.ReasonSteppedDown, "%s stepped down and removed the VIP %s: %s", h.cfg.NodeName, h.cfg.VIP, reason)
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

// membersObserved runs after every observation of the members, with this
// node's view of them.
func (h *holder) membersObserved(ctx context.Context, v membership.View, own membership.Report) {
	seen := map[string]bool{}
	for _, s := range own.Members {
		seen[s.Name] = true
		h.m.memberDown.WithLabelValues(s.Name).Set(s.Down().Seconds())
	}
	for name := range h.memberSeries {
		if !seen[name] {
			h.m.memberDown.DeleteLabelValues(name) // removed from etcd
		}
	}
	h.memberSeries = seen
	if h.nodes != nil {
		h.nodes.observe(ctx, v, h.nodeDeleted)
	}
}

// pruned runs for every member this node pruned.
func (h *holder) pruned(ctx context.Context, m membership.Member) {
	h.m.prunes.Inc()
	h.log.Info("pruned a dead etcd member", "member", m.Label())
	if h.disc != nil {
		h.disc.Refresh() // its API server leaves the load balancer now
	}
	if h.nodes != nil {
		h.nodes.pruned(ctx, m.Name, h.nodeDeleted)
	}
}

func (h *holder) nodeDeleted(name string) {
	h.m.nodesDeleted.Inc()
	if h.events != nil {
		h.events.Emit(false, kube.ReasonNodeDeleted, "%s deleted Node %s: its etcd member was pruned and its kubelet had not renewed its Lease for %v", h.cfg.NodeName, name, h.cfg.PruneAfter)
	}
}

// shed keeps etcd raft leadership off this node while it holds the VIP.
// A failed move stalled etcd's writes while it lasted, so after one the
// next try waits shedBackoff, doubling up to shedMaxBackoff.
func (h *holder) shed(ctx context.Context) {
	t := time.NewTicker(shedInterval)
	defer t.Stop()
	var backoffUntil time.Time
	backoff := shedBackoff
	deferred := ""
	for {
		if time.Now().After(backoffUntil) {
			cctx, cancel := context.WithTimeout(ctx, shedTimeout)
			to, err := h.lock.ShedRaftLeadership(cctx, h.cfg.EtcdMemberName)
			cancel()
			switch {
			case ctx.Err() != nil:
				return
			case errors.Is(err, election.ErrShedDeferred):
				if err.Error() != deferred {
					h.log.Info("not moving etcd raft leadership off the VIP holder yet", "reason", err)
					deferred = err.Error()
				}
			case err != nil:
				h.log.Warn("cannot move etcd leadership off the VIP holder; waiting before the next try", "err", err, "wait", backoff)
				backoffUntil = time.Now().Add(backoff)
				backoff = min(2*backoff, shedMaxBackoff)
				deferred = ""
			default:
				if to != "" {
					h.log.Info("moved etcd raft leadership off the VIP holder", "member", h.cfg.EtcdMemberName, "to", to)
				}
				backoff, deferred = shedBackoff, ""
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
