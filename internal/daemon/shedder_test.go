package daemon

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/vigil-ha/vigil/internal/election"
	"github.com/vigil-ha/vigil/internal/etcdtest"
	"github.com/vigil-ha/vigil/internal/testkit"
)

// The shedder takes raft leadership off its member, and takes it off again
// when it comes back during the tenure (an etcd election can land it there
// at any time); it stops with its context.
func TestRaftShedderKeepsLeadershipOff(t *testing.T) {
	c := etcdtest.Start(t, 3)
	lead := c.WaitLeader(10 * time.Second)
	lock, err := election.NewEtcdLock(election.EtcdConfig{Endpoints: c.Endpoints}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	s := &raftShedder{lock: lock, member: c.Names[lead], log: slog.New(slog.NewTextHandler(t.Output(), nil)).With("test", t.Name())}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	defer func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("the shedder did not stop with its context")
		}
	}()
	off := func(what string) {
		t.Helper()
		start := time.Now()
		defer func() {
			t.Logf("leadership off %s %s after %v", c.Names[lead], what, time.Since(start).Round(time.Millisecond))
		}()
		// Bounded by a check (shedInterval), a move that times out
		// (shedTimeout: seen when the hand-back below was the transfer
		// just before) and the backoff after it (shedBackoff), twice over.
		testkit.WaitFor(t, 2*(shedInterval+shedTimeout+shedBackoff), "raft leadership off "+c.Names[lead]+" "+what, func() bool {
			l := c.Leader()
			return l != lead && l >= 0
		})
	}
	off("with the shedder running")
	// Hand it back, as an etcd election might.
	id := uint64(c.Members[lead].Server.MemberID())
	etcdtest.Retry(t, 10*time.Second, "moving leadership back", func() error {
		mctx, mcancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer mcancel()
		return lock.Cluster().MoveLeader(mctx, id)
	})
	off("after it was handed back")
}
