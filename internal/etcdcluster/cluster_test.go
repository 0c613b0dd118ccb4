package etcdcluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/vigil-ha/vigil/internal/etcdtest"
	"github.com/vigil-ha/vigil/internal/netfault"
	"github.com/vigil-ha/vigil/internal/testaddr"
	"github.com/vigil-ha/vigil/internal/testkit"
)

// ctx bounds one step of a test.
func ctx(t *testing.T) context.Context { return testkit.Context(t, 10*time.Second) }

func TestMain(m *testing.M) {
	etcdtest.Main(m, etcdtest.MemberChangeLeakOptions()...)
}

func newCluster(t *testing.T, cfg Config) *Cluster {
	t.Helper()
	c, err := New(cfg, testkit.Log(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func sorted(s []string) []string { return slices.Sorted(slices.Values(s)) }

// Seeded with one endpoint, the connection follows the member list: it
// reaches every member, and drops one that left.
func TestFollowsTheMemberList(t *testing.T) {
	e := etcdtest.StartDistinct(t, 3)
	c := newCluster(t, Config{Endpoints: e.Endpoints[:1]})
	if _, err := c.MemberList(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if got, want := c.Endpoints(), sorted(e.Endpoints); !slices.Equal(got, want) {
		t.Fatalf("endpoints from a one-member seed = %v, want every member %v", got, want)
	}
	if v := c.Voters(); len(v) != 3 {
		t.Fatalf("voters = %v, want 3", v)
	}
	id := uint64(e.Members[2].Server.MemberID())
	etcdtest.Retry(t, 20*time.Second, "etcd to accept the removal", func() error {
		_, err := OnLeader(ctx(t), c, func(ctx context.Context, cli *clientv3.Client) (*clientv3.MemberRemoveResponse, error) {
			return cli.MemberRemove(ctx, id)
		})
		return err
	})
	if _, err := c.FreshMemberList(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if got, want := c.Endpoints(), sorted(e.Endpoints[:2]); !slices.Equal(got, want) {
		t.Fatalf("endpoints after removing %s = %v, want %v", e.Endpoints[2], got, want)
	}
	if v := c.Voters(); len(v) != 2 {
		t.Fatalf("voters after the removal = %v, want 2", v)
	}
}

// With KeepSeeds a seed that no member advertises (here a proxy in front
// of the member, as a load balancer or a DNS alias would be) stays
// connected; without it, it goes.
func TestKeepSeeds(t *testing.T) {
	e := etcdtest.Start(t, 1)
	ln, err := net.Listen("tcp", testaddr.Loopback(t)+":0")
	if err != nil {
		t.Fatal(err)
	}
	p := netfault.NewProxy(ln, strings.TrimPrefix(e.Endpoints[0], "http://"), testkit.Log(t))
	t.Cleanup(func() { _ = p.Close() })
	alias := "http://" + ln.Addr().String()
	for _, keep := range []bool{false, true} {
		t.Run(fmt.Sprint("keep=", keep), func(t *testing.T) {
			c := newCluster(t, Config{Endpoints: []string{alias}, KeepSeeds: keep})
			if _, err := c.MemberList(ctx(t)); err != nil {
				t.Fatal(err)
			}
			want := []string{e.Endpoints[0]}
			if keep {
				want = sorted([]string{alias, e.Endpoints[0]})
			}
			if got := c.Endpoints(); !slices.Equal(got, want) {
				t.Fatalf("endpoints = %v, want %v", got, want)
			}
		})
	}
}

// The member list is read once per interval for the whole process:
// concurrent callers share one read, a caller within the interval gets
// the cached list, FreshMemberList reads again.
func TestMemberListIsShared(t *testing.T) {
	e := etcdtest.Start(t, 3)
	c := newCluster(t, Config{Endpoints: e.Endpoints, ListInterval: time.Hour})
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for range 20 {
		wg.Go(func() {
			if _, err := c.MemberList(ctx(t)); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if n := c.ListReads(); n != 1 {
		t.Fatalf("20 concurrent callers made %d reads, want 1", n)
	}
	l, err := c.MemberList(ctx(t))
	if err != nil || len(l) != 3 {
		t.Fatalf("cached list = %v, %v", l, err)
	}
	if n := c.ListReads(); n != 1 {
		t.Fatalf("a caller within the interval made a read (%d)", n)
	}
	if _, err := c.FreshMemberList(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if n := c.ListReads(); n != 2 {
		t.Fatalf("FreshMemberList made %d reads in all, want 2", n-1)
	}
}

// A dead member costs nothing: operations answer through the others, and
// StatusAll reports the live ones.
func TestDoAroundADeadMember(t *testing.T) {
	e := etcdtest.Start(t, 3)
	c := newCluster(t, Config{Endpoints: e.Endpoints})
	e.Kill(0)
	e.WaitLeader(10 * time.Second)
	start := time.Now()
	etcdtest.Retry(t, 10*time.Second, "a put through the live members", func() error {
		_, err := Do(ctx(t), c, func(ctx context.Context, m *Member) (*clientv3.PutResponse, error) {
			return m.Client.Put(ctx, "/k", "v")
		})
		return err
	})
	t.Logf("put answered %v after the kill", time.Since(start).Round(time.Millisecond))
	sctx, cancel := context.WithTimeout(ctx(t), time.Second)
	st := c.StatusAll(sctx)
	cancel()
	if len(st) != 2 {
		t.Fatalf("StatusAll answered by %d members, want the 2 live ones: %+v", len(st), st)
	}
	if _, err := c.MemberList(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if leaderless, err := c.StoreLeaderless(ctx(t)); err != nil || leaderless {
		t.Fatalf("StoreLeaderless with 2 of 3 voters and a leader = %v, %v", leaderless, err)
	}
}

// DoUntil returns a final error at once; Do joins every member's failure.
func TestDoErrors(t *testing.T) {
	e := etcdtest.Start(t, 2)
	c := newCluster(t, Config{Endpoints: e.Endpoints})
	lost := errors.New("lost the race")
	_, err := DoUntil(ctx(t), c, func(ctx context.Context, m *Member) (int, error) { return 0, lost },
		func(err error) bool { return errors.Is(err, lost) })
	if !errors.Is(err, lost) {
		t.Fatalf("DoUntil = %v, want the final error", err)
	}
	broken := errors.New("broken")
	_, err = Do(ctx(t), c, func(ctx context.Context, m *Member) (int, error) { return 0, fmt.Errorf("%s: %w", m.Endpoint, broken) })
	if !errors.Is(err, broken) {
		t.Fatalf("Do = %v, want every member's error", err)
	}
	for _, ep := range e.Endpoints {
		if !contains(err.Error(), ep) {
			t.Fatalf("Do's error %q does not name %s", err, ep)
		}
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

// MoveLeader hands raft leadership to the voter named, through the
// leader's own connection; ShedLeadership moves it off a named member.
func TestMoveAndShedLeadership(t *testing.T) {
	e := etcdtest.Start(t, 3)
	c := newCluster(t, Config{Endpoints: e.Endpoints})
	lead := e.WaitLeader(10 * time.Second)
	to := (lead + 1) % 3
	etcdtest.Retry(t, 10*time.Second, "the move", func() error {
		return c.MoveLeader(ctx(t), uint64(e.Members[to].Server.MemberID()))
	})
	if got := e.WaitLeader(5 * time.Second); got != to {
		t.Fatalf("leader after MoveLeader = %d, want %d", got, to)
	}
	if err := c.MoveLeader(ctx(t), uint64(e.Members[to].Server.MemberID())); err != nil {
		t.Fatalf("MoveLeader to the leader itself = %v, want nil", err)
	}
	if moved, err := c.ShedLeadership(ctx(t), e.Names[(to+1)%3]); err != nil || moved != "" {
		t.Fatalf("ShedLeadership of a follower = %q, %v; want nothing done", moved, err)
	}
	var moved string
	etcdtest.Retry(t, 10*time.Second, "the shed", func() error {
		var err error
		moved, err = c.ShedLeadership(ctx(t), e.Names[to])
		return err
	})
	if moved == "" || moved == e.Names[to] {
		t.Fatalf("ShedLeadership moved leadership to %q", moved)
	}
	if got := e.WaitLeader(5 * time.Second); got == to {
		t.Fatal("leadership stayed on the shed member")
	}
}

// With two voters, ShedLeadership leaves leadership where it is: either
// member's loss loses the quorum, and a move only pauses writes.
func TestShedLeadershipLeavesTwoVoters(t *testing.T) {
	e := etcdtest.Start(t, 2)
	c := newCluster(t, Config{Endpoints: e.Endpoints})
	lead := e.WaitLeader(10 * time.Second)
	var err error
	etcdtest.Retry(t, 10*time.Second, "an answer from both members", func() error {
		_, err = c.ShedLeadership(ctx(t), e.Names[lead])
		if err != nil && strings.Contains(err.Error(), "does not answer") {
			return err
		}
		return nil
	})
	if !errors.Is(err, ErrShedDeferred) || !strings.Contains(err.Error(), "2 voters") {
		t.Fatalf("ShedLeadership with 2 voters = %v, want deferred", err)
	}
	if got := e.WaitLeader(5 * time.Second); got != lead {
		t.Fatalf("leadership moved from %d to %d", lead, got)
	}
}

// Unaware names the answering members that do not list an ID: every one
// for an ID nobody added, none once an addition is applied everywhere, and
// never a dead member.
func TestUnaware(t *testing.T) {
	e := etcdtest.StartDistinct(t, 3)
	c := newCluster(t, Config{Endpoints: e.Endpoints})
	if got := c.Unaware(ctx(t), 12345); !slices.Equal(got, sorted(e.Endpoints)) {
		t.Fatalf("Unaware(unknown ID) = %v, want every member %v", got, sorted(e.Endpoints))
	}
	var add *clientv3.MemberAddResponse
	etcdtest.Retry(t, 20*time.Second, "etcd to accept the learner", func() (err error) {
		add, err = OnLeader(ctx(t), c, func(ctx context.Context, cli *clientv3.Client) (*clientv3.MemberAddResponse, error) {
			return cli.MemberAddAsLearner(ctx, []string{"http://127.0.0.99:2380"})
		})
		return err
	})
	etcdtest.Retry(t, 10*time.Second, "every member to list the learner", func() error {
		if u := c.Unaware(ctx(t), add.Member.ID); len(u) > 0 {
			return fmt.Errorf("%v do not list it", u)
		}
		return nil
	})
	e.Kill(2)
	if got := c.Unaware(ctx(t), 12345); !slices.Equal(got, sorted(e.Endpoints[:2])) {
		t.Fatalf("Unaware(unknown ID) with member 3 dead = %v, want the live ones %v", got, sorted(e.Endpoints[:2]))
	}
}

// OnLeaderExcept runs op on the raft leader unless the member it keeps
// out leads; then it answers ErrLeads and runs nothing.
func TestOnLeaderExcept(t *testing.T) {
	e := etcdtest.Start(t, 3)
	c := newCluster(t, Config{Endpoints: e.Endpoints})
	lead := e.WaitLeader(10 * time.Second)
	leaderID := uint64(e.Members[lead].Server.MemberID())
	follower := uint64(e.Members[(lead+1)%3].Server.MemberID())
	ran := 0
	op := func(ctx context.Context, cli *clientv3.Client) (*clientv3.StatusResponse, error) {
		ran++
		return cli.Status(ctx, cli.Endpoints()[0])
	}
	if _, err := OnLeaderExcept(ctx(t), c, leaderID, op); !errors.Is(err, ErrLeads) || ran != 0 {
		t.Fatalf("OnLeaderExcept(the leader) = %v after %d runs of op, want ErrLeads and none", err, ran)
	}
	var got *clientv3.StatusResponse
	etcdtest.Retry(t, 10*time.Second, "op on the leader", func() error {
		var err error
		got, err = OnLeaderExcept(ctx(t), c, follower, op)
		return err
	})
	if got.Header.MemberId != leaderID || ran == 0 {
		t.Fatalf("op ran on member %x, want the leader %x", got.Header.MemberId, leaderID)
	}
}
