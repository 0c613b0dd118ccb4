package election

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/vigil-ha/vigil"
	"github.com/vigil-ha/vigil/internal/etcdtest"
	"github.com/vigil-ha/vigil/internal/testkit"
)

// The lock record of each format decodes to the same fields: vigil 0.3.0's
// (no format), this version's, and a later one's with a field this version
// does not know.
func TestLockRecordFormats(t *testing.T) {
	const old = `{"tenure":"t1","holder":"n1","leaseDurationMillis":800,"acquireTime":"2026-12-01T10:00:00Z","renewTime":"2026-12-01T10:00:05Z","transitions":3,"nonce":"x","instance":"h/1/a","mac":"02:00:00:00:00:01"}`
	const later = `{"tenure":"t1","holder":"n1","leaseDurationMillis":800,"acquireTime":"2026-12-01T10:00:00Z","renewTime":"2026-12-01T10:00:05Z","transitions":3,"nonce":"x","instance":"h/1/a","mac":"02:00:00:00:00:01","format":2,"priority":7}`
	for name, v := range map[string]string{"0.3.0": old, "later": later} {
		obs, err := decode(kvs(v))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		r := obs.Record
		if r.Tenure != "t1" || r.Holder != "n1" || r.LeaseDuration() != 800*time.Millisecond || r.Transitions != 3 || r.Instance != "h/1/a" || r.MAC != "02:00:00:00:00:01" {
			t.Errorf("%s: decoded %+v", name, r)
		}
	}
	// This version's: the format last, so the value still begins with the
	// tenure that 0.3.0's renewals compare on.
	b, err := json.Marshal(Record{Tenure: "t1", Holder: "n1", Format: vigil.RecordFormat})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(b), tenurePrefix("t1")) || !strings.HasSuffix(string(b), `,"format":1}`) {
		t.Errorf("encoded %s", b)
	}
}

func kvs(v string) []*mvccpb.KeyValue {
	return []*mvccpb.KeyValue{{Key: []byte("/k"), Value: []byte(v)}}
}

// The claim of each format names its instance.
func TestClaimFormats(t *testing.T) {
	for v, want := range map[string]string{
		"host/123/abcd":                                  "host/123/abcd", // vigil 0.3.0: the bare instance
		claimValue("host/123/abcd"):                      "host/123/abcd",
		`{"format":2,"instance":"host/9/z","since":"x"}`: "host/9/z",
	} {
		if got := claimInstance([]byte(v)); got != want {
			t.Errorf("claimInstance(%s) = %q, want %q", v, got, want)
		}
	}
	if claimValue("a") != claimValue("a") || !strings.Contains(claimValue("a"), `"format":1`) {
		t.Errorf("claimValue = %s", claimValue("a"))
	}
}

// A rolling upgrade's mixed state, on a real etcd: a node name claimed by
// a vigil 0.3.0 process (its bare instance, rewritten as 0.3.0 does) is
// refused to this version's process while it lives, and taken over once it
// stops rewriting.
func TestClaimOfPreviousFormat(t *testing.T) {
	c := etcdtest.Start(t, 1)
	l, err := NewEtcdLock(EtcdConfig{Endpoints: c.Endpoints, Key: "/test/leader"}, testkit.Log(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints, DialTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	key := "/test/leader/names/n1"
	grant, err := cli.Grant(ctx, claimTTL)
	if err != nil {
		t.Fatal(err)
	}
	// The old process: puts its bare instance and rewrites it every
	// claimKeepAlive, as 0.3.0's keep-alive did, until stopped.
	oldCtx, stopOld := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			_, _ = cli.KeepAliveOnce(oldCtx, grant.ID)
			_, _ = cli.Put(oldCtx, key, "oldhost/1/aaaa", clientv3.WithLease(grant.ID))
			select {
			case <-oldCtx.Done():
				return
			case <-time.After(claimKeepAlive):
			}
		}
	}()
	defer func() { stopOld(); <-done }()
	testkit.WaitFor(t, 5*time.Second, "the old claim", func() bool {
		resp, err := cli.Get(ctx, key)
		return err == nil && len(resp.Kvs) == 1
	})
	if _, err := l.ClaimName(ctx, "n1", "newhost/2/bbbb", testkit.Log(t)); !errors.Is(err, ErrDuplicateIdentity) || !strings.Contains(err.Error(), "oldhost/1/aaaa") {
		t.Fatalf("claim beside a live 0.3.0 owner = %v, want ErrDuplicateIdentity naming it", err)
	}
	stopOld()
	<-done
	claim, err := l.ClaimName(ctx, "n1", "newhost/2/bbbb", testkit.Log(t))
	if err != nil {
		t.Fatalf("claim after the 0.3.0 owner stopped: %v", err)
	}
	defer claim.Close()
	resp, err := cli.Get(ctx, key)
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != claimValue("newhost/2/bbbb") {
		t.Fatalf("claim key after the takeover = %v, %v", resp, err)
	}
}

// The Lease carries the format as an annotation; a Lease without it
// (vigil 0.3.0, or another tool) reads as format 0 with the same fields.
func TestLeaseFormat(t *testing.T) {
	l := &LeaseLock{namespace: "kube-system", name: "vigil"}
	lease := l.toLease(Record{Holder: "n1", LeaseDurationMillis: 800, Tenure: "t1", MAC: "02:00:00:00:00:01"})
	if lease.Annotations[formatAnnotation] != "1" {
		t.Fatalf("annotations %v", lease.Annotations)
	}
	lease.ResourceVersion = "42"
	obs, err := observeLease(lease)
	if err != nil || obs.Record.Format != vigil.RecordFormat || obs.Record.Tenure != "t1" {
		t.Fatalf("observed %+v, %v", obs.Record, err)
	}
	delete(lease.Annotations, formatAnnotation)
	obs, err = observeLease(lease)
	if err != nil || obs.Record.Format != 0 || obs.Record.Holder != "n1" || obs.Record.LeaseDuration() != 800*time.Millisecond || obs.Record.MAC != "02:00:00:00:00:01" {
		t.Fatalf("observed without the annotation %+v, %v", obs.Record, err)
	}
}
