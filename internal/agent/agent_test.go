package agent

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
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
	"github.com/vigil-ha/vigil/internal/validate"
)

func TestMain(m *testing.M) { etcdtest.Main(m, etcdtest.LeakOptions()...) }

// standIn is an HTTPS server answering /readyz with 200 and every other path
// with its name, on a given address, like a kube-apiserver on a node.
type standIn struct {
	name string
	srv  *httptest.Server
	once sync.Once
	// checks counts the /readyz requests.
	checks atomic.Int64
}

func newStandIn(t *testing.T, addr string) *standIn {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	s := &standIn{name: addr}
	s.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/readyz" {
			s.checks.Add(1)
			_, _ = io.WriteString(w, "ok")
			return
		}
		_, _ = io.WriteString(w, s.name)
	}))
	s.srv.Listener.Close()
	s.srv.Listener = ln
	s.srv.Config.ErrorLog = log.New(io.Discard, "", 0) // handshakes cut short by kills and checks
	s.srv.StartTLS()
	t.Cleanup(s.kill)
	return s
}

// kill stops the server and resets its connections, as a killed process.
func (s *standIn) kill() {
	s.once.Do(func() {
		s.srv.CloseClientConnections()
		s.srv.Close()
	})
}

// client asks through the agent, one new connection per request, so each
// request shows which backend the agent chose.
func client() *http.Client {
	return &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, DisableKeepAlives: true,
	}}
}

func ask(c *http.Client, addr string) (string, error) {
	resp, err := c.Get("https://" + addr + "/who")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// deadAddr is a loopback address where nothing listens.
func deadAddr(t *testing.T) string {
	return fmt.Sprintf("%s:%d", testaddr.Loopback(t), testaddr.Port(t))
}

// startAgent runs an agent with fast test timings until the test ends.
func startAgent(t *testing.T, cfg Config) *Agent {
	t.Helper()
	if cfg.APIServerListen == "" {
		cfg.APIServerListen = "127.0.0.1:0"
	}
	cfg.APITLS = &tls.Config{InsecureSkipVerify: true}
	cfg.HealthInterval, cfg.HealthTimeout = 100*time.Millisecond, 300*time.Millisecond
	if cfg.DiscoveryInterval == 0 {
		cfg.DiscoveryInterval = 200 * time.Millisecond
	}
	a, err := New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return a
}

// upBackends are the backends of upstream that the agent has up, by source.
func upBackends(a *Agent, upstream, source string) []string {
	return backendsIn(a, upstream, source, "up")
}

// backendsIn lists the backends of upstream from source in state ("" for
// any).
func backendsIn(a *Agent, upstream, source, state string) []string {
	var out []string
	for _, u := range a.Status().Upstreams {
		if u.Name != upstream {
			continue
		}
		for _, b := range u.Backends {
			if (state == "" || b.State == state) && b.Source == source {
				out = append(out, b.Address)
			}
		}
	}
	slices.Sort(out)
	return out
}

// TestFollowsMembershipAndFailsOver runs the agent against a real etcd
// cluster, each member on its own loopback address with an API server beside
// it, and changes the membership under it: backends come and go with the
// members, a killed API server is skipped at once, and an etcd watch through
// the agent sees every write across all of it.
func TestFollowsMembershipAndFailsOver(t *testing.T) {
	c := etcdtest.StartDistinct(t, 3)
	port := testaddr.Port(t) // free on every address of the binary's own range
	api := func(i int) string { return fmt.Sprintf("%s:%d", testaddr.Host(t, i), port) }
	stand := map[int]*standIn{}
	for i := range 3 {
		stand[i] = newStandIn(t, api(i))
	}
	cache := t.TempDir()
	a := startAgent(t, Config{
		Server:      "https://" + deadAddr(t), // the VIP, down: discovery must not need it
		BackendPort: port,
		EtcdListen:  "127.0.0.1:0",
		EtcdSeeds:   c.Endpoints[:1],
		CacheDir:    cache,
	})
	testkit.WaitFor(t, 10*time.Second, "three API servers learned and up", func() bool {
		return slices.Equal(upBackends(a, "apiserver", "cluster"), []string{api(0), api(1), api(2)})
	})
	hc := client()
	seen := map[string]bool{}
	for range 12 {
		who, err := ask(hc, a.APIServerAddr().String())
		if err != nil {
			t.Fatal(err)
		}
		seen[who] = true
	}
	if len(seen) != 3 {
		t.Errorf("requests reached %v; want all three API servers (one latency tier on loopback)", seen)
	}

	// A watch through the agent's etcd endpoint, writes through a direct
	// client: every write must arrive, whatever happens to the members.
	via, err := clientv3.New(clientv3.Config{Endpoints: []string{"http://" + a.EtcdAddr().String()}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer via.Close()
	direct, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if _, err := via.Put(ctx, "/flannel/lease", "1"); err != nil {
		t.Fatalf("put through the agent: %v", err)
	}
	wch := via.Watch(clientv3.WithRequireLeader(ctx), "/counter/", clientv3.WithPrefix())
	got := make(chan string, 1000)
	go func() {
		for r := range wch {
			for _, ev := range r.Events {
				got <- string(ev.Kv.Key)
			}
		}
		close(got)
	}()
	// Each write is bounded and made only if the key is new: a retry after
	// a lost answer must not write the key twice (the watch counts events).
	written := 0
	write := func() {
		t.Helper()
		key := fmt.Sprintf("/counter/%04d", written)
		etcdtest.Retry(t, 20*time.Second, "put", func() error {
			pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			_, err := direct.Txn(pctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).Then(clientv3.OpPut(key, "x")).Commit()
			return err
		})
		written++
	}
	write()

	// A fourth member joins: its API server becomes a backend once the
	// member has started (announced members have no client URL yet).
	peer, clientURL := c.NewMemberURLs()
	var added *clientv3.MemberAddResponse
	etcdtest.Retry(t, 20*time.Second, "member add", func() error { added, err = direct.MemberAdd(ctx, []string{peer}); return err })
	var initial []string
	for _, m := range added.Members {
		name := m.Name
		if m.ID == added.Member.ID {
			name = "m4"
		}
		initial = append(initial, name+"="+m.PeerURLs[0])
	}
	stand[3] = newStandIn(t, api(3))
	c.Add("m4", peer, clientURL, strings.Join(initial, ","))
	testkit.WaitFor(t, 10*time.Second, "the new member's API server", func() bool {
		return slices.Contains(upBackends(a, "apiserver", "cluster"), api(3))
	})
	write()

	// Remove every original member but one, one at a time, each followed
	// by its API server: the agent drops each backend and closes its
	// connections, and the watch moves on to a member that is still there.
	for _, i := range []int{0, 1} {
		c.Remove(i, 30*time.Second)
		stand[i].kill()
		testkit.WaitFor(t, 10*time.Second, fmt.Sprintf("backend %s gone", api(i)), func() bool {
			return !slices.Contains(backendsIn(a, "apiserver", "cluster", ""), api(i))
		})
		write()
	}
	want := []string{api(2), api(3)}
	if got := upBackends(a, "apiserver", "cluster"); !slices.Equal(got, want) {
		t.Fatalf("API server backends %v, want %v", got, want)
	}
	if got := backendsIn(a, "etcd", "cluster", ""); len(got) != 2 {
		t.Fatalf("etcd backends %v, want the two remaining members; status %+v", got, a.Status())
	}

	// An API server killed outright: the next requests go elsewhere at
	// once (a refused connection is retried on another backend).
	stand[2].kill()
	for range 5 {
		who, err := ask(hc, a.APIServerAddr().String())
		if err != nil {
			t.Fatalf("request right after a backend died: %v", err)
		}
		if who != api(3) {
			t.Fatalf("answered by %s, want %s", who, api(3))
		}
	}

	// The watch saw every write, in order.
	for i := range written {
		select {
		case k := <-got:
			if want := fmt.Sprintf("/counter/%04d", i); k != want {
				t.Fatalf("watch event %d: %s, want %s", i, k, want)
			}
		case <-time.After(15 * time.Second):
			t.Fatalf("watch through the agent missed /counter/%04d", i)
		}
	}

	// The cache holds the current cluster.
	b, err := os.ReadFile(filepath.Join(cache, cacheName))
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range want {
		if !strings.Contains(string(b), w) {
			t.Errorf("cache lacks %s:\n%s", w, b)
		}
	}
}

// TestRestartsFromCacheWhileSeedsAreDown: an agent that learned the
// cluster once starts again with every seed unreachable (the VIP down, the
// seed etcd endpoints gone) and serves at once from its cache, and keeps
// following the member list through the cached client URLs.
func TestRestartsFromCacheWhileSeedsAreDown(t *testing.T) {
	c := etcdtest.StartDistinct(t, 3)
	port := testaddr.Port(t) // free on every address of the binary's own range
	var apis []string
	for i := range 3 {
		apis = append(apis, fmt.Sprintf("%s:%d", testaddr.Host(t, i), port))
		newStandIn(t, apis[i])
	}
	cache := t.TempDir()
	cfg := Config{Server: "https://" + deadAddr(t), BackendPort: port, EtcdListen: "127.0.0.1:0", EtcdSeeds: c.Endpoints, CacheDir: cache}

	first, err := New(withTestTimings(cfg), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- first.Run(ctx) }()
	testkit.WaitFor(t, 10*time.Second, "the first agent learned the cluster", func() bool {
		return len(upBackends(first, "apiserver", "cluster")) == 3
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	cfg.EtcdSeeds = []string{"http://" + deadAddr(t)}
	start := time.Now()
	a := startAgent(t, cfg)
	who, err := ask(client(), a.APIServerAddr().String())
	if err != nil {
		t.Fatalf("first request after the restart: %v", err)
	}
	if !slices.Contains(apis, who) {
		t.Fatalf("answered by %q", who)
	}
	t.Logf("first request answered by %s %v after the restart", who, time.Since(start).Round(time.Millisecond))
	via, err := clientv3.New(clientv3.Config{Endpoints: []string{"http://" + a.EtcdAddr().String()}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer via.Close()
	pctx, pcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer pcancel()
	if _, err := via.Put(pctx, "k", "v"); err != nil {
		t.Fatalf("etcd through the restarted agent: %v", err)
	}
	testkit.WaitFor(t, 10*time.Second, "a member list read through the cached client URLs", func() bool {
		st := a.Status()
		return st.LastMemberList != nil && st.LastMemberList.After(start)
	})
}

func withTestTimings(cfg Config) Config {
	cfg.APIServerListen = "127.0.0.1:0"
	cfg.APITLS = &tls.Config{InsecureSkipVerify: true}
	cfg.HealthInterval, cfg.HealthTimeout = 100*time.Millisecond, 300*time.Millisecond
	cfg.DiscoveryInterval = 200 * time.Millisecond
	return cfg
}

// TestChurnLeaksNothing changes the backend set 1,000 times while clients
// keep connecting: the listener keeps serving, and when the churn stops the
// agent holds no more goroutines or file descriptors than the backends it
// has then need; once stopped, none at all (goleak in TestMain).
func TestChurnLeaksNothing(t *testing.T) {
	var backs []string
	for range 5 {
		s := newStandIn(t, "127.0.0.1:0")
		backs = append(backs, s.srv.Listener.Addr().String())
	}
	dead := []string{deadAddr(t), deadAddr(t)}
	before := openFDs(t)
	goBefore := runtime.NumGoroutine()

	a := startAgent(t, Config{Server: "https://" + backs[0]})
	addr := a.APIServerAddr().String()
	testkit.WaitFor(t, 5*time.Second, "the seed up", func() bool { return len(upBackends(a, "apiserver", "seed")) == 1 })

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var mu sync.Mutex
	var ok, failed int
	for range 4 {
		wg.Go(func() {
			hc := client()
			for ctx.Err() == nil {
				_, err := ask(hc, addr)
				mu.Lock()
				if err == nil {
					ok++
				} else {
					failed++
				}
				mu.Unlock()
			}
		})
	}
	// Every set holds one live backend at least; some hold dead ones.
	for i := range 1000 {
		set := []string{backs[i%5]}
		if i%3 == 0 {
			set = append(set, backs[(i+2)%5])
		}
		if i%7 == 0 {
			set = append(set, dead[i%2])
		}
		slices.Sort(set)
		a.learnAPIServers(set)
		time.Sleep(2 * time.Millisecond)
	}
	a.learnAPIServers(backs[1:3])
	mu.Lock()
	settled := ok
	mu.Unlock()
	testkit.WaitFor(t, 10*time.Second, "requests answered by the last set", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return ok >= settled+20
	})
	cancel()
	wg.Wait()
	t.Logf("requests during churn: %d answered, %d failed (connections to removed backends are closed)", ok, failed)
	if ok == 0 {
		t.Fatal("no request was answered during the churn")
	}
	if _, err := ask(client(), addr); err != nil {
		t.Fatalf("listener after the churn: %v", err)
	}
	if st := a.Status(); len(st.Upstreams[0].Backends) != 3 { // two learned, one seed
		t.Fatalf("backends after the churn: %+v", st.Upstreams[0].Backends)
	}
	// Settled: checks of three backends over kept-alive connections, the
	// listener, a few idle client connections. Not 1,000 of anything.
	testkit.WaitFor(t, 5*time.Second, "goroutines to settle", func() bool { return runtime.NumGoroutine() < goBefore+60 })
	if fds := openFDs(t); fds > before+40 {
		t.Fatalf("%d file descriptors open after the churn, %d before", fds, before)
	}
}

func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd")
	}
	return len(ents)
}

func TestConfigErrors(t *testing.T) {
	ok := Config{Server: "https://10.0.0.100:6443", APIServerListen: "127.0.0.1:0"}
	cases := []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"no server", func(c *Config) { c.Server = "" }, "`server` is required"},
		{"http server", func(c *Config) { c.Server = "http://10.0.0.100:6443" }, "must be an https URL"},
		{"server with path", func(c *Config) { c.Server = "https://10.0.0.100:6443/api" }, "must be an https URL"},
		{"bad listen", func(c *Config) { c.APIServerListen = "6443" }, "`apiserverListen`"},
		{"etcd listen without seeds", func(c *Config) { c.EtcdListen = "127.0.0.1:0" }, "needs `etcdEndpoints`"},
		{"bad etcd seed", func(c *Config) { c.EtcdSeeds = []string{"10.0.0.11:2379"} }, "must look like https://HOST:PORT"},
		{"mixed etcd schemes", func(c *Config) { c.EtcdSeeds = []string{"http://a:1", "https://b:1"} }, "mix http and https"},
		{"bad backend port", func(c *Config) { c.BackendPort = 70000 }, "`backendPort`"},
		{"bad health path", func(c *Config) { c.HealthPath = "readyz" }, "`healthPath`"},
		{"tiny discovery interval", func(c *Config) { c.DiscoveryInterval = time.Millisecond }, "`discoveryInterval`"},
		{"bad metrics address", func(c *Config) { c.MetricsAddress = "9559" }, "`metricsAddress`"},
		{"pprof without a metrics address", func(c *Config) { c.Pprof, c.MetricsAddress = true, "" }, "`pprof` serves on `metricsAddress`"},
		{"unwritable cache dir", func(c *Config) { c.CacheDir = "/proc/vigil-agent" }, "`cacheDir`"},
		{"per-source above total", func(c *Config) { c.MaxConns, c.MaxConnsPerSource = 10, 20 }, "`lbMaxConnsPerSource` 20 is above `lbMaxConns` 10"},
		{"negative idle timeout", func(c *Config) { c.IdleTimeout = -time.Second }, "`lbIdleTimeout`"},
		{"too many event loops", func(c *Config) { c.EventLoops = 65 }, "`lbEventLoops` 65"},
		{"feed port out of range", func(c *Config) { c.FeedPort = 70000 }, "`feedPort` 70000"},
		{"negative feed port", func(c *Config) { c.FeedPort = -1 }, "`feedPort` -1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := ok
			tc.edit(&cfg)
			_, err := New(cfg, slog.New(slog.DiscardHandler))
			if !errors.Is(err, validate.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want validate.ErrInvalid mentioning %q", err, tc.want)
			}
		})
	}
}

// TestPortConflictLeavesNothingOpen: when the etcd endpoint cannot listen,
// the API server endpoint opened before it is closed again.
func TestPortConflictLeavesNothingOpen(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	api := deadAddr(t)
	_, err = New(Config{Server: "https://10.0.0.100:6443", APIServerListen: api, EtcdListen: taken.Addr().String(),
		EtcdSeeds: []string{"http://10.0.0.11:2379"}}, slog.New(slog.DiscardHandler))
	if !errors.Is(err, validate.ErrInvalid) || !strings.Contains(err.Error(), "port is taken") {
		t.Fatalf("err = %v, want a port conflict", err)
	}
	ln, err := net.Listen("tcp", api)
	if err != nil {
		t.Fatalf("the API server endpoint was left open: %v", err)
	}
	ln.Close()
}

// TestPrefersLocalThenSeed: a backend on this host takes every new
// connection while it is up; the others take over when it dies; the seed
// is used only when no learned backend is usable.
func TestPrefersLocalThenSeed(t *testing.T) {
	port := testaddr.Port(t) // free on every address of the binary's own range
	local, remote := fmt.Sprintf("%s:%d", testaddr.Host(t, 1), port), fmt.Sprintf("%s:%d", testaddr.Host(t, 0), port)
	sl, sr := newStandIn(t, local), newStandIn(t, remote)
	seed := newStandIn(t, "127.0.0.1:0")
	a := startAgent(t, Config{
		Server:     "https://" + seed.srv.Listener.Addr().String(),
		LocalAddrs: func() ([]net.IP, error) { return []net.IP{net.ParseIP(testaddr.Host(t, 1))}, nil },
	})
	a.learnAPIServers([]string{local, remote})
	testkit.WaitFor(t, 5*time.Second, "both learned backends up and ranked", func() bool {
		a.rank()
		return len(upBackends(a, "apiserver", "cluster")) == 2
	})
	a.rank()
	hc := client()
	expect := func(want string) {
		t.Helper()
		for range 6 {
			who, err := ask(hc, a.APIServerAddr().String())
			if err != nil {
				t.Fatal(err)
			}
			if who != want {
				t.Fatalf("answered by %s, want %s", who, want)
			}
		}
	}
	expect(local)
	sl.kill()
	expect(remote)
	sr.kill()
	expect(seed.name)
}

// /readyz over the agent's own server: not ready while its only API server
// fails its checks, ready once one passes; /livez and vigil_build_info
// answer throughout.
func TestReadyz(t *testing.T) {
	addr := fmt.Sprintf("%s:%d", testaddr.Loopback(t), testaddr.Port(t))
	metrics := fmt.Sprintf("%s:%d", testaddr.Loopback(t), testaddr.Port(t))
	a := startAgent(t, Config{Server: "https://" + addr, MetricsAddress: metrics})
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + metrics + path)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	testkit.WaitFor(t, 5*time.Second, "the metrics server", func() bool { c, _ := get("/livez"); return c == 200 })
	var code int
	var body string
	testkit.WaitFor(t, 5*time.Second, "/readyz to say why it is not ready", func() bool {
		code, body = get("/readyz")
		return strings.Contains(body, "no apiserver backend passes its health checks")
	})
	if code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz with the API server down = %d %q", code, body)
	}
	if err := a.Ready(time.Now()); err == nil {
		t.Fatal("Ready with the API server down = nil")
	}
	newStandIn(t, addr)
	testkit.WaitFor(t, 5*time.Second, "/readyz 200 with the API server up", func() bool { c, _ := get("/readyz"); return c == 200 })
	if _, body := get("/metrics"); !strings.Contains(body, `vigil_build_info{goversion="`) {
		t.Fatal("/metrics lacks vigil_build_info")
	}
}
