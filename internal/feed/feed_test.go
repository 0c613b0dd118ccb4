package feed

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vigil-ha/vigil/internal/testkit"
)

// Short timings: a heartbeat every 50 ms, stale after 300 ms.
const (
	beat  = 50 * time.Millisecond
	stale = 300 * time.Millisecond
)

func view(node string, up ...bool) View {
	v := View{Node: node}
	for i, u := range up {
		v.APIServers = append(v.APIServers, Backend{Addr: fmt.Sprintf("10.0.0.%d:6443", i+1), Up: u})
	}
	return v
}

// serve runs a feed server on a loopback listener it opened itself (no
// port is picked and hoped for); stop ends it and closes its streams.
type served struct {
	s    *Server
	addr string
	stop func()
}

func serve(t *testing.T, cfg ServerConfig) *served {
	t.Helper()
	if cfg.Heartbeat == 0 {
		cfg.Heartbeat = beat
	}
	s, err := NewServer(cfg, testkit.Log(t))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Serve: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return &served{s: s, addr: ln.Addr().String(), stop: stop}
}

type watcher struct {
	f      *Follower
	views  testkit.Record[View]
	fresh  testkit.Record[bool]
	cancel func()
}

func follow(t *testing.T, eps ...string) *watcher {
	t.Helper()
	return followStale(t, stale, eps...)
}

func followStale(t *testing.T, stale time.Duration, eps ...string) *watcher {
	t.Helper()
	w := &watcher{}
	w.f = NewFollower(FollowerConfig{
		Endpoints:  func() []string { return eps },
		Stale:      stale,
		MaxBackoff: stale,
		OnView:     w.views.Add,
		OnFresh:    w.fresh.Add,
	}, testkit.Log(t))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = w.f.Run(ctx) }()
	w.cancel = func() { cancel(); <-done }
	t.Cleanup(w.cancel)
	return w
}

func (w *watcher) waitView(t *testing.T, want View) {
	t.Helper()
	testkit.WaitFor(t, 5*time.Second, "the follower to read "+fmt.Sprint(want), func() bool {
		fresh, v, _ := w.f.State()
		return fresh && v.Equal(want)
	})
}

func TestFollowerReadsEachChange(t *testing.T) {
	s := serve(t, ServerConfig{})
	v1 := view("n1", true, true, true)
	s.s.Publish(v1)
	w := follow(t, s.addr)
	w.waitView(t, v1)
	v2 := view("n1", true, false, true)
	s.s.Publish(v2)
	w.waitView(t, v2)
	s.s.Publish(v2) // the same view: nothing new is sent
	testkit.Always(t, 4*beat, "no view but the two published", func() bool { return len(w.views.All()) == 2 })
	if got := w.fresh.All(); len(got) != 1 || !got[0] {
		t.Fatalf("fresh changes = %v, want [true]", got)
	}
}

// Heartbeats keep a quiet feed fresh, for many times Stale.
func TestHeartbeatsKeepAQuietFeedFresh(t *testing.T) {
	s := serve(t, ServerConfig{})
	v := view("n1", true)
	s.s.Publish(v)
	w := follow(t, s.addr)
	w.waitView(t, v)
	testkit.Always(t, 5*stale, "the feed to stay fresh", func() bool {
		fresh, _, _ := w.f.State()
		return fresh
	})
	if got := len(w.views.All()); got != 1 {
		t.Fatalf("views read = %d, want 1 (heartbeats carry no view)", got)
	}
}

// When the feed read ends, the follower reads the next one; the view stays
// in effect meanwhile, so the agent does not fall back for a node's
// restart.
func TestFollowerMovesToTheNextFeed(t *testing.T) {
	a, b := serve(t, ServerConfig{}), serve(t, ServerConfig{})
	va, vb := view("a", true, true), view("b", true, false)
	a.s.Publish(va)
	b.s.Publish(vb)
	w := follow(t, a.addr, b.addr)
	w.waitView(t, va)
	a.stop()
	w.waitView(t, vb)
	if _, _, src := w.f.State(); src != b.addr {
		t.Fatalf("source = %s, want %s", src, b.addr)
	}
	if got := w.fresh.All(); len(got) != 1 {
		t.Fatalf("fresh changes = %v, want one: moving between feeds within Stale is no gap", got)
	}
}

// A node that has no view yet answers 503: the follower reads another.
func TestNoViewYetIsRefused(t *testing.T) {
	empty, full := serve(t, ServerConfig{}), serve(t, ServerConfig{})
	resp, err := http.Get("http://" + empty.addr + Path)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("before any view: HTTP %d, want 503", resp.StatusCode)
	}
	v := view("full", true)
	full.s.Publish(v)
	w := follow(t, empty.addr, full.addr)
	w.waitView(t, v)
}

// A feed that stops talking without closing (a frozen node: its kernel
// still completes TCP handshakes, its process answers nothing) goes stale
// after Stale, and the follower says so once; it comes back fresh when the
// node answers again.
func TestASilentFeedGoesStale(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	thawed, done := make(chan struct{}), make(chan struct{})
	defer close(done)
	var first atomic.Bool
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = bufio.NewReader(c).ReadString('\n')
				if !first.CompareAndSwap(false, true) {
					<-thawed // frozen: no answer at all
				}
				fmt.Fprint(c, "HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\n\r\n")
				fmt.Fprint(c, `{"seq":1,"view":{"node":"frozen","apiservers":[{"addr":"10.0.0.1:6443","up":true}]}}`+"\n")
				<-thawed // the first stream: one view, then silence
				for {
					select {
					case <-done:
						return
					case <-time.After(beat):
					}
					if _, err := fmt.Fprint(c, `{"seq":1}`+"\n"); err != nil {
						return
					}
				}
			}()
		}
	}()
	w := follow(t, ln.Addr().String())
	testkit.WaitFor(t, 5*time.Second, "the view of the feed", func() bool { return len(w.views.All()) == 1 })
	start := time.Now()
	testkit.WaitFor(t, 5*time.Second, "the feed to go stale", func() bool {
		fresh, _, _ := w.f.State()
		return !fresh
	})
	if d := time.Since(start); d < stale/2 {
		t.Fatalf("stale after %v, before Stale (%v)", d, stale)
	}
	testkit.Always(t, 3*stale, "stale while the node is frozen", func() bool {
		fresh, _, _ := w.f.State()
		return !fresh
	})
	if got := w.fresh.All(); len(got) != 2 || !got[0] || got[1] {
		t.Fatalf("fresh changes = %v, want [true false]", got)
	}
	close(thawed)
	testkit.WaitFor(t, 10*time.Second, "fresh again", func() bool {
		fresh, _, _ := w.f.State()
		return fresh
	})
	testkit.Always(t, 3*stale, "fresh on heartbeats", func() bool {
		fresh, _, _ := w.f.State()
		return fresh
	})
}

// One change reaches a thousand followers, each over its own stream; the
// follower limit turns the one too many away.
func TestManyFollowersAndTheLimit(t *testing.T) {
	const n = 1000
	s := serve(t, ServerConfig{MaxFollowers: n})
	v1 := view("n1", true, true)
	s.s.Publish(v1)
	ws := make([]*watcher, n)
	for i := range ws {
		// A production Stale (it is also the dial timeout): a thousand
		// connections at once, under -race, on two cores.
		ws[i] = followStale(t, DefaultStale, s.addr)
	}
	for _, w := range ws {
		w.waitView(t, v1)
	}
	testkit.WaitFor(t, 5*time.Second, "every stream counted", func() bool { return s.s.Followers() == n })
	resp, err := http.Get("http://" + s.addr + Path)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("follower %d: HTTP %d, want 503", n+1, resp.StatusCode)
	}
	v2 := view("n1", false, true)
	start := time.Now()
	s.s.Publish(v2)
	for _, w := range ws {
		w.waitView(t, v2)
	}
	t.Logf("a change reached %d followers in %v", n, time.Since(start))
	for _, w := range ws {
		w.cancel()
	}
	testkit.WaitFor(t, 5*time.Second, "every stream closed", func() bool { return s.s.Followers() == 0 })
}

func TestServerRefusesAllButGET(t *testing.T) {
	s := serve(t, ServerConfig{})
	s.s.Publish(view("n1", true))
	resp, err := http.Post("http://"+s.addr+Path, "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("POST: HTTP %d, want 405", resp.StatusCode)
	}
}
