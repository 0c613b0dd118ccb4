package daemon

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/vigil-ha/vigil/internal/election"
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

// raftShedder keeps etcd raft leadership off this node while it holds the
// VIP, so that one crash does not cost both a VIP failover and an etcd
// election. The holder runs it for the length of each tenure; what it
// learnt of failed and slow moves carries over from one tenure to the next
// (the holder's Runs never overlap: stop waits for the last one).
type raftShedder struct {
	lock   shedLock
	member string // this node's etcd member name
	// slowMove is how long a move may take before it counts as a failure:
	// half the renew deadline. Until the new leader has taken over, etcd
	// drops every write, the holder's renewals among them.
	slowMove time.Duration
	log      *slog.Logger

	backoffUntil time.Time     // no move before this
	backoff      time.Duration // the wait after the next failure (0: shedBackoff)
	deferred     string        // the reason of the last deferral, logged once
}

// shedLock is the part of the etcd lock the shedder uses.
type shedLock interface {
	ShedRaftLeadership(ctx context.Context, member string) (string, error)
}

// Run checks every shedInterval until ctx is done. A failed move stalled
// etcd's writes while it lasted, and so did a slow one (it may have cost
// this node the lock: a new tenure then starts with the wait still in
// force), so after one the next try waits shedBackoff, doubling up to
// shedMaxBackoff.
func (s *raftShedder) Run(ctx context.Context) {
	t := time.NewTicker(shedInterval)
	defer t.Stop()
	for {
		if time.Now().After(s.backoffUntil) {
			s.check(ctx)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// check moves raft leadership off this node's member if it leads, once.
func (s *raftShedder) check(ctx context.Context) {
	cctx, cancel := context.WithTimeout(ctx, shedTimeout)
	began := time.Now()
	to, err := s.lock.ShedRaftLeadership(cctx, s.member)
	took := time.Since(began)
	cancel()
	switch {
	case ctx.Err() != nil:
	case errors.Is(err, election.ErrShedDeferred):
		if err.Error() != s.deferred {
			s.log.Info("not moving etcd raft leadership off the VIP holder yet", "reason", err)
			s.deferred = err.Error()
		}
	case err != nil:
		s.log.Warn("cannot move etcd leadership off the VIP holder; waiting before the next try", "err", err, "wait", s.wait())
	case to != "" && took > s.slowMove:
		s.log.Warn("moving etcd raft leadership off the VIP holder took long; etcd held every write meanwhile, so the next move waits",
			"member", s.member, "to", to, "took", took.Round(time.Millisecond), "slow_after", s.slowMove, "wait", s.wait())
	default:
		if to != "" {
			s.log.Info("moved etcd raft leadership off the VIP holder", "member", s.member, "to", to, "took", took.Round(time.Millisecond))
		}
		s.backoff, s.deferred = shedBackoff, ""
	}
}

// wait starts a backoff after a failed or slow move and returns its length.
func (s *raftShedder) wait() time.Duration {
	if s.backoff == 0 {
		s.backoff = shedBackoff
	}
	w := s.backoff
	s.backoffUntil = time.Now().Add(w)
	s.backoff = min(2*s.backoff, shedMaxBackoff)
	s.deferred = ""
	return w
}
