package election

import (
	"context"
	"errors"
	"time"

	"github.com/vigil-ha/vigil/internal/clock"
)

// campaign returns once this node holds the lock, or ctx is done. After a
// tenure that ended because no renewal landed in time (expired), it stands
// aside: see candidacy.standAside.
func (e *Elector) campaign(ctx context.Context, expired bool) (lease, Observation, error) {
	changes, stopWatch := watchLock(ctx, e.cfg.Lock)
	defer stopWatch()
	c := &candidacy{e: e, standAside: expired}
	for {
		e.tick()
		if err := ctx.Err(); err != nil {
			return lease{}, Observation{}, err
		}
		obs, readTook, ok := c.read(ctx)
		if !ok {
			if err := ctx.Err(); err != nil {
				return lease{}, Observation{}, err
			}
			continue
		}
		if err := c.observe(obs); err != nil {
			return lease{}, Observation{}, err
		}
		if ok, wait := c.decide(obs, readTook); !ok {
			alive, held, twin := waitForChange(ctx, min(wait, e.standbyPoll(changes != nil)), changes, &c.w, obs, e.cfg.Identity, e.cfg.Instance)
			if twin != nil {
				return lease{}, Observation{}, e.duplicate(*twin)
			}
			if !alive {
				return lease{}, Observation{}, ctx.Err()
			}
			if held {
				c.standByAnew()
			}
			continue
		}
		l, got, err := c.acquire(ctx, obs, readTook)
		switch {
		case err == nil:
			return l, got, nil
		case errors.Is(err, ErrConflict):
			e.log.Debug("lost the race for the lock", "holder", got.Holder())
			continue // read again at once
		default:
			e.log.Debug("acquire failed", "err", err)
			if !clock.Sleep(ctx, e.cfg.RetryPeriod) {
				return lease{}, Observation{}, ctx.Err()
			}
		}
	}
}

// candidacy is one campaign's state: the lease window of the record as
// this node saw it, the last record (for twin detection), and what was
// last logged, so that each state is logged once.
type candidacy struct {
	e         *Elector
	w         window
	failures  int       // reads failed in a row
	failedAt  time.Time // when the first of them failed
	readAt    time.Time // when the last read was answered
	yielding  time.Time // since when a takeable lock was left alone
	yieldOnce bool      // whether this stand-by was logged
	prev      Observation
	// standAside: the tenure before this campaign ended because no
	// renewal landed within the renew deadline. While the store still
	// answers this node slowly (the read that showed the record took
	// longer than slowLatency), its own record is taken back like a
	// peer's: only once it has stood still for a whole lease; a read
	// answered in time shows the store is back for this node, and the
	// record is taken back at once, as after a store leader election
	// (every write stalled, for everyone, then none). A node whose store
	// answers it too late for the lease
	// (etcd slow for this node alone, its path to etcd lossy) otherwise
	// took its record back at once, its writes kept landing, late, and
	// every peer went on seeing a lease renewed that nobody held: in the
	// lab, with etcd answering the holder alone 480 ms late, no node held
	// the VIP for the 5.9 s the fault lasted. Standing aside, its last
	// writes land, the record stands still, and a peer whose store
	// answers in time takes it; when none does, this node takes it back
	// a lease later, as any peer would. aside says it was logged.
	standAside, aside bool
	// ineligible is why this node does not campaign, as last logged;
	// movedTo where the election moved, as last logged.
	ineligible string
	movedTo    string
}

// read reads the lock. On a failure it logs (the first, then every 20th),
// waits a backoff and reports false; the caller then checks ctx.
func (c *candidacy) read(ctx context.Context) (Observation, time.Duration, bool) {
	e := c.e
	began := time.Now()
	rctx, cancel := context.WithTimeout(ctx, e.readBudget())
	obs, err := e.cfg.Lock.Get(rctx)
	cancel()
	done := time.Now()
	took := done.Sub(began)
	e.op(OpGet, took, err)
	if err != nil {
		if ctx.Err() != nil {
			return Observation{}, took, false
		}
		c.failures++
		if c.failures == 1 {
			c.failedAt = done
			e.log.Warn("cannot read the lock; retrying with backoff", "err", err)
		} else if c.failures%20 == 0 {
			e.log.Info("still cannot read the lock", "for", done.Sub(c.failedAt).Round(time.Millisecond), "err", err)
		}
		clock.Sleep(ctx, readBackoff(e.cfg.RetryPeriod, c.failures))
		return Observation{}, took, false
	}
	if c.failures > 0 {
		e.log.Info("lock readable again", "after", done.Sub(c.failedAt).Round(time.Millisecond))
		c.failures = 0
	}
	c.readAt = done
	return obs, took, true
}

// observe takes a record just read: a twin's renewal ends the campaign
// (ErrDuplicateIdentity); otherwise the status and the lease window follow
// it.
func (c *candidacy) observe(obs Observation) error {
	e := c.e
	if twinRenewed(c.prev, obs, e.cfg.Identity, e.cfg.Instance) {
		return e.duplicate(obs)
	}
	c.prev = obs
	e.setHolder(obs)
	if to := e.noteMoved(obs, c.movedTo); to != c.movedTo {
		c.movedTo, c.ineligible = to, "" // the status was rewritten; log eligibility afresh
	}
	c.w.observe(obs, c.readAt)
	return nil
}

// decide says whether to take the lock now, and otherwise how long to
// wait at most before reading it again: only a lock that is free or has
// expired, and only while this node is eligible and no healthier peer
// should have it.
func (c *candidacy) decide(obs Observation, readTook time.Duration) (bool, time.Duration) {
	e := c.e
	now := time.Now()
	ok, wait := acquirable(obs, c.w, e.cfg.Identity, e.cfg.Instance, now)
	if ok && c.standAside && obs.Holder() == e.cfg.Identity && readTook > e.slowLatency() {
		if ok, wait = c.w.stoodStill(obs, now); !ok && !c.aside {
			e.log.Info("standing aside: this node's renewals did not land within the renew deadline and its store still answers it slowly; a peer whose store answers in time may take the lock, and this node takes it back once it has stood still for a lease, or at once when the store answers it in time again",
				"read_took", readTook.Round(time.Millisecond), "lease", obs.Record.LeaseDuration())
			c.aside = true
		}
	}
	ok, wait = c.eligible(ok, wait)
	if !ok {
		c.standByAnew() // a peer holds it
		return false, wait
	}
	return c.yield(wait)
}

// eligible asks Config.Eligible before a takeover, logging each change;
// while a peer holds the lock it only notices that what kept this node
// out is over.
func (c *candidacy) eligible(ok bool, wait time.Duration) (bool, time.Duration) {
	e := c.e
	if e.cfg.Eligible == nil {
		return ok, wait
	}
	if !ok {
		if e.failedCheck() && e.cfg.Eligible() == nil {
			// What kept this node out (seen here, or by the renewals
			// that made it step down) is over: the status must not go
			// on saying it is ineligible.
			e.log.Info("eligible again: this node can hold the VIP")
			c.ineligible = ""
			e.clearFailedCheck()
		}
		return false, wait
	}
	if err := e.cfg.Eligible(); err != nil {
		if why := err.Error(); why != c.ineligible {
			e.log.Warn("not campaigning: this node cannot hold the VIP now", "err", err)
			c.ineligible = why
			e.setIneligibleCheck(why)
		}
		return false, e.cfg.RetryPeriod
	}
	if c.ineligible != "" {
		e.log.Info("campaigning again: this node can hold the VIP")
		c.ineligible = ""
		e.setIneligible("")
	}
	return true, wait
}

// yield leaves a takeable lock alone while Config.Yield or a handoff says
// so, for YieldFor at most; then it takes it anyway.
func (c *candidacy) yield(wait time.Duration) (bool, time.Duration) {
	e := c.e
	if e.cfg.Yield == nil && e.cfg.HandOff == nil {
		return true, wait
	}
	reason, yield := e.cfg.yieldNow()
	if !yield {
		c.standByAnew()
		return true, wait
	}
	if c.yielding.IsZero() {
		c.yielding = time.Now()
	}
	left := e.cfg.YieldFor - time.Since(c.yielding)
	if left <= 0 {
		e.log.Warn("no healthier peer took the lock; taking it anyway", "reason", reason, "waited", time.Since(c.yielding).Round(time.Millisecond))
		return true, wait
	}
	if !c.yieldOnce {
		e.log.Info("standing by: leaving the lock to a healthier peer", "reason", reason, "for", e.cfg.YieldFor)
		c.yieldOnce = true
	}
	return false, left
}

// standByAnew forgets a stand-by: the next one starts its YieldFor anew.
func (c *candidacy) standByAnew() { c.yielding, c.yieldOnce = time.Time{}, false }

// acquire writes this node's record over obs, speculating renewals while
// the write is under way. The lease starts when the write began.
func (c *candidacy) acquire(ctx context.Context, obs Observation, readTook time.Duration) (lease, Observation, error) {
	e := c.e
	start := time.Now()
	rec := e.record(obs, start)
	pipe := e.newPipeline(ctx, rec.Tenure)
	stopSpeculating := pipe.speculate(rec, e.renewInterval(readTook))
	wctx, cancel := context.WithTimeout(ctx, e.writeBudget())
	got, err := e.cfg.Lock.Write(wctx, rec, obs.Revision)
	cancel()
	stopSpeculating()
	took := time.Since(start)
	e.op(OpAcquire, took, err)
	if err != nil {
		pipe.close()
		return lease{}, got, err
	}
	l := lease{start: start, latency: took, pipe: pipe}
	l.renewed(got.Revision, start, e.cfg.RenewDeadline)
	// A tenure taken while yielding is kept: see Config.Yield.
	l.mayYield = c.yielding.IsZero()
	return l, got, nil
}

// standbyPoll is how long a stand-by waits between reads of a lock held by
// a peer, unless the lease runs out sooner (then it reads at the expiry) or
// a watched change ends the wait. Without a watch it reads every retry
// period. With one, the watch delivers every renewal as it commits (each
// restarts the lease window at its arrival) and a release at once, so the
// reads are only the net under a watch that has silently stalled: they go
// out every quarter lease (200 ms at the defaults, twice fewer reads). A
// stalled watch can then start the window up to that much later, which
// delays a takeover and never hastens one; and the takeover itself is a
// compare-and-swap on the revision read.
func (e *Elector) standbyPoll(watching bool) time.Duration {
	if !watching {
		return e.cfg.RetryPeriod
	}
	return max(e.cfg.RetryPeriod, e.cfg.LeaseDuration/4)
}
