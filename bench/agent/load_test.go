// Package agentbench measures what vigil agents cost the control plane.
//
// BenchmarkControlPlaneLoad runs N real agents (agent.New and Run, each with
// its own etcd client, listeners and health checks, default timings) in one
// process against a real 3-member etcd (embedded) and three stand-in API
// servers, and counts for a fixed window what the control plane receives:
// /readyz requests, etcd /health requests, MemberList RPCs, and the
// connections held open. Run it with bench/agent/run.sh, or:
//
//	go test ./bench/agent -run '^$' -bench ControlPlaneLoad -benchtime 1x
package agentbench

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/vigil-ha/vigil/internal/agent"
	"github.com/vigil-ha/vigil/internal/etcdtest"
	"github.com/vigil-ha/vigil/internal/testaddr"
	"github.com/vigil-ha/vigil/internal/testkit"
)

// window is how long each size is measured, after every agent has
// learned the cluster; startSpacing is the time between two agents' starts.
const (
	window       = 10 * time.Second
	startSpacing = 10 * time.Millisecond
)

func BenchmarkControlPlaneLoad(b *testing.B) {
	for _, n := range benchSizes() {
		b.Run(fmt.Sprintf("agents=%d", n), func(b *testing.B) {
			for range b.N {
				// A fresh control plane for every measurement: the
				// thousands of connections of an earlier run must not
				// linger in this one.
				cp := startControlPlane(b)
				measureLoad(b, cp, n)
				cp.stop()
			}
		})
	}
}

func measureLoad(b *testing.B, cp *controlPlane, n int) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	agents := make([]*agent.Agent, 0, n)
	for range n {
		a, err := agent.New(agent.Config{
			Server:          "https://" + cp.info.APIServers[0],
			APIServerListen: "127.0.0.1:0",
			EtcdListen:      "127.0.0.1:0",
			EtcdSeeds:       cp.info.Etcd,
			BackendPort:     cp.info.Port,
			APITLS:          &tls.Config{InsecureSkipVerify: true},
		}, slog.New(slog.DiscardHandler))
		if err != nil {
			b.Fatal(err)
		}
		agents = append(agents, a)
		wg.Go(func() { _ = a.Run(ctx) })
		// Agents start over a few seconds, as a rollout does: a
		// thousand TLS handshakes at once would measure the start-up
		// storm on two cores, not the steady load.
		time.Sleep(startSpacing)
	}
	defer func() { cancel(); wg.Wait() }()
	// Wait until every agent has learned the cluster and checked it.
	testkit.WaitNilEvery(b, 3*time.Minute, 50*time.Millisecond, "every agent to learn the cluster", func() error {
		for _, a := range agents {
			if !learned(a) {
				st := a.Status()
				return fmt.Errorf("one says: last member list %v, error %q, upstreams %+v", st.LastMemberList, st.MemberListErr, st.Upstreams)
			}
		}
		return nil
	})
	time.Sleep(2 * time.Second) // steady state

	measureWindow(b, cp, n, func() float64 { return cpuTime().Seconds() })
	b.ReportMetric(upShare(agents), "backends-up-share")
	b.ReportMetric(0, "ns/op")
}

// measureWindow counts what the control plane receives during window and
// reports it per second, with the agents' CPU (agentCPU: their processes'
// seconds so far) per agent. It returns the counts at the window's end.
func measureWindow(b *testing.B, cp *controlPlane, n int, agentCPU func() float64) counts {
	before := cp.snapshot(b)
	cpu0 := agentCPU()
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
	b.ReportMetric((agentCPU()-cpu0)/sec/float64(n)*1000, "agent-millicores")
	return after
}

// learned: both upstreams have three backends learned from the cluster.
func learned(a *agent.Agent) bool {
	for _, u := range a.Status().Upstreams {
		n := 0
		for _, bk := range u.Backends {
			if bk.Source == "cluster" {
				n++
			}
		}
		if n < 3 {
			return false
		}
	}
	return true
}

// upShare is the share of learned backends, over all agents, that are up.
func upShare(agents []*agent.Agent) float64 {
	var up, all int
	for _, a := range agents {
		for _, u := range a.Status().Upstreams {
			for _, bk := range u.Backends {
				if bk.Source == "cluster" {
					all++
					if bk.State == "up" {
						up++
					}
				}
			}
		}
	}
	return float64(up) / float64(max(all, 1))
}

// The control plane runs in a child process (this test binary again, as
// TestControlPlaneHelper): a thousand agents and their control plane would
// not fit one process's file descriptor limit, and a separate process lets
// its CPU time be read apart from the agents'.
const (
	helperEnv     = "VIGIL_BENCH_CONTROL_PLANE"
	helperFeedEnv = "VIGIL_BENCH_FEEDS"
)

type controlPlane struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	once  sync.Once
	info  cpInfo
}

// stop ends the helper (it exits when its stdin closes); safe to call twice.
func (cp *controlPlane) stop() {
	cp.once.Do(func() { cp.stdin.Close(); _ = cp.cmd.Wait() })
}

type cpInfo struct {
	Etcd       []string `json:"etcd"`
	APIServers []string `json:"apiServers"`
	Port       int      `json:"port"`
	Counters   string   `json:"counters"`
	// FeedPort is the agent feed's port on every API server's host; 0
	// without feeds.
	FeedPort int `json:"feedPort"`
}

type counts struct {
	Readyz     int64   `json:"readyz"`
	Conns      int64   `json:"conns"`
	EtcdHealth float64 `json:"etcdHealth"`
	MemberList float64 `json:"memberList"`
	CPU        float64 `json:"cpuSeconds"`
	// Followers are the agents reading each node's feed.
	Followers []int `json:"followers,omitempty"`
}

// startControlPlane starts the helper; with feeds, each API server's host
// also serves an agent feed (fleet_test.go).
func startControlPlane(b *testing.B, feeds ...bool) *controlPlane {
	env := []string{helperEnv + "=1"}
	if len(feeds) > 0 && feeds[0] {
		env = append(env, helperFeedEnv+"=1")
	}
	cmd, stdin, ready := startChild(b, "TestControlPlaneHelper", 0, env, io.Discard, "READY ")
	cp := &controlPlane{cmd: cmd, stdin: stdin}
	b.Cleanup(cp.stop)
	if err := json.Unmarshal([]byte(ready), &cp.info); err != nil {
		b.Fatal(err)
	}
	return cp
}

// startChild runs this test binary again as the helper test, with env
// added, and returns once the child printed a line starting with prefix
// (the rest of that line is returned). The child ends when stdin closes;
// the caller closes it and waits. A niceness above 0 runs it (all its
// threads) at that lower priority.
func startChild(b *testing.B, test string, niceness int, env []string, stderr io.Writer, prefix string) (*exec.Cmd, io.WriteCloser, string) {
	args := []string{os.Args[0], "-test.run", "^" + test + "$", "-test.timeout", "0"}
	if niceness > 0 {
		args = append([]string{"nice", "-n", strconv.Itoa(niceness)}, args...)
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), prefix); ok {
			go func() { _, _ = io.Copy(io.Discard, out) }()
			return cmd, stdin, rest
		}
	}
	stdin.Close()
	_ = cmd.Wait()
	b.Fatalf("%s ended before it was ready: %v", test, sc.Err())
	return nil, nil, ""
}

func (cp *controlPlane) snapshot(b *testing.B) counts {
	var c counts
	resp, err := http.Get("http://" + cp.info.Counters)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&c); err != nil {
		b.Fatal(err)
	}
	return c
}

// TestControlPlaneHelper is the child process of BenchmarkControlPlaneLoad,
// not a test: a real 3-member etcd and three stand-in API servers that count
// what they receive, served until stdin closes.
func TestControlPlaneHelper(t *testing.T) {
	if os.Getenv(helperEnv) != "1" {
		t.Skip("the control plane of BenchmarkControlPlaneLoad; runs only as its child process")
	}
	raiseFileLimit()
	c := etcdtest.StartDistinct(t, 3)
	port := testaddr.Port(t)
	var readyz, open atomic.Int64
	info := cpInfo{Etcd: c.Endpoints, Port: port}
	var servers []*httptest.Server
	startAPI := func(i int) string {
		addr := fmt.Sprintf("%s:%d", testaddr.Host(t, i), port)
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/readyz" {
				readyz.Add(1)
			}
			_, _ = io.WriteString(w, "ok")
		}))
		srv.Listener.Close()
		srv.Listener = ln
		srv.Config.ErrorLog = log.New(io.Discard, "", 0)
		srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
			switch s {
			case http.StateNew:
				open.Add(1)
			case http.StateClosed, http.StateHijacked:
				open.Add(-1)
			}
		}
		srv.StartTLS()
		servers = append(servers, srv)
		return addr
	}
	for i := range 3 {
		info.APIServers = append(info.APIServers, startAPI(i))
	}
	defer func() {
		for _, srv := range servers {
			srv.Close()
		}
	}()
	var fleet *feeds
	if os.Getenv(helperFeedEnv) == "1" {
		fleet = startFeeds(t, &info)
		defer fleet.close()
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	info.Counters = ln.Addr().String()
	var mu sync.Mutex // orders kill and add
	go func() {
		_ = http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			defer mu.Unlock()
			switch r.URL.Path {
			case "/kill": // the first API server's process dies: refused from now on
				servers[0].CloseClientConnections()
				servers[0].Close()
				return
			case "/add": // a fourth API server joins, and the feeds' nodes learn of it
				addr := startAPI(3)
				if fleet != nil {
					fleet.set(append(slices.Clone(info.APIServers), addr))
				}
				_, _ = io.WriteString(w, addr)
				return
			}
			c := counts{Readyz: readyz.Load(), Conns: open.Load(), CPU: cpuTime().Seconds()}
			if fleet != nil {
				c.Followers = fleet.followers()
			}
			mfs, err := prometheus.DefaultGatherer.Gather()
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			for _, mf := range mfs {
				switch mf.GetName() {
				case "etcd_server_health_success", "etcd_server_health_failures":
					c.EtcdHealth += sum(mf, nil)
				case "grpc_server_handled_total":
					c.MemberList += sum(mf, func(m *dto.Metric) bool { return label(m, "grpc_method") == "MemberList" })
				}
			}
			_ = json.NewEncoder(w).Encode(c)
		}))
	}()
	defer ln.Close()
	j, _ := json.Marshal(info)
	fmt.Printf("READY %s\n", j)
	_, _ = io.Copy(io.Discard, os.Stdin) // until the benchmark closes stdin
}

func sum(mf *dto.MetricFamily, keep func(*dto.Metric) bool) float64 {
	var s float64
	for _, m := range mf.GetMetric() {
		if keep == nil || keep(m) {
			s += m.GetCounter().GetValue()
		}
	}
	return s
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if strings.EqualFold(l.GetName(), name) {
			return l.GetValue()
		}
	}
	return ""
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchSizes are the agent counts measured; VIGIL_BENCH_AGENTS=N,M
// overrides them.
func benchSizes() []int {
	out := []int{10, 100, 1000}
	if s := os.Getenv("VIGIL_BENCH_AGENTS"); s != "" {
		out = nil
		for _, f := range strings.Split(s, ",") {
			var n int
			if _, err := fmt.Sscan(f, &n); err == nil && n > 0 {
				out = append(out, n)
			}
		}
	}
	return out
}
