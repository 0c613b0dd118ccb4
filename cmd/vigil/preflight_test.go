package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/vigil-ha/vigil/internal/election"
	"github.com/vigil-ha/vigil/internal/etcdtest"
	"github.com/vigil-ha/vigil/internal/membership"
	"github.com/vigil-ha/vigil/internal/nstest"
)

// holdLock runs an elector, as vigil run does, that holds the lock at
// /vigil/leader until the test ends.
func holdLock(t *testing.T, endpoints []string, name string) {
	t.Helper()
	lock, err := election.NewEtcdLock(election.EtcdConfig{Endpoints: endpoints}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	el, err := election.New(election.Config{Identity: name, Lock: lock, LeaseDuration: 800 * time.Millisecond,
		RenewDeadline: 500 * time.Millisecond, RetryPeriod: 100 * time.Millisecond, ReleaseOnCancel: true}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = el.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done; lock.Close() })
}

type preflightOut struct {
	Join     bool                 `json:"join"`
	Findings []membership.Finding `json:"findings"`
}

// The real binary against a real 3-member etcd: each thing that fails a
// kubeadm join is found, with its fix, and the fix makes it pass.
func TestMembersPreflight(t *testing.T) {
	vigil := nstest.Binary(t, "vigil")
	c := etcdtest.StartDistinct(t, 3)
	eps := strings.Join(c.Endpoints, ",")
	run := func(args ...string) (string, string, int) {
		return runVigil(t, vigil, append([]string{"members", "--etcd-endpoints", eps}, args...)...)
	}
	check := func(args ...string) (preflightOut, string) {
		t.Helper()
		out, stderr, code := run(append([]string{"preflight", "-o", "json"}, args...)...)
		var p preflightOut
		if err := json.Unmarshal([]byte(out), &p); err != nil {
			t.Fatalf("preflight -o json: %v\n%s%s", err, out, stderr)
		}
		if p.Join != (code == 0) {
			t.Fatalf("join %v but exit %d: %s", p.Join, code, stderr)
		}
		return p, stderr
	}
	failed := func(p preflightOut) map[string]membership.Finding {
		m := map[string]membership.Finding{}
		for _, f := range p.Findings {
			if !f.OK && !f.Skip {
				m[f.Check] = f
			}
		}
		return m
	}

	// No vigil has held the VIP yet.
	p, stderr := check()
	if f, ok := failed(p)["VIP holder renewing"]; !ok || !strings.Contains(f.Detail, "no lock record") || len(failed(p)) != 1 {
		t.Fatalf("without a holder: %+v", p)
	}
	if !strings.Contains(stderr, "would not join cleanly") {
		t.Fatalf("stderr = %q", stderr)
	}
	holdLock(t, c.Endpoints, "cp1")
	if p, _ := check(); !p.Join {
		t.Fatalf("healthy cluster with a holder: %+v", p)
	}
	out, _, code := run("preflight")
	if code != 0 || !strings.Contains(out, "yes: a control-plane node can join now") || !strings.Contains(out, "cp1 holds the VIP and renews its lock") {
		t.Fatalf("table: exit %d\n%s", code, out)
	}

	// Joining under the name of a live member.
	p, _ = check("--for-join", "m3")
	if f, ok := failed(p)["no member named m3"]; !ok || len(f.Fix) != 1 || !strings.Contains(f.Fix[0], "vigil members --etcd-endpoints "+eps+" remove m3 --force") {
		t.Fatalf("--for-join m3: %+v", p)
	}
	if f := p.Findings[len(p.Findings)-2]; !f.Skip || !strings.Contains(f.Detail, "no --kubeconfig") {
		t.Fatalf("the Node check without --kubeconfig: %+v", f)
	}

	// A dead member: the join would fail; its removal fixes it.
	c.WaitReconfigurable()
	c.Kill(2)
	etcdtest.Retry(t, 20*time.Second, "preflight to see m3 dead", func() error {
		if p, _ := check(); failed(p)["every member healthy"].Check == "" {
			return errString("m3 still counted healthy")
		}
		return nil
	})
	p, _ = check("--for-join", "m4")
	f := failed(p)["every member healthy"]
	if !strings.Contains(f.Detail, "m3") || len(f.Fix) != 2 || !strings.HasSuffix(f.Fix[0], " remove m3") || !strings.HasSuffix(f.Fix[1], " prune") {
		t.Fatalf("dead m3: %+v", f)
	}
	if testing.Verbose() {
		out, _, _ := run("preflight", "--for-join", "m4")
		t.Logf("preflight with m3 dead:\n%s", out)
	}
	if _, stderr, code := run("remove", "m3"); code != 0 {
		t.Fatalf("the printed fix failed: %s", stderr)
	}
	if p, _ := check("--for-join", "m4"); !p.Join {
		t.Fatalf("after removing m3: %+v", p)
	}

	// A learner takes the one slot.
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints[:2], DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	etcdtest.Retry(t, 20*time.Second, "a learner added", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := cli.MemberAddAsLearner(ctx, []string{"http://127.0.0.99:2380"})
		return err
	})
	p, _ = check()
	if f := failed(p)["learner slot free"]; !strings.Contains(f.Detail, "one learner at a time") {
		t.Fatalf("with a learner: %+v", p)
	}
	// It never started: it is also an unhealthy member, named by ID.
	if f := failed(p)["every member healthy"]; !strings.Contains(f.Detail, "not started") {
		t.Fatalf("the unstarted learner is not reported: %+v", p)
	}
}

type errString string

func (e errString) Error() string { return string(e) }

// The fix commands repeat the connection flags in one order, whatever is
// given.
func TestFixFlagsOrder(t *testing.T) {
	f := etcdFlags{endpoints: []string{"https://127.0.0.1:2379"}, ca: "ca.crt", cert: "c.crt", key: "c.key"}
	for range 20 {
		if got := f.fixFlags(); got != "--etcd-cacert ca.crt --etcd-cert c.crt --etcd-key c.key" {
			t.Fatalf("fixFlags = %q", got)
		}
	}
	f.endpoints = []string{"https://10.0.0.1:2379"}
	if got := f.fixFlags(); got != "--etcd-endpoints https://10.0.0.1:2379 --etcd-cacert ca.crt --etcd-cert c.crt --etcd-key c.key" {
		t.Fatalf("fixFlags = %q", got)
	}
}
