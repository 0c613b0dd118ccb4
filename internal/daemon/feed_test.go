package daemon

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vigil-ha/vigil/internal/feed"
	"github.com/vigil-ha/vigil/internal/health"
	"github.com/vigil-ha/vigil/internal/membership"
	"github.com/vigil-ha/vigil/internal/testkit"
)

// TestFeedPartPublishesWhatTheNodeSees runs the feed part as vigil run
// wires it: a real health checker of two stand-in API servers, the
// membership observer's view, and an agent's follower reading the feed.
// The view follows each: an API server that starts failing /readyz, a
// member that becomes unreachable; learners are left out.
func TestFeedPartPublishesWhatTheNodeSees(t *testing.T) {
	var draining atomic.Bool
	ready := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if draining.Load() {
			http.Error(w, "shutting down", http.StatusServiceUnavailable)
		}
	}))
	defer ready.Close()
	other := httptest.NewTLSServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer other.Close()
	apis := []string{strings.TrimPrefix(ready.URL, "https://"), strings.TrimPrefix(other.URL, "https://")}
	slices.Sort(apis)

	p := &feedPart{node: "n1", log: testkit.Log(t), poke: make(chan struct{}, 1)}
	var err error
	p.srv, err = feed.NewServer(feed.ServerConfig{Heartbeat: 50 * time.Millisecond}, testkit.Log(t))
	if err != nil {
		t.Fatal(err)
	}
	if p.ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	p.checker, err = health.New(health.Config{
		TLS: &tls.Config{InsecureSkipVerify: true}, Interval: 50 * time.Millisecond, Timeout: 500 * time.Millisecond,
		OnChange: func(health.Status) { p.changed() },
	}, testkit.Log(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.checker.Close()
	p.checker.Set(apis)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); p.Run(ctx) }()
	defer func() { cancel(); <-done }()

	f := feed.NewFollower(feed.FollowerConfig{Endpoints: func() []string { return []string{p.ln.Addr().String()} }}, testkit.Log(t))
	fctx, fcancel := context.WithCancel(context.Background())
	fdone := make(chan struct{})
	go func() { defer close(fdone); _ = f.Run(fctx) }()
	defer func() { fcancel(); <-fdone }()
	viewIs := func(what string, ok func(feed.View) bool) {
		t.Helper()
		testkit.WaitFor(t, 10*time.Second, what, func() bool {
			fresh, v, _ := f.State()
			return fresh && ok(v)
		})
	}
	api := func(v feed.View, addr string) feed.Backend {
		for _, b := range v.APIServers {
			if b.Addr == addr {
				return b
			}
		}
		return feed.Backend{}
	}
	readyAddr := strings.TrimPrefix(ready.URL, "https://")
	viewIs("both API servers up, no etcd observed yet", func(v feed.View) bool {
		return v.Node == "n1" && len(v.APIServers) == 2 && feed.HasUp(v.APIServers) && v.Etcd == nil &&
			api(v, apis[0]).Up && api(v, apis[1]).Up
	})
	draining.Store(true)
	viewIs("the draining API server down, with its cause", func(v feed.View) bool {
		b := api(v, readyAddr)
		return !b.Up && b.Cause == health.Draining.String()
	})

	p.observed(membership.View{Members: []membership.Member{
		{Name: "m1", ClientURLs: []string{"https://10.0.0.1:2379"}, Reachable: true},
		{Name: "m2", ClientURLs: []string{"https://10.0.0.2:2379"}, Reachable: false},
		{Name: "m3", ClientURLs: []string{"https://10.0.0.3:2379"}, Reachable: true, Learner: true},
	}})
	want := []feed.Backend{
		{Addr: "10.0.0.1:2379", URL: "https://10.0.0.1:2379", Up: true},
		{Addr: "10.0.0.2:2379", URL: "https://10.0.0.2:2379", Cause: health.Unreachable.String()},
	}
	viewIs("the voters, one unreachable, no learner", func(v feed.View) bool { return slices.Equal(v.Etcd, want) })
}
