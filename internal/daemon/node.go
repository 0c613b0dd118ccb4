package daemon

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"

	"github.com/vigil-ha/vigil/internal/announce"
	"github.com/vigil-ha/vigil/internal/bgp"
	"github.com/vigil-ha/vigil/internal/discovery"
	"github.com/vigil-ha/vigil/internal/dnat"
	"github.com/vigil-ha/vigil/internal/election"
	"github.com/vigil-ha/vigil/internal/etcdcluster"
	"github.com/vigil-ha/vigil/internal/handoff"
	"github.com/vigil-ha/vigil/internal/health"
	"github.com/vigil-ha/vigil/internal/kube"
	"github.com/vigil-ha/vigil/internal/kubelite"
	"github.com/vigil-ha/vigil/internal/lb"
	"github.com/vigil-ha/vigil/internal/membership"
	"github.com/vigil-ha/vigil/internal/netmon"
	"github.com/vigil-ha/vigil/internal/observe"
	"github.com/vigil-ha/vigil/internal/validate"
	"github.com/vigil-ha/vigil/internal/vip"
)

// Run validates cfg, builds the node and runs it until ctx is cancelled.
// Errors it returns are configuration or environment errors; an unreachable
// etcd is not one of them (it is retried).
func Run(ctx context.Context, cfg Config, log *slog.Logger) error {
	n, err := newNode(cfg, log)
	if err != nil {
		return err
	}
	defer n.Close()
	return n.Run(ctx)
}

// eventsFlushTimeout bounds how long a stopping vigil waits for its last
// Events (the step-down) to reach the API server.
const eventsFlushTimeout = 2 * time.Second

// yieldFor is how long a node whose API server fails stands by before it
// takes a free lock anyway. A healthy peer takes a released lock within a
// retry period (it watches the key) and an expired one at the same moment as
// the yielding node would; three lease durations leave it ample room.
func yieldFor(lease time.Duration) time.Duration { return 3 * lease }

// node is one vigil run. newNode builds every part, Run runs them and the
// election, Close releases what newNode acquired.
//
// Build order: everything that can fail on bad input or a busy port (the
// TLS files, the VIP's interface, the load balancer's and the metrics
// listeners) comes before the guard, the etcd client or any goroutine, so a
// refused start leaves nothing behind. The parts do not call each other:
// those that follow the API servers are given the methods of wire (the
// balancer tells the checker of failed dials, the checker tells the
// balancer of health, discovery feeds both), and what the parts report
// goes to notes. wire is filled once every part is built, before Run
// starts anything that calls back.
type node struct {
	cfg Config
	log *slog.Logger
	m   *nodeMetrics

	mon       *netmon.Monitor     // this namespace's links and addresses
	ann       *announce.Announcer // nil with --announce bgp
	speaker   *bgp.Speaker        // nil without --announce bgp
	bal       *lb.Balancer        // nil without --lb-port
	more      []*servedPort       // the --lb-ports after the first
	metricsLn net.Listener        // nil without --metrics-address
	checker   *health.Checker     // health of the API servers
	guard     *guardProc          // nil with --guard=false
	etcd      *etcdcluster.Cluster
	etcdLock  *election.EtcdLock // nil without etcd
	kc        kubernetes.Interface
	events    *kube.Events         // nil without --kubeconfig
	disc      *discovery.Discovery // nil without any backend source
	observer  *membership.Observer // nil without etcd
	h         *holder
	keeper    *vip.Keeper // the lock's VIP; nil with --bgp-mode ecmp
	conflicts *conflicts  // the VIP conflict probe (run with ARP/NDP only)
	// holderChanged is when the observed holder last changed (UnixNano).
	holderChanged atomic.Int64
	el            *election.Elector
	pl            *placement     // nil without --health-grace
	ecmp          *ecmpAnnouncer // nil without --bgp-mode ecmp
	feed          *feedPart      // nil without --agent-feed-listen
	wire          *apiWiring
	notes         *notices

	// closers release what was acquired, in the order acquired; Close runs
	// them backwards.
	closers []func()
}

func (n *node) onClose(f func()) { n.closers = append(n.closers, f) }

// Close releases what newNode acquired, the last first. After Run, that
// order is: the membership client; the Events queue, flushed (it holds the
// step-down); the etcd client; the guard, once the VIP is gone (Run has
// removed it); the health checker; the metrics and load balancer
// listeners; the announcer's sockets. Safe to call more than once.
func (n *node) Close() {
	for i := len(n.closers) - 1; i >= 0; i-- {
		n.closers[i]()
	}
	n.closers = nil
}

// newNode builds the node; on error it has released everything it took.
func newNode(cfg Config, log *slog.Logger) (_ *node, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	tc, err := cfg.tlsConfig()
	if err != nil {
		return nil, err
	}
	htc, err := cfg.healthTLS()
	if err != nil {
		return nil, err
	}
	log = log.With("node", cfg.NodeName)
	n := &node{cfg: cfg, log: log, m: newNodeMetrics(), wire: &apiWiring{}}
	n.notes = &notices{node: cfg.NodeName, vip: cfg.VIPString(), iface: cfg.Interface, m: n.m, holderChanged: &n.holderChanged}
	defer func() { // a return nil, err releases what was taken so far
		if err != nil {
			n.Close()
		}
	}()

	if n.mon, err = netmon.New(log); err != nil {
		return nil, err
	}
	n.onClose(n.mon.Close)
	lifetime := cfg.VIPLifetime
	if cfg.ecmp() {
		// Carried for as long as vigil runs, not for a lease: the route,
		// not the address, decides where traffic goes.
		lifetime = 0
	}
	vm, err := vip.New(vip.Config{Address: cfg.VIPs[0], Also: cfg.VIPs[1:], Interface: cfg.Interface, Lifetime: lifetime}, log)
	if err != nil {
		return nil, err
	}
	if cfg.Announce == AnnounceBGP {
		if n.speaker, err = bgp.New(cfg.BGP, log); err != nil {
			return nil, validate.Invalid(err)
		}
		// Runs from Run; closed (CEASE to every peer) after the VIP is gone.
		n.onClose(n.speaker.Close)
		n.m.registerBGP(n.speaker)
	} else {
		if n.ann, err = announce.New(announce.Config{Interface: cfg.Interface, Address: cfg.VIPs[0].Addr(), Also: cfg.VIPAddrs()[1:], Interval: cfg.AnnounceInterval, Links: n.mon}, log); err != nil {
			return nil, err
		}
		n.onClose(func() { n.ann.Close() })
		if err := n.ann.Prepare(); err != nil {
			log.Warn("cannot prepare announcements; will retry when leading", "err", err)
		}
	}
	// A VIP left behind by a crash of this node must go before anything
	// else: this process does not lead yet. So must its nftables rules
	// (--lb-listen-port), which would send VIP:--lb-port to a port that
	// may no longer be the balancer's.
	if err := vm.Remove("stale address from an earlier run; this node does not lead"); err != nil {
		return nil, err
	}
	if err := dnat.Remove(); err != nil {
		if cfg.LBListenPort != 0 {
			return nil, fmt.Errorf("`lbListenPort` needs nftables: %w", err)
		}
		log.Debug("cannot look for stale VIP port rules (nftables)", "err", err)
	}
	if err := n.openListeners(); err != nil {
		return nil, err
	}
	var hreg prometheus.Registerer = n.m.reg
	if cfg.LBPort != 0 {
		hreg = portRegisterer(n.m.reg, cfg.LBPort)
	}
	if n.checker, err = health.New(health.Config{
		Path: cfg.HealthPath, Scheme: cfg.healthScheme(), Port: cfg.HealthPort, TLS: htc,
		Interval: cfg.HealthInterval, Timeout: cfg.HealthTimeout, Rise: cfg.HealthRise, Fall: cfg.HealthFall,
		OnChange: n.wire.healthChanged,
		Metrics:  hreg,
	}, log); err != nil {
		return nil, validate.Invalid(err)
	}
	n.onClose(n.checker.Close)
	if n.feed != nil {
		n.feed.checker = n.checker
	}
	for _, p := range n.more {
		scheme, path := "https", p.spec.Check
		if path == CheckTCP {
			scheme, path = health.SchemeTCP, ""
		}
		if p.checker, err = health.New(health.Config{
			Path: path, Scheme: scheme, TLS: htc,
			Interval: cfg.HealthInterval, Timeout: cfg.HealthTimeout, Rise: cfg.HealthRise, Fall: cfg.HealthFall,
			OnChange: p.healthChanged,
			Metrics:  portRegisterer(n.m.reg, p.spec.Port),
		}, log.With("port", p.spec.Port)); err != nil {
			return nil, validate.Invalid(err)
		}
		n.onClose(p.checker.Close)
	}
	if err := n.startGuard(); err != nil {
		return nil, err
	}
	if err := n.connect(tc); err != nil {
		return nil, err
	}
	if err := n.newDiscovery(); err != nil {
		return nil, err
	}
	n.conflicts = &conflicts{
		iface: cfg.Interface, links: n.mon, vips: cfg.VIPAddrs(), kick: make(chan struct{}, 1), events: n.events, log: n.log,
		total: n.m.conflicts, gauge: n.m.conflict, untracked: n.m.conflictUntracked, changed: &n.holderChanged,
	}
	n.h = n.newHolder(vm)
	if err := n.newObserver(); err != nil {
		return nil, err
	}
	if err := n.newElector(); err != nil {
		return nil, err
	}
	n.connectParts()
	return n, nil
}

// connectParts fills the wiring between the parts once all are built.
func (n *node) connectParts() {
	w := n.wire
	w.checker = n.checker
	if n.bal != nil {
		w.bal = n.bal
	}
	for _, p := range n.more {
		w.more = append(w.more, p)
	}
	if n.ecmp != nil {
		w.ecmp = n.ecmp
	}
	if n.feed != nil {
		w.feed = n.feed
	}
	if n.disc != nil {
		w.disc = n.disc
	}
}

// newHolder gives the holder its parts, a no-op for each that this
// configuration leaves out.
func (n *node) newHolder(vm *vip.Manager) *holder {
	cfg, log := n.cfg, n.log
	h := &holder{
		vip: noVIP{}, fence: noFence{}, ann: noAnnounce{}, redirect: noRedirect{}, serve: balancers(nil),
		m: n.m, cfg: cfg, log: log, events: n.events,
	}
	if n.guard != nil {
		h.fence = n.guard
	}
	if rules := cfg.dnatRules(); rules != nil {
		h.redirect = dnatRules(rules)
	}
	if cfg.ShedRaftLeadership && n.etcdLock != nil {
		h.shedder = &raftShedder{lock: n.etcdLock, member: cfg.EtcdMemberName, slowMove: cfg.RenewDeadline / 2, log: log}
	}
	if cfg.ecmp() {
		// The VIP, its balancers and its route are every healthy node's;
		// the lock holder only prunes.
		n.ecmp = newECMP(vm, n.speaker, n.balancers(), n.checker, cfg.VIPAddrs(), n.mon, n.m.vipHeld, log)
	} else {
		n.keeper = n.newKeeper(vm)
		h.vip, h.lockVIP = n.keeper, true
		h.serve = n.balancers()
		switch {
		case n.speaker != nil:
			h.ann = &bgpAnnouncer{speaker: n.speaker, addrs: cfg.VIPAddrs(), log: log}
		case n.ann != nil:
			arp := &arpAnnouncer{ann: n.ann, keeper: n.keeper, conflicts: n.conflicts, log: log}
			h.ann, n.notes.reannounce = arp, arp
		}
	}
	if n.etcd != nil {
		// Planned handoffs (vigil handoff) come through etcd. With
		// --bgp-mode ecmp every node serves whoever leads: a handoff
		// drains nothing.
		var bal balancers
		if h.lockVIP {
			bal = n.balancers()
		}
		h.handoffs = newHandoffs(handoff.NewStore(n.etcd, ""), cfg.NodeName, bal, h.leading, n.log)
	}
	return h
}

// newKeeper is the lock's VIP: added and refreshed with each lease,
// removed at the deadline; an address found without the lock is removed.
func (n *node) newKeeper(vm *vip.Manager) *vip.Keeper {
	return vip.NewKeeper(vm, vip.KeeperConfig{OnStray: n.notes.strayVIP, OnRestored: n.notes.restoredVIP, Changes: n.mon.Changes()}, n.log)
}

// openListeners opens the load balancers' listeners (bound to the VIP with
// IP_FREEBIND, so a busy port is found now) and the metrics listener.
func (n *node) openListeners() error {
	cfg := n.cfg
	if cfg.LBPort != 0 {
		// Passive checking: a refused connection ejects the backend
		// before its next health check; a timed-out one counts as a
		// failed check.
		bal, err := n.newBalancer(cfg.listenPort(), cfg.LBPort, false, n.wire.dialFailed)
		if err != nil {
			return err
		}
		n.bal = bal
	}
	for _, spec := range cfg.MorePorts {
		p := &servedPort{spec: spec}
		// Whatever the port speaks: its server may speak first.
		bal, err := n.newBalancer(spec.Port, spec.Port, true, p.dialFailed)
		if err != nil {
			return err
		}
		p.bal = bal
		n.more = append(n.more, p)
	}
	if cfg.MetricsAddress != "" {
		ln, err := listenMetrics(cfg.MetricsAddress)
		if err != nil {
			return err
		}
		n.metricsLn = ln
		n.onClose(func() { _ = ln.Close() })
	}
	return n.newFeedPart()
}

// newBalancer opens a balancer on VIP:listen (every VIP address) for the
// port clients know as port; it serves only while this node holds the VIP.
// The API servers' clients speak first (TLS); serverFirst is for a port
// whose protocol is not known (lb.Config.ServerSpeaksFirst).
func (n *node) newBalancer(listen, port int, serverFirst bool, onDialError func(string, error)) (*lb.Balancer, error) {
	cfg := n.cfg
	policy, _ := lb.ParsePolicy(cfg.LBPolicy) // validated
	first, also := listenAddrs(cfg, listen)
	log := n.log
	if len(cfg.MorePorts) > 0 {
		log = log.With("port", port)
	}
	bal, err := lb.New(lb.Config{
		Listen:       first,
		AlsoListen:   also,
		Picker:       policy,
		FreeBind:     true,
		DrainTimeout: cfg.LBDrainTimeout,
		MaxConns:     cfg.LBMaxConns, MaxConnsPerSource: cfg.LBMaxConnsPerSource, IdleTimeout: cfg.LBIdleTimeout,
		Loops:             cfg.LBEventLoops,
		ServerSpeaksFirst: serverFirst,
		OnDialError:       onDialError,
		Metrics:           portRegisterer(n.m.reg, port),
		Standby:           true,
	}, log)
	if err != nil {
		return nil, validate.Invalid(err)
	}
	n.onClose(bal.Close)
	return bal, nil
}

// balancers are every port's balancer, nil without --lb-port.
func (n *node) balancers() balancers {
	if n.bal == nil {
		return nil
	}
	out := balancers{n.bal}
	for _, p := range n.more {
		out = append(out, p.bal)
	}
	return out
}

// startGuard connects to the guard container's socket, or starts the guard
// as a child. Either runs on its own context: the guard must outlive the
// VIP's removal at shutdown, and is stopped only after it (Close).
func (n *node) startGuard() error {
	if n.cfg.ecmp() && (n.cfg.GuardSocket != "" || n.cfg.GuardBinary != "") {
		// The guard fences a lock holder's VIP; with ecmp the VIP is not
		// the lock's, and the routers drop a dead node's route.
		n.log.Info("no VIP guard with --bgp-mode ecmp: a node that dies is withdrawn by its BGP (and BFD) sessions")
		return nil
	}
	gctx, stopGuard := context.WithCancel(context.Background())
	switch {
	case n.cfg.GuardSocket != "":
		n.guard = connectGuard(gctx, n.cfg.GuardSocket, n.cfg, n.log)
	case n.cfg.GuardBinary != "":
		g, err := startGuard(gctx, n.cfg.GuardBinary, n.cfg, n.log)
		if err != nil {
			stopGuard()
			return err
		}
		n.guard = g
	default:
		stopGuard()
		return nil
	}
	g := n.guard
	n.onClose(func() { stopGuard(); g.Close() })
	n.m.registerGuard(g)
	return nil
}

// connect makes the process's one etcd client (etcdcluster: the lock,
// discovery and membership share it and its member list) and its
// Kubernetes client, each when configured. etcd serves the etcd election,
// API server discovery, membership checks and raft leadership shedding;
// with the Kubernetes election it is optional. The Kubernetes API serves
// the Lease election, Events, EndpointSlice discovery and Node deletion.
func (n *node) connect(tc *tls.Config) error {
	cfg := n.cfg
	if len(cfg.EtcdEndpoints) > 0 {
		etcd, err := etcdcluster.New(etcdcluster.Config{Endpoints: cfg.EtcdEndpoints, TLS: tc, ListInterval: discovery.DefaultInterval,
			OnForeign: n.notes.foreignEtcd}, n.log.With("component", "etcd"))
		if err != nil {
			return err
		}
		n.etcd, n.notes.etcd = etcd, etcd
		n.m.registerEtcd(etcd)
		n.onClose(etcd.Close)
		n.etcdLock = election.NewEtcdLockOn(etcd, cfg.LockKey, n.log)
	}
	if cfg.Kubeconfig != "" {
		kc, err := kube.NewClient(cfg.Kubeconfig)
		if err != nil {
			return validate.Invalid(err)
		}
		n.kc = kc
		ref := kube.NodeRef(cfg.NodeName)
		if cfg.Election == ElectionKubernetes {
			ref = kube.LeaseRef(cfg.LeaseNamespace, cfg.LeaseName)
		}
		n.events = kube.NewEvents(kc, ref, cfg.NodeName, n.log)
		n.notes.events = n.events
		// After the elector has stepped down (the last Event is queued
		// then), before the process ends.
		n.onClose(func() { n.events.Close(eventsFlushTimeout) })
	}
	return nil
}

// newDiscovery wires the backend sources; none (--discovery none and no
// --lb-port) leaves n.disc nil: nothing to check or balance, the VIP alone.
func (n *node) newDiscovery() error {
	cfg := n.cfg
	dcfg := discovery.Config{
		Port: cfg.BackendPort, Static: cfg.Backends, OnChange: n.wire.backendsChanged,
	}
	if cfg.discovers(DiscoveryEtcd) {
		dcfg.Members = n.etcd
	}
	if cfg.discovers(DiscoveryKubernetes) {
		hc, err := kube.HTTPClient(cfg.Kubeconfig)
		if err != nil {
			return validate.Invalid(err)
		}
		dcfg.Published = kubelite.NewAPIServers(hc, n.wire.publishedChanged, n.log)
	}
	if dcfg.Members == nil && dcfg.Published == nil && len(dcfg.Static) == 0 {
		return nil
	}
	d, err := discovery.New(dcfg, n.log)
	if err != nil {
		return validate.Invalid(err)
	}
	n.disc = d
	return nil
}

// newObserver: every node observes the etcd members and publishes its view;
// the VIP holder also prunes what a majority agrees is gone.
func (n *node) newObserver() error {
	cfg := n.cfg
	if n.etcdLock == nil {
		return nil
	}
	mlog := n.log.With("component", "membership")
	if cfg.PruneAfter > 0 && cfg.PruneAfter < QuietPruneAfter {
		mlog.Warn("--prune-after is short: removing a powered-off member this soon after its death can stall etcd, and with it the VIP, for up to 5 s while etcd's leader times out its writes to that machine; use 30s or more (minutes in production)", "prune_after", cfg.PruneAfter)
	}
	members, err := membership.New(membership.Config{Etcd: n.etcd}, mlog)
	if err != nil {
		return validate.Invalid(err)
	}
	n.onClose(func() { _ = members.Close() })
	w := &memberWatch{m: n.m, disc: n.disc, events: n.events, feed: n.feed, cfg: cfg, log: mlog}
	if cfg.PruneDeleteNode {
		w.nodes = newNodeReaper(n.kc, cfg.PruneAfter, mlog)
	}
	var veto func(context.Context, membership.Member) string
	switch {
	case cfg.PruneAfter > 0 && n.kc != nil:
		veto = newCAPIVeto(n.kc, cfg.NodeName, mlog).check
	case cfg.PruneAfter > 0:
		mlog.Info("--prune-after without --kubeconfig: vigil cannot see whether Cluster API manages these machines (its remediation removes etcd members itself); where it does, leave --prune-after off")
	}
	ocfg := membership.ObserverConfig{
		Node: cfg.NodeName, Member: cfg.EtcdMemberName, PruneAfter: cfg.PruneAfter, Veto: veto,
		Holding: n.h.holding, OnRound: w.observed, OnPruned: w.pruned,
	}
	if hs := n.h.handoffs; hs != nil {
		ocfg.OnLive = hs.setLive
	}
	n.observer = membership.NewObserver(members, ocfg, mlog)
	return nil
}

// newElector builds the election on the configured lock, with health-aware
// placement when --health-grace is set, and the VIP conflict probe, which
// asks the elector who should hold the VIP.
func (n *node) newElector() error {
	cfg := n.cfg
	var lock election.Lock
	var prober election.Prober
	switch cfg.Election {
	case ElectionKubernetes:
		lock = election.NewLeaseLock(n.kc.CoordinationV1(), cfg.LeaseNamespace, cfg.LeaseName)
	default:
		lock, prober = n.etcdLock, n.etcdLock
	}
	h := n.h
	ecfg := election.Config{
		Identity:        cfg.NodeName,
		MAC:             linkMAC{n.mon, cfg.Interface},
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
			OnNewLeader:      n.notes.newLeader,
			OnRenew:          n.m.observeRenew,
			OnOp:             n.m.lockOpObserver(cfg.Election == ElectionKubernetes),
			OnAtRisk:         n.notes.atRisk,
		},
	}
	// Planned handoffs (vigil handoff); the stand-by they cause is
	// bounded as placement's is.
	ecfg.YieldFor = yieldFor(cfg.LeaseDuration)
	if h.handoffs != nil {
		ecfg.HandOff = h.handoffs.handOff
	}
	if cfg.HealthGrace > 0 {
		n.pl = &placement{checker: n.checker, grace: cfg.HealthGrace, brisk: cfg.healthTimeout() / 2, host: newHostAddrs(cfg.VIPAddrs(), n.mon), log: n.log, gauge: n.m.yielding}
		ecfg.Yield = n.pl.yield
	}
	el, err := election.New(ecfg, n.log)
	if err != nil {
		return validate.Invalid(err)
	}
	n.el = el
	n.m.registerElector(el)
	h.el, n.conflicts.el = el, el
	return nil
}

// parts are what Run runs beside the election, in start order
// (lifecycle): the metrics server first, so that it serves the whole
// shutdown; the balancers before what feeds them their backends; the
// systemd notifier last, once everything it reports on runs.
func (n *node) parts() *lifecycle {
	l := &lifecycle{}
	if n.metricsLn != nil {
		l.add("metrics", func(ctx context.Context) {
			<-observe.Serve(ctx, n.metricsLn, n.m.reg, func() any { return n.report() },
				observe.Probes{Live: n.el.Live, Ready: n.el.Ready}, observe.Options{Pprof: n.cfg.Pprof}, n.log)
		})
	}
	// Before every part that reads links or addresses from it.
	l.add("link monitor", n.mon.Run)
	for _, b := range n.balancers() {
		l.add(fmt.Sprint("balancer ", b.Addr()), func(ctx context.Context) { _ = b.Run(ctx) })
	}
	if n.disc != nil {
		l.add("discovery", func(ctx context.Context) { _ = n.disc.Run(ctx) })
	}
	if n.keeper != nil {
		l.add("vip keeper", func(ctx context.Context) { _ = n.keeper.Run(ctx) })
	}
	if n.observer != nil {
		l.add("membership observer", n.observer.Run)
	}
	if n.feed != nil {
		l.add("agent feed", n.feed.Run)
	}
	if n.ann != nil {
		// ARP probes for a second holder on the segment; with BGP the
		// router's table is what counts, and the VIP is on no segment.
		l.add("conflict probe", n.conflicts.Run)
	}
	if n.speaker != nil {
		l.addStart("bgp speaker", n.speaker.Start)
	}
	if n.ecmp != nil {
		l.add("ecmp", n.ecmp.Run)
	}
	if hs := n.h.handoffs; hs != nil {
		l.add("handoffs", hs.Run)
	}
	// Listeners are open and the parts run: ready as far as systemd is
	// concerned, before etcd answers (kubeadm init starts etcd after vigil).
	l.add("systemd", func(ctx context.Context) { observe.Systemd(ctx, n.el.Live, n.log) })
	return l
}

// Run starts the parts, campaigns until ctx is cancelled, and steps down:
// it returns once the VIP is gone and every part it started has ended.
// The parts outlive the elector's shutdown: the balancers close their
// connections only after the VIP is gone.
func (n *node) Run(ctx context.Context) error {
	cfg, log, h := n.cfg, n.log, n.h
	parts := n.parts()
	if err := parts.start(); err != nil {
		return err
	}
	defer parts.stop()
	log.Info("vigil starting", "vip", cfg.VIPString(), "interface", cfg.Interface, "announce", cfg.Announce, "election", cfg.Election,
		"lease_duration", cfg.LeaseDuration, "renew_deadline", cfg.RenewDeadline, "retry_period", cfg.RetryPeriod,
		"lb_port", cfg.LBPort, "backend_port", cfg.BackendPort, "health_grace", cfg.HealthGrace)
	if cfg.Election == ElectionEtcd {
		// A second process with this node name is refused here, before it
		// campaigns. Revoked after the step-down, so a restart claims the
		// name at once.
		claim, err := n.etcdLock.ClaimName(ctx, cfg.NodeName, n.el.Instance(), log)
		if errors.Is(err, election.ErrDuplicateIdentity) {
			return err
		}
		if err == nil { // otherwise ctx is done and el.Run returns at once
			defer claim.Close()
		}
	}
	if cfg.Election == ElectionKubernetes && n.etcdLock != nil {
		// Nodes still on the etcd election may hold the VIP. Retire that
		// election first: it waits until its holder has released the lock or
		// let it expire, and then marks it so no etcd candidate takes it
		// again. Only then may this node campaign on the Lease.
		if err := election.Retire(ctx, n.etcdLock, "lease "+cfg.LeaseNamespace+"/"+cfg.LeaseName, cfg.RetryPeriod, log); err != nil {
			log.Debug("stopped before the etcd election was retired", "err", err) // ctx is done: Run returns at once
		}
	}
	err := n.el.Run(ctx)
	h.stop(election.StepDown{Cause: election.CauseShutdown, Detail: "shutting down"}) // idempotent; covers a Run that returned while leading
	parts.stop()
	log.Info("vigil stopped")
	return err
}
