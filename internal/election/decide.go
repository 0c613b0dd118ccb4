package election

import "time"

// window is a candidate's view of how long the lock record has stood still.
// It restarts whenever the record's revision changes or the store reports a
// newer raft term: after a store leader election the holder gets a full lease
// again to renew through the new store leader.
type window struct {
	valid bool
	rev   int64
	term  uint64
	// since is when a read first returned rev in term (the read's completion
	// time, which is after the write that produced rev was committed).
	since time.Time
}

// observe folds one successful read, completed at readDone, into the window.
func (w *window) observe(o Observation, readDone time.Time) {
	if w.valid && o.Revision == w.rev && o.Term <= w.term {
		// Same record; an answer from a member still on an older term is
		// fine, the newest term seen so far keeps counting.
		return
	}
	*w = window{valid: true, rev: o.Revision, term: o.Term, since: readDone}
}

// acquirable tells whether candidate self (process instance) that has
// watched the record through w may try to take the lock now, and if not, how
// long to wait.
func acquirable(o Observation, w window, self, instance string, now time.Time) (bool, time.Duration) {
	if o.Record == nil || o.Record.Holder == "" {
		return true, 0 // absent or released
	}
	if o.Record.MovedTo != "" {
		return false, o.Record.LeaseDuration() // retired: never taken
	}
	if o.Record.Holder == self && (o.Record.Instance == instance || o.Record.Instance == "") {
		// Our own record (or one of a vigil too old to say which process
		// wrote it). The write is still a compare-and-swap on the revision,
		// so it only succeeds if nobody else took the lock since.
		return true, 0
	}
	// A foreign holder, or our name written by another process: an earlier
	// run of this node that died, or a live twin. Either way the record must
	// stand still for a whole lease first; a twin that renews it is caught
	// by twinRenewed.
	return w.stoodStill(o, now)
}

// stoodStill tells whether record o has stood still in w for its whole
// lease by now, and if not, how long to wait.
func (w window) stoodStill(o Observation, now time.Time) (bool, time.Duration) {
	if !w.valid || w.rev != o.Revision {
		return false, o.Record.LeaseDuration()
	}
	expiry := w.since.Add(o.Record.LeaseDuration())
	if now.Before(expiry) {
		return false, expiry.Sub(now)
	}
	return true, 0
}

// lease is the leader's view of its own tenure.
type lease struct {
	rev int64
	// start is when the write that took the lock began, and latency how
	// long it took: the first renewal is due a retry period after start.
	start   time.Time
	latency time.Duration
	// pipe carries the renewals sent while the takeover was under way
	// (nil when none were).
	pipe *pipeline
	// deadline is when the leader must have stepped down unless a renewal
	// succeeds first: start of the last successful renewal + RenewDeadline, or
	// start of the last probe that found the store leaderless + RenewDeadline.
	deadline time.Time
	// mayYield is false for a tenure taken while this node was yielding;
	// such a tenure is not given up for the same reason (Config.Yield).
	mayYield bool
}

// renewed records a successful renewal that was started at start.
// Renewals may be answered out of order (Renewer): the revision and the
// deadline only move forward.
func (l *lease) renewed(rev int64, start time.Time, renewDeadline time.Duration) {
	l.rev = max(l.rev, rev)
	if d := start.Add(renewDeadline); d.After(l.deadline) {
		l.deadline = d
	}
}

// storeLeaderless records a probe, started at start, that found that no write
// can commit anywhere in the store. It returns whether the deadline moved.
func (l *lease) storeLeaderless(start time.Time, renewDeadline time.Duration) bool {
	d := start.Add(renewDeadline)
	if d.After(l.deadline) {
		l.deadline = d
		return true
	}
	return false
}

// expired tells whether the leader must step down at now.
func (l *lease) expired(now time.Time) bool { return !now.Before(l.deadline) }

// twinRenewed tells whether two successive observations show another live
// process holding the lock under this candidate's name: the record names
// self with a different, non-empty instance, and it changed between the two
// (somebody renews it). A record merely left behind by an earlier run of
// this node never changes, so it is taken after one lease instead.
func twinRenewed(prev, cur Observation, self, instance string) bool {
	twin := func(o Observation) bool {
		return o.Record != nil && o.Record.Holder == self && o.Record.Instance != "" && o.Record.Instance != instance
	}
	return twin(prev) && twin(cur) && cur.Revision != prev.Revision && prev.Record.Instance == cur.Record.Instance
}
