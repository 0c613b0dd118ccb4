package election

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/vigil-ha/vigil/internal/clock"
)

// retiredLease is the lease duration a retired record announces: longer than
// any cluster lives, so a candidate too old to know Record.MovedTo waits
// forever too. (Kept well below the 292 years a time.Duration can hold.)
const retiredLease = 100 * 365 * 24 * time.Hour

// Retire ends the election on lock for good, because the cluster moves to
// another election, which to names (such as "lease kube-system/vigil").
//
// It takes the lock exactly as a candidate would (absent, released, or
// unchanged for a whole lease on this machine's clock), so whoever held it
// has stepped down, by the argument in the package documentation, before the
// retirement lands. The record it writes names no node, never expires, and
// carries MovedTo, so no candidate of this lock ever takes it again. The
// holder's VIP under the old election and the VIP under the new one are thus
// never held at once, whatever order nodes change in: the new election must
// not start before Retire returns nil.
//
// A lock already retired returns nil at once, whatever it moved to. Retire
// blocks until it succeeds or ctx is done (then it returns ctx's error).
// Undoing it means deleting the record once no node runs the new election.
func Retire(ctx context.Context, lock Lock, to string, retry time.Duration, log *slog.Logger) error {
	if to == "" || retry <= 0 {
		return errors.New("election: Retire needs where the election moved to and a positive retry period")
	}
	self, instance := "(moved to "+to+")", NewInstance()
	log = log.With("lock", lock.Describe(), "moved_to", to)
	changes, stopWatch := watchLock(ctx, lock)
	defer stopWatch()
	var (
		w        window
		failures int
		waiting  string // the holder this call was last logged waiting for
	)
	for {
		rctx, cancel := context.WithTimeout(ctx, 2*retry)
		obs, err := lock.Get(rctx)
		cancel()
		done := time.Now()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			failures++
			if failures == 1 || failures%20 == 0 {
				log.Warn("cannot read the old election's lock to retire it; retrying", "err", err, "attempts", failures)
			}
			if !clock.Sleep(ctx, readBackoff(retry, failures)) {
				return ctx.Err()
			}
			continue
		}
		failures = 0
		if obs.Record != nil && obs.Record.MovedTo != "" {
			log.Info("the old election is retired", "by", obs.Record.Instance)
			return nil
		}
		w.observe(obs, done)
		ok, wait := acquirable(obs, w, self, instance, time.Now())
		if !ok {
			if h := obs.Holder(); h != waiting {
				log.Info("waiting for the old election's holder to release its lock or let it expire before this node may campaign in the new one", "holder", h, "lease", obs.Record.LeaseDuration())
				waiting = h
			}
			if alive, _, _ := waitForChange(ctx, min(wait, retry), changes, &w, obs, self, instance); !alive {
				return ctx.Err()
			}
			continue
		}
		now := time.Now().UTC()
		rec := Record{Holder: self, LeaseDurationMillis: retiredLease.Milliseconds(), AcquireTime: now, RenewTime: now,
			Nonce: nonce(), Instance: instance, MovedTo: to}
		if obs.Record != nil {
			rec.Transitions = obs.Record.Transitions + 1
		}
		wctx, cancel := context.WithTimeout(ctx, 2*retry)
		_, err = lock.Write(wctx, rec, obs.Revision)
		cancel()
		switch {
		case err == nil:
			log.Info("retired the old election: its lock now names the new one, and no candidate of the old one will take it", "previous_holder", obs.Holder())
			return nil
		case errors.Is(err, ErrConflict):
			continue // somebody wrote first: read again
		default:
			// The write may still have landed; the next read tells.
			log.Debug("retiring write failed", "err", err)
			if !clock.Sleep(ctx, retry) {
				return ctx.Err()
			}
		}
	}
}
