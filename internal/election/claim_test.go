package election

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/vigil-ha/vigil/internal/etcdtest"
	"github.com/vigil-ha/vigil/internal/testkit"
)

func TestClaimName(t *testing.T) {
	c := etcdtest.Start(t, 1)
	lock := func() *EtcdLock {
		l, err := NewEtcdLock(EtcdConfig{Endpoints: c.Endpoints, Key: "/test/leader"}, testkit.Log(t))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(l.Close)
		return l
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a, b := lock(), lock()

	first, err := a.ClaimName(ctx, "n1", "host/pid-1/aaaa", testkit.Log(t))
	if err != nil {
		t.Fatal(err)
	}
	// A live owner: refused, and the error names it. Wait past a full TTL
	// first, so the refusal relies on the keep-alive, not on a fresh lease.
	time.Sleep(claimTTL * time.Second)
	start := time.Now()
	_, err = b.ClaimName(ctx, "n1", "host/pid-2/bbbb", testkit.Log(t))
	if !errors.Is(err, ErrDuplicateIdentity) {
		t.Fatalf("second claim = %v, want ErrDuplicateIdentity", err)
	}
	t.Logf("refused after %v: %v", time.Since(start).Round(time.Millisecond), err)
	// Another name is free.
	other, err := b.ClaimName(ctx, "n2", "host/pid-2/bbbb", testkit.Log(t))
	if err != nil {
		t.Fatal(err)
	}
	other.Close()

	// A clean stop revokes: the next process claims at once.
	first.Close()
	start = time.Now()
	second, err := b.ClaimName(ctx, "n1", "host/pid-3/cccc", testkit.Log(t))
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > time.Second {
		t.Fatalf("claim after a clean stop took %v", took)
	}

	// The owner dies without revoking (its keep-alive and rewrites stop):
	// the next process takes the claim over once nobody rewrote it for
	// claimDeadAfter, without waiting for the lease.
	second.cancel()
	second.wg.Wait()
	second.cancel = nil // Close must not revoke: the process is "dead"
	start = time.Now()
	third, err := a.ClaimName(ctx, "n1", "host/pid-4/dddd", testkit.Log(t))
	if err != nil {
		t.Fatal(err)
	}
	defer third.Close()
	took := time.Since(start)
	t.Logf("claimed a dead owner's name after %v", took.Round(time.Millisecond))
	if took > claimDeadAfter+2*time.Second {
		t.Fatalf("waited %v for a dead owner's claim", took)
	}
}

// etcd extends every lease when its raft leader changes, so a dead owner's
// claim can look renewed. The newcomer must still see that nobody rewrites
// it, and claim the name once it goes.
func TestClaimOfDeadOwnerAcrossEtcdLeaderChange(t *testing.T) {
	c := etcdtest.Start(t, 3)
	l, err := NewEtcdLock(EtcdConfig{Endpoints: c.Endpoints, Key: "/test/leader"}, testkit.Log(t))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dead, err := l.ClaimName(ctx, "n1", "host/pid-1/aaaa", testkit.Log(t))
	if err != nil {
		t.Fatal(err)
	}
	dead.cancel() // the owner dies: no keep-alive, no rewrite, no revoke
	dead.wg.Wait()
	dead.cancel = nil
	time.Sleep(2 * time.Second)
	c.Kill(c.WaitLeader(10 * time.Second)) // a new raft leader extends the lease
	start := time.Now()
	got, err := l.ClaimName(ctx, "n1", "host/pid-2/bbbb", testkit.Log(t))
	if err != nil {
		t.Fatalf("claim after the owner died and etcd changed leader: %v", err)
	}
	defer got.Close()
	took := time.Since(start)
	t.Logf("claimed after %v", took.Round(time.Millisecond))
	if took > claimDeadAfter+3*time.Second {
		t.Fatalf("waited %v: the extended lease held the claim", took)
	}
}
