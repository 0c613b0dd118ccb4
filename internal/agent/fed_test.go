package agent

import (
	"context"
	"fmt"
	"net"
	"os"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/vigil-ha/vigil/internal/feed"
	"github.com/vigil-ha/vigil/internal/testaddr"
	"github.com/vigil-ha/vigil/internal/testkit"
)

// feedOn serves a feed on addr until stop or the test's end.
func feedOn(t *testing.T, addr string) (s *feed.Server, stop func()) {
	t.Helper()
	s, err := feed.NewServer(feed.ServerConfig{Heartbeat: 50 * time.Millisecond}, testkit.Log(t))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Serve(ctx, ln) }()
	stopped := false
	stop = func() {
		if !stopped {
			stopped = true
			cancel()
			<-done
		}
	}
	t.Cleanup(stop)
	return s, stop
}

func feedView(node string, apis []*standIn, down ...string) feed.View {
	v := feed.View{Node: node}
	for _, a := range apis {
		b := feed.Backend{Addr: a.name, Up: !slices.Contains(down, a.name)}
		if !b.Up {
			b.Cause = "draining"
		}
		v.APIServers = append(v.APIServers, b)
	}
	return v
}

// TestFeedSteersTheAgent: an agent whose only source is the feed learns the
// API servers from it, stops checking them while it is fresh, takes one out
// the moment the feed says so, trusts its own failed connection over the
// feed's "up", and checks everything itself again when no feed is fresh.
func TestFeedSteersTheAgent(t *testing.T) {
	apiPort, feedPort := testaddr.Port(t), testaddr.Port(t)
	var apis []*standIn
	for i := 1; i <= 3; i++ {
		apis = append(apis, newStandIn(t, fmt.Sprintf("%s:%d", testaddr.Host(t, i), apiPort)))
	}
	vip := testaddr.Host(t, 0) // the seed: nothing serves the API there
	fs, stopFeed := feedOn(t, fmt.Sprintf("%s:%d", vip, feedPort))
	fs.Publish(feedView("cp1", apis))
	// The feed is the only source, so it announces every API server: the
	// first checks are spread over feedFirstCheck (30 s in production).
	a := startAgent(t, Config{Server: fmt.Sprintf("https://%s:%d", vip, apiPort), FeedPort: feedPort, feedFirstCheck: 300 * time.Millisecond})
	all := []string{apis[0].name, apis[1].name, apis[2].name}
	testkit.WaitFor(t, 10*time.Second, "the feed's API servers learned and up", func() bool {
		return slices.Equal(upBackends(a, "apiserver", "cluster"), all)
	})
	if st := a.Status(); st.Feed == nil || !st.Feed.Fresh || st.Feed.Node != "cp1" {
		t.Fatalf("feed status = %+v, want fresh from cp1", st.Feed)
	}

	// Fresh: the agent's checks (every 100 ms here) stop after the first.
	counts := func() []int64 {
		var out []int64
		for _, s := range apis {
			out = append(out, s.checks.Load())
		}
		return out
	}
	testkit.WaitFor(t, 5*time.Second, "each API server's first check", func() bool { return !slices.Contains(counts(), 0) })
	before := counts()
	testkit.Always(t, time.Second, "no checks while the feed vouches", func() bool { return slices.Equal(counts(), before) })

	// The feed says one is draining: out at once, with the feed's word.
	fs.Publish(feedView("cp1", apis, apis[1].name))
	testkit.WaitFor(t, 2*time.Second, "the drained API server out", func() bool {
		return slices.Equal(upBackends(a, "apiserver", "cluster"), []string{apis[0].name, apis[2].name})
	})
	for range 6 {
		if who, err := ask(client(), a.APIServerAddr().String()); err != nil || who == apis[1].name {
			t.Fatalf("answered by %q (%v): the feed said %s is draining", who, err, apis[1].name)
		}
	}
	fs.Publish(feedView("cp1", apis))
	testkit.WaitFor(t, 2*time.Second, "back in", func() bool {
		return slices.Equal(upBackends(a, "apiserver", "cluster"), all)
	})

	// This host's evidence wins: the feed says up, but a connection from
	// here is refused (what the balancer reports through OnDialError; a
	// client's request reaches this backend only when its tier is the
	// nearest, which the latencies measured under -race decide). Down
	// here, and it stays down: checked at --health-interval, refused.
	apis[2].srv.Close()
	a.api.checker.DialFailed(apis[2].name, &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)})
	testkit.WaitFor(t, 5*time.Second, "the closed API server down despite the feed", func() bool {
		return slices.Equal(upBackends(a, "apiserver", "cluster"), []string{apis[0].name, apis[1].name})
	})
	testkit.Always(t, time.Second, "the closed API server still down", func() bool {
		return slices.Equal(backendsIn(a, "apiserver", "cluster", "down"), []string{apis[2].name})
	})
	hc := client()
	for range 6 {
		if who, err := ask(hc, a.APIServerAddr().String()); err != nil || who == apis[2].name {
			t.Fatalf("answered by %q (%v): %s is closed", who, err, apis[2].name)
		}
	}

	// The feed goes away: the agent checks everything itself again.
	stopFeed()
	testkit.WaitFor(t, 10*time.Second, "the feed stale", func() bool { return !a.Status().Feed.Fresh })
	before = counts()
	testkit.WaitFor(t, 5*time.Second, "checks of both live API servers again", func() bool {
		now := counts()
		return now[0] >= before[0]+3 && now[1] >= before[1]+3
	})
}

// With the feed's etcd members, the member list is not read: the agent's
// etcd backends and its cache come from the feed.
func TestFeedReplacesMemberListReads(t *testing.T) {
	apiPort, feedPort := testaddr.Port(t), testaddr.Port(t)
	api := newStandIn(t, fmt.Sprintf("%s:%d", testaddr.Host(t, 1), apiPort))
	vip := testaddr.Host(t, 0)
	fs, _ := feedOn(t, fmt.Sprintf("%s:%d", vip, feedPort))
	// Members at addresses where nothing listens: the seed below is never
	// read while the feed answers for the members.
	etcdA, etcdB := deadAddr(t), deadAddr(t)
	v := feedView("cp1", []*standIn{api})
	v.Etcd = []feed.Backend{{Addr: etcdA, URL: "http://" + etcdA, Up: true}, {Addr: etcdB, URL: "http://" + etcdB, Up: true}}
	slices.SortFunc(v.Etcd, func(x, y feed.Backend) int { return cmpString(x.Addr, y.Addr) })
	fs.Publish(v)
	a := startAgent(t, Config{
		Server: fmt.Sprintf("https://%s:%d", vip, apiPort), FeedPort: feedPort,
		EtcdListen: "127.0.0.1:0", EtcdSeeds: []string{"http://" + deadAddr(t)},
		CacheDir: t.TempDir(),
	})
	testkit.WaitFor(t, 10*time.Second, "the feed's etcd members learned", func() bool {
		return len(backendsIn(a, "etcd", "cluster", "")) == 2
	})
	st := a.Status()
	if st.LastMemberList != nil {
		t.Fatalf("the member list was read at %v, while the feed answered for it", st.LastMemberList)
	}
	if got := a.memberListEndpoints(); !slices.Contains(got, "http://"+etcdA) {
		t.Fatalf("member list endpoints = %v: the feed's client URLs are not remembered", got)
	}
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
