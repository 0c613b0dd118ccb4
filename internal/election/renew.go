package election

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// How long an operation on the lock may take. One rule serves both
// backends: an operation may use whatever the lease leaves it, and no more.
//
//   - A write that starts or extends a lease (a takeover, a renewal) that
//     started at S gives its writer a deadline of S + RenewDeadline (see
//     "Why two nodes never hold the VIP"). An answer after that moment is
//     worth nothing, so the write is given until then: RenewDeadline.
//   - A read decides nothing by its own timing: a candidate's window starts
//     when the answer arrives, after the commit it shows. It may take a
//     whole lease; a slower answer says the store cannot carry the lease
//     anyway.
//
// Before this rule every operation had two retry periods (200 ms at the
// defaults), and a store that answered 250 ms late left no node able to
// hold the VIP at all.
func (e *Elector) writeBudget() time.Duration { return e.cfg.RenewDeadline }
func (e *Elector) readBudget() time.Duration  { return e.cfg.LeaseDuration }

// renewInterval is how often the leader sends a renewal: every half retry
// period, and every quarter while the store is slow. Renewals are
// pipelined (Renewer): the next one goes out on time whether or not the
// last one has been answered. A renewal answered after a round trip L sets a
// deadline that the next answer, one interval I later, must beat:
// L + I < RenewDeadline.
//
// The interval in force when the store turns slow is the one that counts:
// answers already under way come I apart, L late, before the holder can
// react. So the healthy interval is half a retry period, and a store that
// is suddenly 400 ms late leaves 50 ms to spare at the defaults (with a
// whole retry period it would leave nothing). Once an answer took more than
// RenewDeadline − 2·RetryPeriod (300 ms), renewals go out every quarter
// retry period, and a store that stays slow is ridden out up to
// RenewDeadline − RetryPeriod/4 (475 ms). It costs writes: 20 a second
// while healthy, 40 while slow.
//
// A lock whose writes are costly for its store (the Lease: every renewal
// is a patch through an API server, fanned out to every watcher) renews
// once a retry period, and no faster when its store is slow: an API server
// slowed by load would only be loaded more. In the kubeadm lab, renewals
// that sped up on a loaded API server made it slower still.
func (e *Elector) renewInterval(lastLatency time.Duration) time.Duration {
	if c, ok := e.cfg.Lock.(costlyWrites); ok && c.CostlyWrites() {
		return e.cfg.RetryPeriod
	}
	if lastLatency > e.slowLatency() {
		return e.cfg.RetryPeriod / slowSpeedup
	}
	return e.cfg.RetryPeriod / 2
}

// costlyWrites is implemented by a lock whose writes cost its store much
// more than a read (see renewInterval).
type costlyWrites interface{ CostlyWrites() bool }

// slowSpeedup is how many renewals a leader sends per retry period on a
// slow store.
const slowSpeedup = 4

// slowLatency is the round trip above which renewals go out twice as often.
func (e *Elector) slowLatency() time.Duration {
	return e.cfg.RenewDeadline - 2*e.cfg.RetryPeriod
}

// maxInFlight bounds the renewals under way at once: one per interval of a
// renew deadline, and one more. A lock with costly writes has at most two
// under way: renewals of one Lease in flight together are patches of one
// object, which the API server applies one after the other, retrying each
// that lost the race against the one before (a fresh read from etcd, a
// second write). On an API server slowed by load, a dozen of them would
// turn one slow answer into many; two still ride out one renewal lost in
// transit. (The CI kubeadm lab's Lease holder stepped down with the
// limit of the etcd lock.)
func (e *Elector) maxInFlight() int {
	if c, ok := e.cfg.Lock.(costlyWrites); ok && c.CostlyWrites() {
		return costlyInFlight
	}
	return int(e.cfg.RenewDeadline/(e.cfg.RetryPeriod/slowSpeedup)) + 1
}

// costlyInFlight is maxInFlight for a lock with costly writes.
const costlyInFlight = 2

// atRiskMargin: a renewal answered with less of the lease left than one
// retry period makes the lease "at risk": one retry period more of
// latency, and the holder steps down.
func (e *Elector) atRiskMargin() time.Duration { return e.cfg.RetryPeriod }

// marginWindow is how far back Status.RenewMarginMin looks.
const marginWindow = 10 * time.Second

// attempt is one renewal under way, and then its answer.
type attempt struct {
	start time.Time
	rec   Record
	obs   Observation
	err   error
	took  time.Duration
}

// pipeline sends the renewals of one tenure and collects their answers.
// With a Renewer up to maxInFlight are under way at once; without one, one
// at a time, compared on the revision.
type pipeline struct {
	e       *Elector
	renewer Renewer
	limit   int
	ctx     context.Context
	cancel  context.CancelFunc
	answers chan attempt

	mu        sync.Mutex // guards inFlight and lastIssue
	inFlight  int
	lastIssue time.Time
}

func (e *Elector) newPipeline(ctx context.Context, tenure string) *pipeline {
	p := &pipeline{e: e, limit: 1}
	if r, ok := e.cfg.Lock.(Renewer); ok && tenure != "" {
		p.renewer, p.limit = r, e.maxInFlight()
	}
	p.ctx, p.cancel = context.WithCancel(ctx)
	p.answers = make(chan attempt, p.limit)
	return p
}

// issue sends a renewal of rec, started now, unless limit renewals are
// under way. rev is what a lock without a Renewer compares.
func (p *pipeline) issue(rec Record, rev int64, now time.Time) bool {
	p.mu.Lock()
	if p.inFlight >= p.limit {
		p.mu.Unlock()
		return false
	}
	p.inFlight++
	p.lastIssue = now
	p.mu.Unlock()
	next := rec
	next.RenewTime = now.UTC()
	next.Nonce = nonce()
	next.MAC = p.e.mac()
	go func() {
		wctx, cancel := context.WithDeadline(p.ctx, now.Add(p.e.writeBudget()))
		defer cancel()
		var got Observation
		var err error
		if p.renewer != nil {
			got, err = p.renewer.Renew(wctx, next)
		} else {
			got, err = p.e.cfg.Lock.Write(wctx, next, rev)
		}
		p.answers <- attempt{start: now, rec: next, obs: got, err: err, took: time.Since(now)}
	}()
	return true
}

// state returns how many renewals are under way and when the last began.
func (p *pipeline) state() (int, time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.inFlight, p.lastIssue
}

func (p *pipeline) answered() {
	p.mu.Lock()
	p.inFlight--
	p.mu.Unlock()
}

// speculate sends renewals of rec, the record a takeover is writing, every
// interval until stop is called. On a store slower than half the renew
// deadline the takeover's own answer comes too late for a renewal sent
// after it to land in time: the new holder would step down at once, and
// the VIP flap. A renewal sent before the takeover is answered is harmless:
// it lands only after the takeover did (it compares the tenure), and if
// the takeover fails, so does it.
func (p *pipeline) speculate(rec Record, interval time.Duration) (stop func()) {
	if p.renewer == nil {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-p.ctx.Done():
				return
			case now := <-t.C:
				p.issue(rec, 0, now)
			}
		}
	}()
	return func() { close(done); wg.Wait() }
}

// close abandons the renewals under way.
func (p *pipeline) close() { p.cancel() }

// renewLoop renews until it must stop and returns why. With a Renewer the
// renewals are pipelined: one goes out every renewInterval whether or not
// the last was answered, each may take until the deadline it would set,
// and the deadline is the latest start of any renewal answered so far plus
// RenewDeadline. Without one (a lock that can only compare revisions) one
// renewal is under way at a time, and the next goes out as soon as the
// last is answered, never sooner than a retry period after it started.
func (e *Elector) renewLoop(ctx context.Context, l *lease, rec *Record) StepDown {
	p := l.pipe
	if p == nil {
		p = e.newPipeline(ctx, rec.Tenure)
	}
	defer p.close() // renewals still under way are abandoned; see "late answers" in docs/election.md
	// Room for every probe under way, so none is left blocked after the loop.
	probes := make(chan probeResult, maxProbes)
	var (
		lastLatency  = l.latency
		lastGood     = l.start.Add(l.latency) // when the last renewal was answered
		probing      int                      // probes under way
		lastProbe    time.Time
		failingSince time.Time // first failure of the current run of failed renewals
		keptLogged   bool      // whether this run of failures was logged as a store outage
		margins      marginLog
	)
	if _, last := p.state(); last.IsZero() {
		p.mu.Lock()
		p.lastIssue = l.start // the tenure's first write counts as a renewal
		p.mu.Unlock()
	}
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		e.tick()
		now := time.Now()
		if l.expired(now) {
			return StepDown{CauseExpired, fmt.Sprintf("no successful renewal within the renew deadline %v", e.cfg.RenewDeadline)}
		}
		inFlight, lastIssue := p.state()
		due := lastIssue.Add(e.renewInterval(lastLatency))
		if inFlight < p.limit && !now.Before(due) {
			p.issue(*rec, l.rev, now)
			continue
		}
		// No answer for two retry periods: the store may be electing a
		// leader, in which case nobody can take the lock either. Ask it,
		// beside the renewals, once a retry period. A probe may take up to
		// half the renew deadline (a member's status answer is slow when
		// its host is busy), so several may be under way; the first is due
		// early enough to have that time before the deadline.
		probeDue := time.Time{}
		if e.cfg.Prober != nil && probing < maxProbes {
			probeDue = minTime(lastGood.Add(2*e.cfg.RetryPeriod), l.deadline.Add(-e.cfg.RenewDeadline/2))
			if d := lastProbe.Add(e.cfg.RetryPeriod); d.After(probeDue) {
				probeDue = d
			}
			if !now.Before(probeDue) {
				probing, lastProbe = probing+1, now
				dl := l.deadline
				go func() { probes <- e.probe(p.ctx, now, dl) }()
				continue
			}
		}
		wake := l.deadline
		if inFlight < p.limit && due.Before(wake) {
			wake = due
		}
		if !probeDue.IsZero() && probeDue.Before(wake) {
			wake = probeDue
		}
		timer.Reset(max(time.Until(wake), 0))
		var a attempt
		select {
		case <-ctx.Done():
			return StepDown{CauseShutdown, "shutting down"}
		case <-timer.C:
			continue
		case pr := <-probes:
			probing--
			if pr.leaderless && l.storeLeaderless(pr.start, e.cfg.RenewDeadline) {
				if cb := e.cfg.Callbacks.OnLease; cb != nil {
					cb(l.deadline)
				}
				if !keptLogged {
					keptLogged = true
					e.log.Info("store has no working leader, so nobody can take the lock; keeping it")
				}
			}
			continue
		case a = <-p.answers:
			p.answered()
		}
		e.tick()
		if cb := e.cfg.Callbacks.OnRenew; cb != nil {
			cb(a.took, a.err)
		}
		e.op(OpRenew, a.took, a.err)
		switch {
		case a.err == nil:
			arrived := time.Now()
			margin := l.deadline.Sub(arrived)
			l.renewed(a.obs.Revision, a.start, e.cfg.RenewDeadline)
			if cb := e.cfg.Callbacks.OnLease; cb != nil {
				cb(l.deadline)
			}
			lastLatency, lastGood = a.took, arrived
			e.noteRenewal(a.took, margin, margins.add(arrived, margin))
			if a.obs.Revision >= l.rev {
				*rec = a.rec
			}
			if !failingSince.IsZero() {
				e.log.Info("renewal succeeded again", "after", time.Since(failingSince).Round(time.Millisecond))
				failingSince, keptLogged = time.Time{}, false
			}
			if sd, stop := e.afterRenewal(l); stop {
				return sd
			}
		case ctx.Err() != nil:
			return StepDown{CauseShutdown, "shutting down"}
		case errors.Is(a.err, ErrConflict) && a.obs.Revision < l.rev:
			// The record as it was before a write of ours that we know
			// landed: a renewal sent while the takeover was under way
			// (speculate) that reached the store before it. Stale news.
		case errors.Is(a.err, ErrConflict):
			got := a.obs
			if got.Holder() == e.cfg.Identity && got.Record.Instance == e.cfg.Instance && (got.Record.Tenure == rec.Tenure || p.renewer == nil) {
				// An earlier renewal of ours landed after we gave up
				// waiting for it (the revision compare). Adopt it and
				// renew again.
				if got.Revision > l.rev {
					l.rev = got.Revision
					*rec = *got.Record
				}
				p.mu.Lock()
				p.lastIssue = time.Time{}
				p.mu.Unlock()
				continue
			}
			if got.Holder() == e.cfg.Identity {
				return StepDown{CauseLost, fmt.Sprintf("lock taken by another process with this node name (instance %s)", got.Record.Instance)}
			}
			return StepDown{CauseLost, fmt.Sprintf("lock taken by %q", got.Holder())}
		default:
			if failingSince.IsZero() {
				failingSince = a.start
				e.log.Warn("renewal failed", "err", a.err, "took", a.took.Round(time.Millisecond), "deadline_in", time.Until(l.deadline).Round(time.Millisecond))
			} else {
				e.log.Debug("renewal failed again", "err", a.err, "deadline_in", time.Until(l.deadline).Round(time.Millisecond))
			}
		}
	}
}

// afterRenewal asks, after a successful renewal, whether the leader should
// step down for a reason of its own: it cannot hold the VIP, a handoff, or
// a healthier peer.
func (e *Elector) afterRenewal(l *lease) (StepDown, bool) {
	e.mu.Lock()
	e.status.Seen = time.Now()
	e.mu.Unlock()
	if e.cfg.Eligible != nil {
		if err := e.cfg.Eligible(); err != nil {
			e.setIneligibleCheck(err.Error())
			return StepDown{CauseIneligible, "this node cannot hold the VIP: " + err.Error()}, true
		}
	}
	if e.cfg.HandOff != nil {
		if why, yield := e.cfg.HandOff(); yield {
			return StepDown{CauseYield, "handing off: " + why}, true
		}
	}
	if l.mayYield && e.cfg.Yield != nil {
		if why, yield := e.cfg.Yield(); yield {
			return StepDown{CauseYield, "yielding to a healthier peer: " + why}, true
		}
	}
	return StepDown{}, false
}

// noteRenewal keeps the renewal's figures in the status and says, once per
// episode, when the store answers so late that the lease is at risk.
func (e *Elector) noteRenewal(took, margin, minMargin time.Duration) {
	risk := ""
	if margin < e.atRiskMargin() {
		risk = fmt.Sprintf("the lock store answered a renewal in %v, leaving %v of the renew deadline %v: %v more of latency and this node gives up the VIP; the store must answer faster, or --renew-deadline and --lease-duration must be longer",
			took.Round(time.Millisecond), margin.Round(time.Millisecond), e.cfg.RenewDeadline, margin.Round(time.Millisecond))
	}
	e.mu.Lock()
	e.status.RenewLatency, e.status.RenewMargin, e.status.RenewMarginMin = took, margin, minMargin
	was := e.status.AtRisk
	if risk == "" && was != "" && minMargin >= e.atRiskMargin() {
		e.status.AtRisk = "" // cleared only once the whole window is clear
	} else if risk != "" {
		e.status.AtRisk = risk
	}
	now := e.status.AtRisk
	e.mu.Unlock()
	switch {
	case was == "" && now != "":
		e.log.Warn("lease at risk: "+now, "renew_latency", took.Round(time.Millisecond), "margin", margin.Round(time.Millisecond))
	case was != "" && now == "":
		e.log.Info("lease no longer at risk: renewals are answered in time again", "renew_latency", took.Round(time.Millisecond), "min_margin", minMargin.Round(time.Millisecond))
	default:
		return
	}
	if cb := e.cfg.Callbacks.OnAtRisk; cb != nil {
		cb(now)
	}
}

// marginLog keeps recent renewal margins, for their minimum over
// marginWindow.
type marginLog struct {
	at [64]time.Time
	m  [64]time.Duration
	n  int
}

// add records margin m at t and returns the smallest margin of the window.
func (ml *marginLog) add(t time.Time, m time.Duration) time.Duration {
	i := ml.n % len(ml.m)
	ml.at[i], ml.m[i] = t, m
	ml.n++
	low := m
	for j := 0; j < min(ml.n, len(ml.m)); j++ {
		if t.Sub(ml.at[j]) <= marginWindow && ml.m[j] < low {
			low = ml.m[j]
		}
	}
	return low
}

// Operations reported to Callbacks.OnOp.
const (
	OpGet     = "get"     // a candidate's read of the lock
	OpAcquire = "acquire" // a candidate's write to take it
	OpRenew   = "renew"   // a leader's renewal
	OpRelease = "release" // the release at a step-down
)

// op reports one operation on the lock.
func (e *Elector) op(name string, took time.Duration, err error) {
	if cb := e.cfg.Callbacks.OnOp; cb != nil {
		cb(name, took, err)
	}
}
