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
// election. The holder runs it for the length of each tenure.
type raftShedder struct {
	lock   *election.EtcdLock
	member string // this node's etcd member name
	log    *slog.Logger
}

// Run checks every shedInterval until ctx is done. A failed move stalled
// etcd's writes while it lasted, so after one the next try waits
// shedBackoff, doubling up to shedMaxBackoff.
func (s *raftShedder) Run(ctx context.Context) {
	t := time.NewTicker(shedInterval)
	defer t.Stop()
	var backoffUntil time.Time
	backoff := shedBackoff
	deferred := ""
	for {
		if time.Now().After(backoffUntil) {
			cctx, cancel := context.WithTimeout(ctx, shedTimeout)
			to, err := s.lock.ShedRaftLeadership(cctx, s.member)
			cancel()
			switch {
			case ctx.Err() != nil:
				return
			case errors.Is(err, election.ErrShedDeferred):
				if err.Error() != deferred {
					s.log.Info("not moving etcd raft leadership off the VIP holder yet", "reason", err)
					deferred = err.Error()
				}
			case err != nil:
				s.log.Warn("cannot move etcd leadership off the VIP holder; waiting before the next try", "err", err, "wait", backoff)
				backoffUntil = time.Now().Add(backoff)
				backoff = min(2*backoff, shedMaxBackoff)
				deferred = ""
			default:
				if to != "" {
					s.log.Info("moved etcd raft leadership off the VIP holder", "member", s.member, "to", to)
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
