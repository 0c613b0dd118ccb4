package agentbench

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
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
	hosts := startAgentHosts(b, cp.info, n)
	// Polled slowly: a summary of 5,000 agents costs CPU the agents and
	// their feeds share.
	testkit.WaitNilEvery(b, 10*time.Minute, 5*time.Second, "every agent to start and learn the cluster", func() error {
		started := 0
		for _, h := range hosts {
			as := h.status(b)
			started += len(as)
			for _, a := range as {
				if !a.Learned {
					return errors.New("an agent has not learned the three backends of each upstream")
				}
				if fed && !a.Fresh {
					return errors.New("an agent reads no fresh feed")
				}
			}
		}
		if started < n {
			return fmt.Errorf("%d of %d agents started", started, n)
		}
		return nil
	})
	// Steady state: start-up checks and reads are over. With the feed, an
	// agent that learned its backends from it spreads its first checks
	// over agent.FeedFirstCheck.
	settle := 5 * time.Second
	if fed {
		settle += agent.FeedFirstCheck
	}
	time.Sleep(settle)

	after := measureWindow(b, cp, n, func() float64 { return hostsCPU(b, hosts) })
	if fed {
		b.Logf("agents reading each node's feed: %v", after.Followers)
	}

	killed := cp.info.APIServers[0]
	start := time.Now()
	cp.control(b, "/kill")
	up := health.Up.String()
	p := reach(b, hosts, start, killed, func(bk backendSummary) bool { return bk.State != up })
	b.ReportMetric(p[0], "kill-p50-s")
	b.ReportMetric(p[1], "kill-p99-s")
	b.ReportMetric(p[2], "kill-p100-s")
	if fed {
		start = time.Now()
		added := cp.control(b, "/add")
		p = reach(b, hosts, start, added, func(bk backendSummary) bool { return bk.State == up })
		b.ReportMetric(p[0], "add-p50-s")
		b.ReportMetric(p[1], "add-p99-s")
		b.ReportMetric(p[2], "add-p100-s")
	}
	b.ReportMetric(0, "ns/op")
}

// reach sweeps the agents until every one satisfies done for the API
// server addr, and returns when 50 %, 99 % and 100 % did, in seconds after
// start. Each agent's time is when its status says the backend's state
// changed (BackendState.Since), not when a sweep found it: a sweep of 5,000
// agents on two busy cores takes up to seconds.
func reach(b *testing.B, hosts []*agentHost, start time.Time, addr string, done func(backendSummary) bool) [3]float64 {
	deadline := start.Add(2 * time.Minute)
	var longest time.Duration
	for {
		sweep := time.Now()
		var at []float64
		left := 0
		var examples []string
		for _, h := range hosts {
			for _, a := range h.status(b) {
				bk, ok := a.API[addr]
				if !ok || !done(bk) {
					left++
					if len(examples) < 3 {
						examples = append(examples, fmt.Sprintf("%s known %v, state %q since %v, fresh feed %v", addr, ok, bk.State, bk.Since.Format(time.StampMilli), a.Fresh))
					}
					continue
				}
				t := time.Since(start).Seconds()
				if !bk.Since.IsZero() {
					t = bk.Since.Sub(start).Seconds()
				}
				at = append(at, t)
			}
		}
		longest = max(longest, time.Since(sweep))
		if left == 0 {
			b.Logf("longest sweep of %d agents: %v", len(at), longest)
			sort.Float64s(at)
			q := func(f float64) float64 { return at[min(len(at)-1, int(f*float64(len(at))+0.5)-1)] }
			return [3]float64{q(0.5), q(0.99), at[len(at)-1]}
		}
		if time.Now().After(deadline) {
			b.Fatalf("after 2 min, %d of %d agents have not seen the change; %v", left, left+len(at), examples)
		}
		time.Sleep(time.Second) // the times come from Since, not from the sweeps
	}
}

// The agents run in child processes of at most perHost agents each (this
// test binary again, as TestAgentHostHelper): this sandbox's hard limit of
// 20,000 descriptors per process does not hold 5,000 agents. Each holds
// two listeners and its feed, and while it starts, or has no fresh feed,
// its checks' connections and the member list's: 1,000 agents starting in
// one process under load reached the limit.
const (
	agentHostEnv = "VIGIL_BENCH_AGENT_HOST"
	perHost      = 500
)

// fleetSpacing is the time between two agents' starts in the whole fleet:
// startSpacing, or VIGIL_BENCH_SPACING. 5,000 agents started 10 ms apart
// on two cores (a rollout far faster than a DaemonSet's) were still making
// their first checks, before their feed was fresh, when the first had to
// read it: they fell behind, their feeds went stale, and they checked
// everything themselves.
func fleetSpacing(b *testing.B) time.Duration {
	v := os.Getenv("VIGIL_BENCH_SPACING")
	if v == "" {
		return startSpacing
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		b.Fatalf("VIGIL_BENCH_SPACING=%q: want a positive duration", v)
	}
	return d
}

// agentNice is the agent hosts' niceness. In a cluster the control plane
// has machines of its own; here it shares two cores with thousands of
// agents, which at 5,000 took so much of them that the control plane's
// process could no longer accept connections (full listen queues) or
// write its feeds in time, and every agent fell back to checking for
// itself. At the lowest priority the agents get what the control plane
// leaves, as on machines of their own. Their CPU is still measured.
const agentNice = 19

type agentHost struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	addr  string
}

// agentSummary is what an agent host reports of one agent.
type agentSummary struct {
	// Learned: three backends learned in each upstream.
	Learned bool                      `json:"learned"`
	Fresh   bool                      `json:"fresh"`
	API     map[string]backendSummary `json:"api"`
}

type backendSummary struct {
	State string    `json:"state"`
	Since time.Time `json:"since"`
}

type hostReport struct {
	CPU    float64        `json:"cpuSeconds"`
	Agents []agentSummary `json:"agents"`
}

func startAgentHosts(b *testing.B, info cpInfo, n int) []*agentHost {
	var hosts []*agentHost
	for first := 0; first < n; first += perHost {
		count := min(perHost, n-first)
		// Together the hosts start one agent every fleetSpacing: the
		// rollout's pace must not grow with the hosts.
		spacing := fleetSpacing(b) * time.Duration((n+perHost-1)/perHost)
		cfg, _ := json.Marshal(struct {
			CP      cpInfo        `json:"cp"`
			Count   int           `json:"count"`
			Spacing time.Duration `json:"spacing"`
		}{info, count, spacing})
		cmd, stdin, addr := startChild(b, "TestAgentHostHelper", agentNice, []string{agentHostEnv + "=" + string(cfg)}, os.Stderr, "HOST ")
		h := &agentHost{cmd: cmd, stdin: stdin, addr: addr}
		b.Cleanup(func() { h.stdin.Close(); _ = h.cmd.Wait() })
		hosts = append(hosts, h)
	}
	return hosts
}

func (h *agentHost) report(b *testing.B) hostReport {
	resp, err := http.Get("http://" + h.addr)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	var r hostReport
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		b.Fatal(err)
	}
	return r
}

func (h *agentHost) status(b *testing.B) []agentSummary { return h.report(b).Agents }

func hostsCPU(b *testing.B, hosts []*agentHost) float64 {
	var s float64
	for _, h := range hosts {
		s += h.report(b).CPU
	}
	return s
}

// TestAgentHostHelper is a child process of BenchmarkFleet, not a test: it
// runs its share of the agents, started one every Spacing (a rollout, not
// thousands of handshakes at once), and serves their summaries until
// stdin closes.
func TestAgentHostHelper(t *testing.T) {
	env := os.Getenv(agentHostEnv)
	if env == "" {
		t.Skip("the agents of BenchmarkFleet; runs only as its child process")
	}
	var cfg struct {
		CP      cpInfo        `json:"cp"`
		Count   int           `json:"count"`
		Spacing time.Duration `json:"spacing"`
	}
	if err := json.Unmarshal([]byte(env), &cfg); err != nil {
		t.Fatal(err)
	}
	cp := cfg.CP
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	var mu sync.Mutex
	var agents []*agent.Agent
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		_ = http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			mu.Lock()
			as := slices.Clone(agents)
			mu.Unlock()
			r := hostReport{CPU: cpuTime().Seconds()}
			for _, a := range as {
				r.Agents = append(r.Agents, summarize(a))
			}
			_ = json.NewEncoder(w).Encode(r)
		}))
	}()
	fmt.Printf("HOST %s\n", ln.Addr())
	go func() {
		for range cfg.Count {
			a, err := agent.New(agent.Config{
				Server:          "https://" + cp.APIServers[0],
				APIServerListen: "127.0.0.1:0",
				EtcdListen:      "127.0.0.1:0",
				EtcdSeeds:       cp.Etcd,
				BackendPort:     cp.Port,
				APITLS:          &tls.Config{InsecureSkipVerify: true},
				// Goroutines, not event loops: the loops' descriptors
				// would not fit.
				EventLoops: -1,
				FeedPort:   cp.FeedPort,
			}, slog.New(slog.DiscardHandler))
			if err != nil {
				fmt.Fprintln(os.Stderr, "agent host:", err)
				os.Exit(1)
			}
			mu.Lock()
			agents = append(agents, a)
			mu.Unlock()
			wg.Go(func() { _ = a.Run(ctx) })
			select {
			case <-ctx.Done():
				return
			case <-time.After(cfg.Spacing):
			}
		}
	}()
	_, _ = io.Copy(io.Discard, os.Stdin) // until the benchmark closes stdin
}

func summarize(a *agent.Agent) agentSummary {
	st := a.Status()
	s := agentSummary{Learned: true, Fresh: st.Feed != nil && st.Feed.Fresh, API: map[string]backendSummary{}}
	for _, u := range st.Upstreams {
		n := 0
		for _, bk := range u.Backends {
			if bk.Source == "cluster" {
				n++
			}
		}
		s.Learned = s.Learned && n >= 3
		if u.Name != "apiserver" {
			continue
		}
		for _, bk := range u.Backends {
			b := backendSummary{State: bk.State}
			if bk.Since != nil {
				b.Since = *bk.Since
			}
			s.API[bk.Address] = b
		}
	}
	return s
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
