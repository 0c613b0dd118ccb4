package etcdmember

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/vigil-ha/vigil/internal/etcdtest"
	"github.com/vigil-ha/vigil/internal/testaddr"
	"github.com/vigil-ha/vigil/internal/testkit"
)

// ctx bounds one step of a test.
func ctx(t *testing.T) context.Context { return testkit.Context(t, 10*time.Second) }

func TestMain(m *testing.M) {
	// A killed member leaves etcd's own peer HTTP goroutines behind, and
	// the options that ignore them would hide the Lister's too:
	// TestListerKeepsOneConnection counts the Lister's connections instead.
	etcdtest.Main(m, etcdtest.MemberChangeLeakOptions()...)
}

func newLister(t *testing.T, cfg ListerConfig) *Lister {
	t.Helper()
	l, err := NewLister(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	return l
}

// Seeded with one member, a Lister reads the real member list over the
// JSON gateway, takes every advertised member into its rotation, leaves a
// learner out of what is served, and moves past a member that was killed.
func TestListerReadsFollowsAndMovesOn(t *testing.T) {
	e := etcdtest.StartDistinct(t, 3)
	l := newLister(t, ListerConfig{Endpoints: e.Endpoints[:1]})
	members, err := l.MemberList(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range members {
		names = append(names, m.Name)
	}
	slices.Sort(names)
	if !slices.Equal(names, e.Names) {
		t.Fatalf("members %v, want %v", names, e.Names)
	}
	want := slices.Sorted(slices.Values(e.Endpoints))
	if got := l.Endpoints(); !slices.Equal(got, want) {
		t.Fatalf("rotation after a read from one seed = %v, want every member %v", got, want)
	}

	// A learner (never started) is a member, but it serves nothing.
	cli, err := clientv3.New(clientv3.Config{Endpoints: e.Endpoints, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	// etcd refuses membership changes for its first seconds.
	etcdtest.Retry(t, 15*time.Second, "adding a learner", func() error {
		_, err := cli.MemberAddAsLearner(ctx(t), []string{"http://127.0.0.99:2380"})
		return err
	})
	members, err = l.MemberList(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	learners := 0
	for _, m := range members {
		if m.IsLearner {
			learners++
		}
	}
	if len(members) != 4 || learners != 1 {
		t.Fatalf("%d members, %d learners after adding a learner; want 4 and 1: %+v", len(members), learners, members)
	}
	s := ServingOf(members)
	if hosts := []string{testaddr.Host(t, 0), testaddr.Host(t, 1), testaddr.Host(t, 2)}; !slices.Equal(s.Hosts, hosts) {
		t.Fatalf("served hosts %v, want the three voters %v", s.Hosts, hosts)
	}

	first := l.lastGood
	i := slices.Index(e.Endpoints, first)
	if i < 0 {
		t.Fatalf("the read was answered by %q, not a member", first)
	}
	e.Kill(i)
	e.WaitLeader(10 * time.Second)
	start := time.Now()
	etcdtest.Retry(t, 10*time.Second, "a read through the live members", func() error {
		_, err := l.Serving(ctx(t))
		return err
	})
	t.Logf("read answered %v after the kill", time.Since(start).Round(time.Millisecond))
	if l.lastGood == first {
		t.Fatalf("the read after the kill was answered by the killed member %q", first)
	}
}

// Errors say what is wrong: a gateway that is off, a member that refuses,
// no member at all.
func TestListerErrors(t *testing.T) {
	if _, err := NewLister(ListerConfig{}); err != ErrNoEndpoints {
		t.Fatalf("no endpoints: %v", err)
	}
	if _, err := NewLister(ListerConfig{Endpoints: []string{"10.0.0.1:2379"}}); err == nil || !strings.Contains(err.Error(), "http") {
		t.Fatalf("an endpoint without a scheme: %v", err)
	}
	off := httptest.NewServer(http.NotFoundHandler())
	defer off.Close()
	refusing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(`{"error":"etcdserver: no leader","code":14,"message":"etcdserver: no leader"}`))
	}))
	defer refusing.Close()
	l := newLister(t, ListerConfig{Endpoints: []string{off.URL, refusing.URL}, Try: 500 * time.Millisecond})
	_, err := l.MemberList(ctx(t))
	if err == nil {
		t.Fatal("a read with no member answering succeeded")
	}
	for _, want := range []string{"--enable-grpc-gateway=false", "HTTP 503: etcdserver: no leader", off.URL, refusing.URL} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}

// One connection to one member at a time: reads stay on the member that
// answered; when it fails, its connection is closed before the next member
// is tried.
func TestListerKeepsOneConnection(t *testing.T) {
	a := newCountingServer(t, `{"members":[{"name":"a","clientURLs":["http://192.0.2.1:2379"]}]}`)
	b := newCountingServer(t, `{"members":[{"name":"a","clientURLs":["http://192.0.2.1:2379"]}]}`)
	first, second := a, b
	if b.URL < a.URL {
		first, second = b, a // the rotation is sorted
	}
	l := newLister(t, ListerConfig{Endpoints: []string{a.URL, b.URL}})
	for range 3 {
		if _, err := l.MemberList(ctx(t)); err != nil {
			t.Fatal(err)
		}
	}
	if got := l.Endpoints(); len(got) != 3 {
		t.Fatalf("rotation %v, want the two seeds and the advertised URL", got)
	}
	waitOpen(t, first, 1)
	waitOpen(t, second, 0)
	if first.accepted() != 1 {
		t.Fatalf("%d connections for three reads, want one kept alive", first.accepted())
	}
	first.fail.Store(true)
	if _, err := l.MemberList(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if l.lastGood != second.URL {
		t.Fatalf("the read after a failure was answered by %q, want %q", l.lastGood, second.URL)
	}
	waitOpen(t, first, 0)
	waitOpen(t, second, 1)
}

func waitOpen(t *testing.T, c *countingServer, want int) {
	t.Helper()
	testkit.WaitNil(t, 5*time.Second, fmt.Sprintf("%d connections open to %s", want, c.URL), func() error {
		if n := c.open(); n != want {
			return fmt.Errorf("%d open", n)
		}
		return nil
	})
}

// countingServer answers the member list, or 503 once fail is set, and
// tracks its connections.
type countingServer struct {
	*httptest.Server
	fail  atomic.Bool
	mu    sync.Mutex
	state map[string]http.ConnState
}

func newCountingServer(t *testing.T, body string) *countingServer {
	c := &countingServer{state: map[string]http.ConnState{}}
	c.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != memberListPath || r.Method != http.MethodPost {
			http.NotFound(w, r)
			return
		}
		if c.fail.Load() {
			http.Error(w, `{"message":"failing"}`, http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte(body))
	}))
	c.Config.ConnState = func(conn net.Conn, s http.ConnState) {
		c.mu.Lock()
		c.state[conn.RemoteAddr().String()] = s
		c.mu.Unlock()
	}
	c.Start()
	t.Cleanup(c.Close)
	return c
}

func (c *countingServer) accepted() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.state)
}

func (c *countingServer) open() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, s := range c.state {
		if s != http.StateClosed && s != http.StateHijacked {
			n++
		}
	}
	return n
}

// The Lister learns the cluster ID from a majority of its seeds and then
// refuses a member list from another cluster (an impostor at a member's
// address), neither returning nor following it, and says so once.
func TestListerRefusesAnImpostor(t *testing.T) {
	real := etcdtest.StartDistinct(t, 3)
	impostor := etcdtest.Start(t, 1)
	var reported []string
	seeds := []string{real.Endpoints[0], real.Endpoints[1], impostor.Endpoints[0]}
	l := newLister(t, ListerConfig{Endpoints: seeds, OnForeign: func(ep string, _, _ uint64) { reported = append(reported, ep) }})
	for range 6 { // every endpoint gets its turn in the rotation, twice
		members, err := l.MemberList(ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		if len(members) != 3 {
			t.Fatalf("member list of %d members: the impostor's was believed", len(members))
		}
		if l.ClusterID() == 0 {
			t.Fatal("no cluster ID learned")
		}
		// The rotation moves on only past a failure: force a turn.
		l.readMu.Lock()
		eps := l.Endpoints()
		l.lastGood = eps[(slices.Index(eps, l.lastGood)+1)%len(eps)]
		l.readMu.Unlock()
	}
	if len(reported) != 1 || reported[0] != impostor.Endpoints[0] {
		t.Fatalf("reported %v, want the impostor %s once", reported, impostor.Endpoints[0])
	}
	if f := l.Foreign(); len(f) != 1 {
		t.Fatalf("Foreign = %v", f)
	}
}
