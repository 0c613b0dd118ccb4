package election

import (
	"context"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/vigil-ha/vigil/internal/etcdtest"
	"github.com/vigil-ha/vigil/internal/testkit"
)

// retireAsync runs Retire on its own lock and reports when it returned.
func retireAsync(t *testing.T, endpoints []string) (done <-chan time.Time, cancel func()) {
	t.Helper()
	l, err := NewEtcdLock(EtcdConfig{Endpoints: endpoints, Key: "/test/leader"}, testkit.Log(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	ch := make(chan time.Time, 1)
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		if err := Retire(ctx, l, "lease kube-system/vigil", tRetry, testkit.Log(t)); err == nil {
			ch <- time.Now()
		}
	}()
	cancel = func() { stop(); <-finished; l.Close() }
	t.Cleanup(cancel)
	return ch, cancel
}

func deleteRecord(t *testing.T, endpoints []string) {
	t.Helper()
	withClient(t, endpoints, func(ctx context.Context, cli *clientv3.Client) {
		if _, err := cli.Delete(ctx, "/test/leader"); err != nil {
			t.Fatal(err)
		}
	})
}

// Retire waits for a live holder, lands right after its release, and from
// then on no candidate of the old lock takes it, until the record is
// deleted.
func TestRetireWaitsForTheHolderAndLocksOutCandidates(t *testing.T) {
	c := etcdtest.Start(t, 1)
	tr := newTracker(t)
	a := startCandidate(t, "a", c.Endpoints, tr, tLease, tRenew, tRetry)
	tr.waitLeader(t, 10*time.Second, "")
	retired, _ := retireAsync(t, c.Endpoints)
	select {
	case at := <-retired:
		t.Fatalf("Retire returned at %v while a held the lock", at)
	case <-time.After(3 * tLease):
	}
	if tr.leader() != "a" {
		t.Fatalf("leader = %q while Retire waited, want a", tr.leader())
	}
	stopped := time.Now()
	a.stop()
	var at time.Time
	select {
	case at = <-retired:
	case <-time.After(10 * time.Second):
		t.Fatal("Retire did not land within 10s of the holder's release")
	}
	t.Logf("retired %v after the holder released", at.Sub(stopped))
	if at.Sub(stopped) > tLease {
		t.Errorf("Retire took %v after a release; a released lock is taken at once", at.Sub(stopped))
	}
	rec := readRecord(t, c.Endpoints)
	if rec.MovedTo != "lease kube-system/vigil" || rec.Holder == "" || rec.Holder == "a" {
		t.Fatalf("record after Retire = %+v, want MovedTo set and a holder that names no node", rec)
	}

	// A candidate of the old election never takes it, and says why.
	b := startCandidate(t, "b", c.Endpoints, tr, tLease, tRenew, tRetry)
	testkit.Always(t, 3*tLease, "nobody taking the retired lock", func() bool { return tr.leader() == "" })
	if why := b.el.Status().Ineligible; !strings.Contains(why, "moved to lease kube-system/vigil") {
		t.Fatalf("b's status says %q, want why it does not campaign", why)
	}
	// Retiring again is a no-op.
	again, _ := retireAsync(t, c.Endpoints)
	select {
	case <-again:
	case <-time.After(5 * time.Second):
		t.Fatal("Retire of a retired lock did not return at once")
	}
	// Deleting the record opens the old election again.
	deleteRecord(t, c.Endpoints)
	if l := tr.waitLeader(t, 10*time.Second, ""); l != "b" {
		t.Fatalf("leader = %q after the record was deleted, want b", l)
	}
	if why := b.el.Status().Ineligible; why != "" {
		t.Fatalf("b still says %q after it took the lock", why)
	}
}

// A holder cut off from etcd has stepped down before Retire lands: the
// same guarantee a candidate's takeover gives.
func TestRetireTakesAnExpiredLockOnlyAfterTheHolderSteppedDown(t *testing.T) {
	c := etcdtest.Start(t, 1)
	tr := newTracker(t)
	a := startCandidate(t, "a", c.Endpoints, tr, tLease, tRenew, tRetry)
	tr.waitLeader(t, 10*time.Second, "")
	retired, _ := retireAsync(t, c.Endpoints)
	cut := time.Now()
	a.lock.cut.Store(true)
	var at time.Time
	select {
	case at = <-retired:
	case <-time.After(15 * time.Second):
		t.Fatal("Retire did not take the expired lock")
	}
	tr.mu.Lock()
	stops := tr.stops["a"]
	tr.mu.Unlock()
	if len(stops) == 0 || !stops[0].Before(at) {
		t.Fatalf("Retire landed %v after the cut, before a stepped down (%v)", at.Sub(cut), stops)
	}
	if at.Sub(cut) < tLease-tRetry {
		t.Fatalf("Retire landed %v after the cut, sooner than a lease (%v)", at.Sub(cut), tLease)
	}
	t.Logf("a stepped down %v after the cut; Retire landed %v after it", stops[0].Sub(cut), at.Sub(cut))
}

// Candidates and Retire race for a free lock, and leaders stop in random
// order: whoever wins, nobody leads once Retire has returned.
func TestRetireRacingCandidates(t *testing.T) {
	c := etcdtest.Start(t, 1)
	for round := range 4 {
		deleteRecord(t, c.Endpoints)
		tr := newTracker(t)
		var cands []*candidate
		for _, n := range []string{"a", "b", "c"} {
			cands = append(cands, startCandidate(t, n, c.Endpoints, tr, tLease, tRenew, tRetry))
		}
		retired, cancel := retireAsync(t, c.Endpoints)
		var at time.Time
		for _, i := range rand.Perm(len(cands)) {
			select {
			case at = <-retired:
			case <-time.After(time.Duration(rand.IntN(300)) * time.Millisecond):
			}
			if !at.IsZero() {
				break
			}
			cands[i].stop()
		}
		if at.IsZero() {
			select {
			case at = <-retired:
			case <-time.After(10 * time.Second):
				t.Fatalf("round %d: Retire did not land after every candidate stopped", round)
			}
		}
		testkit.Always(t, 2*tLease, "nobody leading after Retire returned", func() bool {
			tr.mu.Lock()
			defer tr.mu.Unlock()
			return len(tr.leading) == 0
		})
		t.Logf("round %d: Retire landed after %d of 3 leaders stopped", round, len(tr.stops))
		tr.mu.Lock()
		for n, starts := range tr.starts {
			stops := tr.stops[n]
			for i, s := range starts {
				if s.After(at) {
					t.Errorf("round %d: %s started leading %v after Retire returned", round, n, s.Sub(at))
				}
				if i >= len(stops) || stops[i].After(at) {
					t.Errorf("round %d: %s still led when Retire returned", round, n)
				}
			}
		}
		for n := range tr.leading {
			t.Errorf("round %d: %s leads after Retire returned", round, n)
		}
		tr.mu.Unlock()
		for _, cd := range cands {
			cd.stop()
		}
		cancel()
	}
}
