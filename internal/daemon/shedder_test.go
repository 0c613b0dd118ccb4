package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"testing"
	"testing/synctest"
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
	s := &raftShedder{lock: lock, member: c.Names[lead], slowMove: time.Second, log: slog.New(slog.NewTextHandler(t.Output(), nil)).With("test", t.Name())}
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

// fakeShedLock answers each move after its delay, with its outcome.
type fakeShedLock struct {
	calls []time.Duration // when each call began, since the test began
	start time.Time
	took  time.Duration
	to    string
	err   error
}

func (f *fakeShedLock) ShedRaftLeadership(ctx context.Context, member string) (string, error) {
	f.calls = append(f.calls, time.Since(f.start))
	time.Sleep(f.took)
	return f.to, f.err
}

// A move that took longer than slowMove, or failed, holds off the next one
// for shedBackoff, also in the tenure that follows (a slow move may have
// cost the lock); a quick move or a deferral does not.
func TestRaftShedderBacksOffAcrossTenures(t *testing.T) {
	tenure := func(s *raftShedder, d time.Duration) {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { s.Run(ctx); close(done) }()
		time.Sleep(d)
		cancel()
		<-done
	}
	for _, tc := range []struct {
		name string
		took time.Duration
		to   string
		err  error
		want []time.Duration // the calls over two tenures, 5 s and then 19.5 s
	}{
		// A quick move: a check at the start of each tenure and every
		// shedInterval.
		{"quick", 10 * time.Millisecond, "n2", nil, []time.Duration{0, 2 * time.Second, 4 * time.Second, 5 * time.Second, 7 * time.Second, 9 * time.Second, 11 * time.Second, 13 * time.Second, 15 * time.Second, 17 * time.Second, 19 * time.Second, 21 * time.Second, 23 * time.Second}},
		// A slow one: the second tenure (from 5 s) waits until 10.4 s,
		// its first tick after that is at 11 s; the next wait is 20 s.
		{"slow", 400 * time.Millisecond, "n2", nil, []time.Duration{0, 11 * time.Second}},
		{"failed", 400 * time.Millisecond, "", errors.New("etcdserver: request timed out"), []time.Duration{0, 11 * time.Second}},
		{"deferred", 400 * time.Millisecond, "", fmt.Errorf("%w: a voter does not answer", election.ErrShedDeferred), []time.Duration{0, 2 * time.Second, 4 * time.Second, 5 * time.Second, 7 * time.Second, 9 * time.Second, 11 * time.Second, 13 * time.Second, 15 * time.Second, 17 * time.Second, 19 * time.Second, 21 * time.Second, 23 * time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := &fakeShedLock{start: time.Now(), took: tc.took, to: tc.to, err: tc.err}
				s := &raftShedder{lock: f, member: "n1", slowMove: 250 * time.Millisecond, log: slog.New(slog.NewTextHandler(t.Output(), nil))}
				tenure(s, 5*time.Second)
				tenure(s, 19500*time.Millisecond)
				if !slices.Equal(f.calls, tc.want) {
					t.Errorf("moves began at %v, want %v", f.calls, tc.want)
				}
			})
		})
	}
}
