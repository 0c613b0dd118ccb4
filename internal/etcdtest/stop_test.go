package etcdtest

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/vigil-ha/vigil/internal/testkit"
)

// hammer asks every endpoint for its Status without pause until stop,
// as vigil's fan-out does at its own pace; errors are expected once a
// member goes.
func hammer(t *testing.T, endpoints []string, stop <-chan struct{}) (*sync.WaitGroup, *atomic.Int64) {
	t.Helper()
	var wg sync.WaitGroup
	var asked atomic.Int64
	for _, ep := range endpoints {
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}, DialTimeout: time.Second, Logger: zap.NewNop()})
		if err != nil {
			t.Fatal(err)
		}
		for range 3 {
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
					_, _ = cli.Status(ctx, ep)
					cancel()
					asked.Add(1)
				}
			})
		}
		t.Cleanup(func() { cli.Close() })
	}
	return &wg, &asked
}

// askedMore waits until the clients have asked n more times.
func askedMore(t *testing.T, asked *atomic.Int64, n int64) {
	t.Helper()
	want := asked.Load() + n
	testkit.WaitFor(t, 10*time.Second, "Status requests", func() bool { return asked.Load() >= want })
}

// A member stopped while clients ask it for its Status, by Kill or by its
// removal from the cluster, answers none of them from its closed
// database: etcd would dereference a nil transaction there and end the
// test binary (stopClients). The test passes by not crashing; without
// stopClients it crashed 10 runs in 10, in the first round.
func TestStopWhileClientsAsk(t *testing.T) {
	for round := range 3 {
		c := Start(t, 1)
		stop := make(chan struct{})
		wg, asked := hammer(t, c.Endpoints, stop)
		askedMore(t, asked, 30)
		c.Kill(0)
		askedMore(t, asked, 30) // and at the stopped member
		close(stop)
		wg.Wait()
		t.Logf("round %d: killed under Status requests", round)
	}
	c := Start(t, 3)
	c.WaitLeader(10 * time.Second)
	c.WaitReconfigurable()
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints[:1], DialTimeout: time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	for _, i := range []int{2, 1} {
		stop := make(chan struct{})
		wg, asked := hammer(t, c.Endpoints[i:i+1], stop)
		askedMore(t, asked, 30)
		id := uint64(c.Members[i].Server.MemberID())
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if _, err := cli.MemberRemove(ctx, id); err != nil {
			t.Fatalf("remove %s: %v", c.Names[i], err)
		}
		cancel()
		select {
		case <-c.Members[i].Server.StopNotify():
		case <-time.After(10 * time.Second):
			t.Fatalf("%s did not stop after its removal", c.Names[i])
		}
		askedMore(t, asked, 30) // requests keep arriving at the stopped member
		close(stop)
		wg.Wait()
		t.Logf("removed %s under Status requests", c.Names[i])
	}
}

// Remove takes a member out through the others, and removing it again is
// not an error: a retry after a lost answer meets a member already gone.
func TestRemoveIsDoneOnceAndIdempotent(t *testing.T) {
	c := Start(t, 3)
	c.WaitReconfigurable()
	c.Remove(2, 20*time.Second)
	c.Remove(2, 20*time.Second)
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints[:1], DialTimeout: time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := cli.MemberList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Members) != 2 {
		t.Fatalf("members after removing %s: %v, want 2", c.Names[2], resp.Members)
	}
	for _, m := range resp.Members {
		if m.Name == c.Names[2] {
			t.Fatalf("%s is still a member", c.Names[2])
		}
	}
	select {
	case <-c.Members[2].Server.StopNotify():
	case <-time.After(10 * time.Second):
		t.Fatalf("%s did not stop after its removal", c.Names[2])
	}
}
