package membership

import (
	"context"
	"log/slog"
	"time"
)

// ObserveInterval is how often every vigil observes the members and
// publishes its view. A second keeps the evidence within a couple of
// seconds of the truth, for one member list, one Status per member and two
// small writes per node.
const ObserveInterval = time.Second

// maxObserveGap is the longest time between two observations that still
// counts as continuous: a round whose Status calls time out takes about a
// second and a half. Anything longer (a paused process, etcd out of reach
// from here) restarts every count.
const maxObserveGap = 3 * time.Second

// ReportStale is how long a report may go without a new sequence number
// and still count: a few rounds, slow ones included.
const ReportStale = 5 * time.Second

// ObserverConfig configures an Observer.
type ObserverConfig struct {
	// Node is this node's name; Member is its etcd member's.
	Node, Member string
	// Interval between observations; ObserveInterval when 0.
	Interval time.Duration
	// PruneAfter, when not 0, makes the observer prune while this node
	// holds the VIP (Holding).
	PruneAfter time.Duration
	// Holding tells whether this node holds the VIP, and since when.
	Holding func() (bool, time.Time)
	// OnRound is called after every observation, with this observer's
	// view.
	OnRound func(ctx context.Context, v View, own Report)
	// OnPruned is called for every member this observer removed.
	OnPruned func(ctx context.Context, m Member)
	// OnLive is called after every observation with the observers whose
	// reports are fresh (their vigils run and observe), this one included.
	OnLive func(live []string)
	// Veto, when set, can keep a member that would be pruned
	// (PruneConfig.Veto): Cluster API manages its machine.
	Veto func(ctx context.Context, m Member) string
}

// Observer observes the members on every node, publishes its view and,
// on the VIP holder, prunes what the cluster agrees is gone.
type Observer struct {
	cfg     ObserverConfig
	cl      *Cluster
	log     *slog.Logger
	tracker *Tracker
	book    *Book
	started time.Time
	seq     uint64
	// said is the last thing logged about each unreachable member, so a
	// verdict is logged when it changes, not every round.
	said map[uint64]string
}

// NewObserver returns an observer on cl.
func NewObserver(cl *Cluster, cfg ObserverConfig, log *slog.Logger) *Observer {
	if cfg.Interval == 0 {
		cfg.Interval = ObserveInterval
	}
	return &Observer{cfg: cfg, cl: cl, log: log, tracker: NewTracker(maxObserveGap), book: NewBook(ReportStale), said: map[uint64]string{}}
}

// Run observes until ctx ends, then withdraws this node's report.
func (o *Observer) Run(ctx context.Context) {
	o.started = time.Now()
	t := time.NewTicker(o.cfg.Interval)
	defer t.Stop()
	failing := false
	for {
		rctx, cancel := context.WithTimeout(ctx, 2*maxObserveGap)
		err := o.round(rctx)
		cancel()
		switch {
		case err != nil && ctx.Err() == nil && !failing:
			o.log.Warn("cannot observe the etcd members", "err", err)
			failing = true
		case err == nil && failing:
			o.log.Info("observing the etcd members works again")
			failing = false
		}
		select {
		case <-ctx.Done():
			wctx, cancel := context.WithTimeout(context.Background(), time.Second)
			if err := o.cl.Withdraw(wctx); err != nil {
				o.log.Debug("cannot withdraw this node's member report", "err", err)
			}
			cancel()
			return
		case <-t.C:
		}
	}
}

func (o *Observer) round(ctx context.Context) error {
	v, err := o.cl.View(ctx)
	if err != nil {
		return err
	}
	o.tracker.Observe(v, v.AskedAt, v.AnsweredAt)
	o.seq++
	self := o.tracker.Report(o.cfg.Node, o.cfg.Member, o.seq)
	perr := o.cl.Publish(ctx, self)
	o.book.Note(v.Reports, time.Now())
	if o.cfg.OnLive != nil {
		now := time.Now()
		var live []string
		for _, r := range v.Reports {
			if o.book.Fresh(r.Observer, now) {
				live = append(live, r.Observer)
			}
		}
		o.cfg.OnLive(live)
	}
	if o.cfg.OnRound != nil {
		o.cfg.OnRound(ctx, v, self)
	}
	if o.cfg.PruneAfter > 0 {
		o.prune(ctx, v, &self)
	}
	return perr
}

// prune removes what the cluster agrees is gone, if this node holds the
// VIP and has held it, and run, for a whole period: neither a new process
// nor a new holder has watched long enough to know.
func (o *Observer) prune(ctx context.Context, v View, self *Report) {
	holding, since := o.cfg.Holding()
	if !holding {
		clear(o.said)
		return
	}
	now := time.Now()
	pc := PruneConfig{MinDown: o.cfg.PruneAfter, Self: self, Fresh: func(obs string) bool { return o.book.Fresh(obs, now) }}
	if v.raftUnchecked() {
		// Only while a member does not answer: reading the links costs
		// each answering member a /metrics page.
		o.cl.CheckRaft(ctx, &v)
	}
	cases := v.Cases(pc)
	early := now.Sub(since) < pc.MinDown || now.Sub(o.started) < pc.MinDown
	want := false
	for _, cs := range cases {
		ok := cs.Removable(pc) && !early
		var veto string
		if ok && o.cfg.Veto != nil {
			veto = o.cfg.Veto(ctx, cs.Member)
			ok = veto == ""
		}
		want = want || ok
		var msg string
		switch {
		case ok:
			continue // Prune says it
		case veto != "":
			msg = "not pruning automatically: " + veto
		case cs.RaftHolds() != "":
			msg = cs.RaftHolds() + "; not pruning"
		case cs.Verdict == OneSided:
			msg = "one-sided evidence, not pruning"
		case cs.SelfDownMillis < pc.MinDown.Milliseconds() || cs.Verdict == NotYet:
			msg = "not down for " + pc.MinDown.String() + " yet"
		default:
			msg = "this node has held the VIP, or run, for less than " + pc.MinDown.String() + "; not pruning yet"
		}
		if o.said[cs.Member.ID] != msg {
			o.said[cs.Member.ID] = msg
			o.log.Info("prune: "+cs.Member.Label()+" is unreachable: "+msg, "evidence", cs.Evidence())
		}
	}
	for id := range o.said {
		if !v.has(id) || v.reachable(id) {
			delete(o.said, id)
		}
	}
	if !want {
		return
	}
	pc.View = &v // just read: the first removal need not wait for another round of Status calls
	pc.Veto = o.cfg.Veto
	pc.OnRemoved = func(m Member) {
		delete(o.said, m.ID)
		if o.cfg.OnPruned != nil {
			o.cfg.OnPruned(ctx, m)
		}
	}
	_, _, err := o.cl.Prune(ctx, pc, func(e Event) { o.log.Info("prune: "+e.Text, "event", e.Kind, "member", e.Member) })
	if err != nil && ctx.Err() == nil {
		o.log.Warn("prune failed", "err", err)
	}
}

func (v View) has(id uint64) bool {
	for _, m := range v.Members {
		if m.ID == id {
			return true
		}
	}
	return false
}

func (v View) reachable(id uint64) bool {
	for _, m := range v.Members {
		if m.ID == id {
			return m.Reachable
		}
	}
	return false
}
