package agentbench

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"sort"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vigil-ha/vigil/internal/agent"
	"github.com/vigil-ha/vigil/internal/feed"
	"github.com/vigil-ha/vigil/internal/health"
	"github.com/vigil-ha/vigil/internal/testaddr"
	"github.com/vigil-ha/vigil/internal/testkit"
)

// BenchmarkFleet runs N real agents against the control plane of
// BenchmarkControlPlaneLoad, with and without the agent feed, and measures
// what the fleet costs the control plane at steady state, then how long a
// change takes to reach the agents:
//
//   - kill: the first API server's process dies (refused from then on);
//     the time until 50 %, 99 % and 100 % of the agents no longer count it
//     up;
//   - add (with the feed only): a fourth API server joins; the time until
//     they count it up.
//
// With the feed, each control-plane host also runs what vigil run runs for
// it: a health checker of the API servers with vigil run's defaults, whose
// statuses make the view (feed.APIServersOf), and a feed server. The
// agents read the first host's feed (the VIP's, in a real cluster).
//
// VIGIL_BENCH_FEED=on (or off) measures one mode only.
//
//	VIGIL_BENCH_AGENTS=1000,5000 go test ./bench/agent -run '^$' -bench Fleet -benchtime 1x -timeout 60m
func BenchmarkFleet(b *testing.B) {
	raiseFileLimit()
	modes := []bool{false, true}
	switch os.Getenv("VIGIL_BENCH_FEED") { // "on" or "off" measures one mode only
	case "on":
		modes = []bool{true}
	case "off":
		modes = []bool{false}
	}
	for _, n := range benchSizes() {
		for _, fed := range modes {
			b.Run(fmt.Sprintf("agents=%d/feed=%v", n, fed), func(b *testing.B) {
				for range b.N {
					cp := startControlPlane(b, fed)
					measureFleet(b, cp, n, fed)
					cp.stop()
				}
			})
		}
	}
}

func measureFleet(b *testing.B, cp *controlPlane, n int, fed bool) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	agents := make([]*agent.Agent, 0, n)
	for range n {
		cfg := agent.Config{
			Server:          "https://" + cp.info.APIServers[0],
			APIServerListen: "127.0.0.1:0",
			EtcdListen:      "127.0.0.1:0",
			EtcdSeeds:       cp.info.Etcd,
			BackendPort:     cp.info.Port,
			APITLS:          &tls.Config{InsecureSkipVerify: true},
			// Goroutines, not event loops: the loops' descriptors (two
			// per loop and listener) would not fit 5,000 agents in
			// one process.
			EventLoops: -1,
			FeedPort:   cp.info.FeedPort,
		}
		a, err := agent.New(cfg, slog.New(slog.DiscardHandler))
		if err != nil {
			b.Fatal(err)
		}
		agents = append(agents, a)
		wg.Go(func() { _ = a.Run(ctx) })
		time.Sleep(startSpacing) // a rollout, not a thousand handshakes at once
	}
	testkit.WaitNilEvery(b, 10*time.Minute, time.Second, "every agent to learn the cluster", func() error {
		for _, a := range agents {
			if !learned(a) {
				return fmt.Errorf("one has upstreams %+v", a.Status().Upstreams)
			}
			if fed && !a.Status().Feed.Fresh {
				return fmt.Errorf("one reads no fresh feed: %+v", a.Status().Feed)
			}
		}
		return nil
	})
	time.Sleep(5 * time.Second) // steady state: start-up checks and reads are over

	before := cp.snapshot(b)
	cpu0 := cpuTime()
	b.ResetTimer()
	time.Sleep(window)
	b.StopTimer()
	after := cp.snapshot(b)
	sec := window.Seconds()
	b.ReportMetric(float64(after.Readyz-before.Readyz)/sec/3, "readyz/s/apiserver")
	b.ReportMetric((after.EtcdHealth-before.EtcdHealth)/sec/3, "health/s/etcd")
	b.ReportMetric((after.MemberList-before.MemberList)/sec, "memberlist/s")
	b.ReportMetric(float64(after.Conns)/3, "conns/apiserver")
	b.ReportMetric((after.CPU-before.CPU)/sec, "cp-cpu-cores")
	b.ReportMetric((cpuTime()-cpu0).Seconds()/sec/float64(n)*1000, "agent-millicores")
	if fed {
		b.Logf("agents reading each node's feed: %v", after.Followers)
	}

	killed := cp.info.APIServers[0]
	start := time.Now()
	cp.control(b, "/kill")
	p := reach(b, agents, start, func(a *agent.Agent) bool { return !backendUp(a, killed) })
	b.ReportMetric(p[0], "kill-p50-s")
	b.ReportMetric(p[1], "kill-p99-s")
	b.ReportMetric(p[2], "kill-p100-s")
	if fed {
		start = time.Now()
		added := cp.control(b, "/add")
		p = reach(b, agents, start, func(a *agent.Agent) bool { return backendUp(a, added) })
		b.ReportMetric(p[0], "add-p50-s")
		b.ReportMetric(p[1], "add-p99-s")
		b.ReportMetric(p[2], "add-p100-s")
	}
	b.ReportMetric(0, "ns/op")
}

// reach sweeps the agents until every one satisfies done, and returns
// when 50 %, 99 % and 100 % did, in seconds after start. A sweep of 5,000
// agents takes a while: each agent's time is that of the first sweep that
// found it done, so the figures are upper bounds, by up to one sweep.
func reach(b *testing.B, agents []*agent.Agent, start time.Time, done func(*agent.Agent) bool) [3]float64 {
	at := make([]float64, len(agents))
	left := len(agents)
	deadline := start.Add(2 * time.Minute)
	var longest time.Duration
	for left > 0 {
		if time.Now().After(deadline) {
			b.Fatalf("after 2 min, %d of %d agents have not seen the change", left, len(agents))
		}
		sweep := time.Now()
		for i, a := range agents {
			if at[i] == 0 && done(a) {
				at[i] = time.Since(start).Seconds()
				left--
			}
		}
		longest = max(longest, time.Since(sweep))
		time.Sleep(10 * time.Millisecond)
	}
	b.Logf("longest sweep of %d agents: %v", len(agents), longest)
	sort.Float64s(at)
	q := func(f float64) float64 { return at[min(len(at)-1, int(f*float64(len(at))+0.5)-1)] }
	return [3]float64{q(0.5), q(0.99), at[len(at)-1]}
}

// backendUp: the agent's API server upstream counts addr up.
func backendUp(a *agent.Agent, addr string) bool {
	for _, u := range a.Status().Upstreams {
		if u.Name != "apiserver" {
			continue
		}
		for _, bk := range u.Backends {
			if bk.Address == addr {
				return bk.State == health.Up.String()
			}
		}
	}
	return false
}

func (cp *controlPlane) control(b *testing.B, path string) string {
	resp, err := http.Get("http://" + cp.info.Counters + path)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		b.Fatal(err)
	}
	return string(out)
}

// feeds is what vigil run does for the agents on each control-plane host:
// its own health checks of the API servers (vigil run's defaults), and a
// feed of what they see. The etcd members are listed up: the bench does
// not fail them.
type feeds struct {
	checkers []*health.Checker
	servers  []*feed.Server
	cancel   context.CancelFunc
	wg       sync.WaitGroup
}

func startFeeds(t *testing.T, info *cpInfo) *feeds {
	f := &feeds{}
	ctx, cancel := context.WithCancel(context.Background())
	f.cancel = cancel
	var etcd []feed.Backend
	for _, u := range info.Etcd {
		etcd = append(etcd, feed.Backend{Addr: u[len("http://"):], URL: u, Up: true})
	}
	slices.SortFunc(etcd, func(a, b feed.Backend) int {
		if a.Addr < b.Addr {
			return -1
		}
		return 1
	})
	port := testaddr.Port(t)
	info.FeedPort = port
	for i := range info.APIServers {
		poke := make(chan struct{}, 1)
		changed := func() {
			select {
			case poke <- struct{}{}:
			default:
			}
		}
		hc, err := health.New(health.Config{
			TLS:      &tls.Config{InsecureSkipVerify: true},
			OnChange: func(health.Status) { changed() },
		}, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		hc.Set(info.APIServers)
		srv, err := feed.NewServer(feed.ServerConfig{}, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("tcp", fmt.Sprintf("%s:%d", testaddr.Host(t, i), port))
		if err != nil {
			t.Fatal(err)
		}
		f.checkers, f.servers = append(f.checkers, hc), append(f.servers, srv)
		node := fmt.Sprintf("cp%d", i)
		f.wg.Go(func() { _ = srv.Serve(ctx, ln) })
		f.wg.Go(func() { // as daemon.feedPart.Run
			tick := time.NewTicker(time.Second)
			defer tick.Stop()
			for {
				srv.Publish(feed.View{Node: node, APIServers: feed.APIServersOf(hc.Statuses()), Etcd: etcd})
				select {
				case <-ctx.Done():
					return
				case <-poke:
				case <-tick.C:
				}
			}
		})
	}
	return f
}

// set is discovery's change: every node checks the new set.
func (f *feeds) set(apis []string) {
	for _, hc := range f.checkers {
		hc.Set(apis)
	}
}

func (f *feeds) followers() []int {
	var out []int
	for _, s := range f.servers {
		out = append(out, s.Followers())
	}
	return out
}

func (f *feeds) close() {
	f.cancel()
	f.wg.Wait()
	for _, hc := range f.checkers {
		hc.Close()
	}
}

// raiseFileLimit lifts this process's descriptor limit as far as it may: 5,000
// agents hold about four each, and their control plane one per stream.
func raiseFileLimit() {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return
	}
	want := max(rl.Max, 200000)
	if syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: want, Max: want}) != nil {
		rl.Cur = rl.Max
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl)
	}
}
