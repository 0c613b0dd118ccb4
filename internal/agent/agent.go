// Package agent is vigil's worker agent: local TCP endpoints for the API
// server (and optionally etcd) that forward to whichever control-plane
// backends are healthy now, so that nothing on a worker is configured with
// the control plane's membership, and nothing restarts when it changes.
//
// Backends come from the cluster, not from flags:
//
//   - the etcd member list, read through the agent's own etcd client every
//     DiscoveryInterval: each voting member's client URL is an etcd
//     backend, and its host with BackendPort an API server backend (on a
//     kubeadm control plane every member runs beside a kube-apiserver);
//   - with Kube, the API servers published in the kubernetes Service's
//     EndpointSlices, through a watch (kubelite.APIServers); the API server
//     backends are the union of both sources;
//   - the seeds (--server, --etcd-endpoints): the last resort, used only
//     when no learned backend is usable;
//   - the cache (CacheDir): the last learned lists, loaded at start, so a
//     restarted agent serves at once even while the seeds are down.
//
// Each backend is health-checked (GET /readyz on API servers, GET
// /health?serializable=true on etcd members, over kept-alive connections);
// a refused connection takes a backend out at once. New connections go to
// the nearest usable backend tier (see tiers), least connections within it.
// Connections to a backend that dies or leaves the cluster are closed, so
// their clients reconnect through the agent to one that is still there.
package agent

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/vigil-ha/vigil/internal/discovery"
	"github.com/vigil-ha/vigil/internal/feed"
	"github.com/vigil-ha/vigil/internal/health"
	"github.com/vigil-ha/vigil/internal/kubelite"
	"github.com/vigil-ha/vigil/internal/lb"
	"github.com/vigil-ha/vigil/internal/observe"
	"github.com/vigil-ha/vigil/internal/validate"
)

// validate.ErrInvalid wraps every configuration error.

// Defaults. Health checks reuse one connection per backend, so a check costs
// a control-plane node one small request: with 1 s intervals, N agents cost
// each API server N requests per second (see bench/agent). A silent backend
// is out within Interval+Timeout = 2 s; a refusing one at once.
const (
	DefaultAPIServerListen   = "127.0.0.1:6443"
	DefaultCacheDir          = "/var/lib/vigil-agent"
	DefaultDiscoveryInterval = 5 * time.Second
	DefaultHealthInterval    = time.Second
	DefaultHealthTimeout     = time.Second
	DefaultHealthRise        = 2
	DefaultHealthFall        = 1
	DefaultMetricsAddress    = "127.0.0.1:9559"
	// EtcdHealthPath is checked on etcd members: it answers 200 when the
	// member has a leader and no alarm, from the member's own state.
	EtcdHealthPath = "/health?serializable=true"
)

// Config configures an Agent.
type Config struct {
	// Server is the seed API server URL, https://VIP:6443.
	Server string
	// APIServerListen is the local API server endpoint.
	APIServerListen string
	// BackendPort is the API servers' port on control-plane nodes; 0 takes
	// Server's port.
	BackendPort int
	// EtcdListen is the local etcd endpoint; empty for none.
	EtcdListen string
	// EtcdSeeds are etcd client URLs to read the member list from first.
	EtcdSeeds []string
	// EtcdTLS is the etcd client TLS (CA and client certificate); nil for
	// plain http.
	EtcdTLS *tls.Config
	// APITLS verifies API server certificates in health checks.
	APITLS *tls.Config
	// HealthPath is checked on API servers (default /readyz).
	HealthPath string
	// Health intervals, timeouts and counts; zero fields take the agent
	// defaults above, which differ from vigil run's.
	HealthInterval time.Duration
	HealthTimeout  time.Duration
	HealthRise     int
	HealthFall     int
	// CacheDir holds the learned backends; empty disables the cache.
	CacheDir          string
	DiscoveryInterval time.Duration
	DrainTimeout      time.Duration
	// MaxConns, MaxConnsPerSource and IdleTimeout bound each upstream's
	// load balancer (lb.Config).
	MaxConns          int
	MaxConnsPerSource int
	IdleTimeout       time.Duration
	// EventLoops is lb.Config.Loops for each upstream.
	EventLoops int
	// MetricsAddress serves /metrics, /healthz and /status; empty for none.
	MetricsAddress string
	// Pprof adds /debug/pprof/ there.
	Pprof bool
	// LocalAddrs lists this host's addresses (nil: the interfaces'); a
	// backend on one of them is preferred.
	LocalAddrs func() ([]net.IP, error)
	// Kube, when set, is used to follow the API servers published in the
	// kubernetes Service's EndpointSlices. It may talk to the API server
	// through the agent's own listener (see cmd/vigil agent --in-cluster).
	Kube *kubelite.Client
	// FeedPort is the port of the control plane's agent feed (fed.go); 0
	// reads no feed.
	FeedPort int
	// feedFirstCheck replaces FeedFirstCheck (tests).
	feedFirstCheck time.Duration
}

// upstream is one forwarded service: the API server or etcd.
type upstream struct {
	name    string // "apiserver" or "etcd"
	bal     *lb.Balancer
	picker  *tieredPicker
	checker *health.Checker
	seeds   []string // host:port
	fed     fedState // what the agent feed says of the backends
	// feedFirst spreads the first checks of backends the feed announced.
	feedFirst time.Duration

	mu      sync.Mutex
	learned []string // host:port, from the cluster or the cache
	// leftSeeds are seeds that were learned and left the cluster: they
	// stay backends (seeds always are), but their connections go.
	leftSeeds []string
}

// backends is learned ∪ seeds, sorted.
func (u *upstream) backends() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	out := slices.Concat(u.learned, u.seeds)
	slices.Sort(out)
	return slices.Compact(out)
}

func (u *upstream) setLearned(b []string) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	if slices.Equal(u.learned, b) {
		return false
	}
	for _, old := range u.learned {
		if !slices.Contains(b, old) && slices.Contains(u.seeds, old) {
			u.leftSeeds = append(u.leftSeeds, old)
		}
	}
	u.learned = slices.Clone(b)
	return true
}

func (u *upstream) isLearned(addr string) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.Contains(u.learned, addr)
}

// apply pushes the backend set to the checker and the balancer. A seed
// address whose member left the cluster keeps its place as a last resort,
// but its connections are closed like those of any removed backend: a
// member removed from etcd may keep its port open without serving.
func (u *upstream) apply() {
	b := u.backends()
	u.bal.SetBackends(b)
	u.checker.Set(b)
	u.mu.Lock()
	left := u.leftSeeds
	u.leftSeeds = nil
	u.mu.Unlock()
	for _, a := range left {
		u.bal.CloseConnections(a, "left the cluster")
	}
}

// Agent runs the local endpoints.
type Agent struct {
	cfg       Config
	log       *slog.Logger
	api       *upstream
	etcd      *upstream // nil without EtcdListen
	metricsLn net.Listener
	reg       *prometheus.Registry
	m         *agentMetrics
	disc      *discovery.Discovery // nil without a source; set under mu by Run
	members   *memberSource        // nil without etcd seeds; set under mu by Run
	follower  *feed.Follower       // nil with FeedPort 0
	startedAt time.Time

	mu       sync.Mutex // guards disc and members (written by Run), etcdURLs
	etcdURLs []string   // learned etcd client URLs, for the member list client
}

// New validates cfg and opens every listener, so that a port conflict or a
// bad flag fails at start and nothing is left half-open.
func New(cfg Config, log *slog.Logger) (a *Agent, err error) {
	if err := cfg.withDefaults(); err != nil {
		return nil, err
	}
	if err := ensureCacheDir(cfg.CacheDir); err != nil {
		return nil, err
	}
	a = &Agent{cfg: cfg, log: log, reg: prometheus.NewRegistry(), startedAt: time.Now()}
	a.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	observe.RegisterBuildInfo(a.reg)
	a.m = newAgentMetrics(a.reg)
	var opened []func()
	defer func() {
		if err != nil {
			for _, c := range opened {
				c()
			}
		}
	}()
	server, _ := url.Parse(cfg.Server) // validated
	a.api, err = a.newUpstream("apiserver", cfg.APIServerListen, []string{server.Host}, health.Config{
		Path: cfg.HealthPath, TLS: cfg.APITLS,
	})
	if err != nil {
		return nil, err
	}
	opened = append(opened, a.api.close)
	if len(cfg.EtcdSeeds) > 0 {
		seeds, scheme, _ := parseEtcdURLs(cfg.EtcdSeeds) // validated
		if cfg.EtcdListen != "" {
			a.etcd, err = a.newUpstream("etcd", cfg.EtcdListen, seeds, health.Config{
				Path: EtcdHealthPath, TLS: cfg.EtcdTLS, Scheme: scheme,
			})
			if err != nil {
				return nil, err
			}
			opened = append(opened, a.etcd.close)
		}
	}
	if cfg.MetricsAddress != "" {
		if a.metricsLn, err = observe.Listen(cfg.MetricsAddress, "`metricsAddress`"); err != nil {
			return nil, validate.Invalid(err)
		}
	}
	a.loadCache()
	a.follower = a.newFollower()
	return a, nil
}

func (a *Agent) newUpstream(name, listen string, seeds []string, hc health.Config) (*upstream, error) {
	u := &upstream{name: name, seeds: seeds, picker: &tieredPicker{}, feedFirst: a.cfg.feedFirstCheck}
	reg := prometheus.WrapRegistererWith(prometheus.Labels{"upstream": name}, a.reg)
	var err error
	u.bal, err = lb.New(lb.Config{
		Listen:            listen,
		Picker:            u.picker,
		ReusePort:         true,
		DrainTimeout:      a.cfg.DrainTimeout,
		MaxConns:          a.cfg.MaxConns,
		MaxConnsPerSource: a.cfg.MaxConnsPerSource,
		IdleTimeout:       a.cfg.IdleTimeout,
		Loops:             a.cfg.EventLoops,
		OnDialError:       func(b string, err error) { u.checker.DialFailed(b, err) },
		Metrics:           reg,
	}, a.log.With("upstream", name))
	if err != nil {
		if errors.Is(err, lb.ErrPortInUse) {
			return nil, fmt.Errorf("%w: cannot listen on %s for the %s: the port is taken (another agent, or a local %s)", validate.ErrInvalid, listen, name, name)
		}
		return nil, fmt.Errorf("%w: %s listener: %w", validate.ErrInvalid, name, err)
	}
	hc.Interval, hc.Timeout = a.cfg.HealthInterval, a.cfg.HealthTimeout
	hc.Rise, hc.Fall = a.cfg.HealthRise, a.cfg.HealthFall
	hc.KeepAlive = true
	hc.OnChange = u.onHealth
	hc.Metrics = reg
	if u.checker, err = health.New(hc, a.log.With("upstream", name)); err != nil {
		u.bal.Close()
		return nil, validate.Invalid(err)
	}
	return u, nil
}

// waitFirstUsable waits up to d for any backend to pass its first check.
func (u *upstream) waitFirstUsable(ctx context.Context, d time.Duration) {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		for _, st := range u.checker.Statuses() {
			if st.State == health.Up {
				return
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (u *upstream) close() {
	u.bal.Close()
	u.checker.Close()
}

// APIServerAddr is the local API server endpoint's address.
func (a *Agent) APIServerAddr() net.Addr { return a.api.bal.Addr() }

// EtcdAddr is the local etcd endpoint's address; nil without one.
func (a *Agent) EtcdAddr() net.Addr {
	if a.etcd == nil {
		return nil
	}
	return a.etcd.bal.Addr()
}

// Run serves until ctx is cancelled.
func (a *Agent) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ups := a.upstreams()
	var wg sync.WaitGroup
	for _, u := range ups {
		u.apply()
	}
	// The listeners are bound: clients connecting now wait in the accept
	// queue, for the first checks, instead of being turned away for want
	// of a backend known to be up.
	a.rank()
	for _, u := range ups {
		u.waitFirstUsable(ctx, a.cfg.HealthTimeout+100*time.Millisecond)
		wg.Go(func() { _ = u.bal.Run(ctx) })
	}
	d, ms, err := a.newDiscovery()
	if err != nil {
		cancel()
		wg.Wait()
		for _, u := range ups {
			u.checker.Close()
		}
		return err
	}
	if d != nil {
		a.mu.Lock() // Status may run already (a caller's goroutine)
		a.disc, a.members = d, ms
		a.mu.Unlock()
		wg.Go(func() { _ = d.Run(ctx) })
	}
	if a.follower != nil {
		wg.Go(func() { _ = a.follower.Run(ctx) })
	}
	wg.Go(func() { a.rankLoop(ctx) })
	if a.metricsLn != nil {
		done := observe.Serve(ctx, a.metricsLn, a.reg, func() any { return a.Status() }, observe.Probes{Ready: a.Ready}, observe.Options{Pprof: a.cfg.Pprof}, a.log)
		defer func() { <-done }()
	}
	// Start-up is over: give back the executable pages only it needed.
	if n, err := trimExecutable(); err != nil {
		a.log.Debug("cannot release start-up pages", "err", err)
	} else {
		a.log.Debug("released start-up pages of the executable", "bytes", n)
	}
	wg.Go(func() { observe.Systemd(ctx, nil, a.log) })
	a.log.Info("agent serving", "apiserver", a.APIServerAddr().String(), "etcd", addrString(a.EtcdAddr()),
		"seed", a.cfg.Server, "etcd_seeds", a.cfg.EtcdSeeds)
	<-ctx.Done()
	wg.Wait()
	for _, u := range ups {
		u.checker.Close()
	}
	if ms != nil {
		ms.l.Close()
	}
	return nil
}

func addrString(a net.Addr) string {
	if a == nil {
		return ""
	}
	return a.String()
}

func (c *Config) withDefaults() error {
	if c.APIServerListen == "" {
		c.APIServerListen = DefaultAPIServerListen
	}
	if c.HealthPath == "" {
		c.HealthPath = health.DefaultPath
	}
	if c.HealthInterval == 0 {
		c.HealthInterval = DefaultHealthInterval
	}
	if c.HealthTimeout == 0 {
		c.HealthTimeout = DefaultHealthTimeout
	}
	if c.HealthRise == 0 {
		c.HealthRise = DefaultHealthRise
	}
	if c.HealthFall == 0 {
		c.HealthFall = DefaultHealthFall
	}
	if c.DiscoveryInterval == 0 {
		c.DiscoveryInterval = DefaultDiscoveryInterval
	}
	if c.feedFirstCheck == 0 {
		c.feedFirstCheck = FeedFirstCheck
	}
	if c.MaxConnsPerSource == 0 {
		c.MaxConnsPerSource = -1 // local clients all come from loopback
	}
	if c.DrainTimeout == 0 {
		c.DrainTimeout = lb.DefaultDrainTimeout
	}
	if c.Server == "" {
		return fmt.Errorf("%w: `server` is required: the API server URL workers used so far, such as https://VIP:6443", validate.ErrInvalid)
	}
	if err := validate.APIServerURL(c.Server); err != nil {
		return fmt.Errorf("%w: `server` %w", validate.ErrInvalid, err)
	}
	u, _ := url.Parse(c.Server)
	if u.Port() == "" {
		u.Host = net.JoinHostPort(u.Hostname(), "443")
		c.Server = u.String()
	}
	if c.BackendPort == 0 {
		c.BackendPort, _ = strconv.Atoi(u.Port())
	}
	if c.BackendPort < 1 || c.BackendPort > 65535 {
		return fmt.Errorf("%w: `backendPort` %d is out of range 1-65535", validate.ErrInvalid, c.BackendPort)
	}
	for flag, addr := range map[string]string{"`apiserverListen`": c.APIServerListen, "`etcdListen`": c.EtcdListen} {
		if addr == "" {
			continue
		}
		if err := validate.LocalEndpoint(flag, addr); err != nil {
			return validate.Invalid(err)
		}
	}
	if c.EtcdListen != "" && len(c.EtcdSeeds) == 0 {
		return fmt.Errorf("%w: `etcdListen` needs `etcdEndpoints`: the agent learns the etcd members from them", validate.ErrInvalid)
	}
	if _, _, err := parseEtcdURLs(c.EtcdSeeds); err != nil {
		return err
	}
	if err := health.ValidatePath(c.HealthPath); err != nil {
		return fmt.Errorf("%w: `healthPath`: %w", validate.ErrInvalid, err)
	}
	switch {
	case c.HealthInterval < 0, c.HealthTimeout < 0, c.HealthRise < 0, c.HealthFall < 0:
		return fmt.Errorf("%w: `healthInterval`, `healthTimeout`, `healthRise` and `healthFall` must be positive", validate.ErrInvalid)
	case c.DiscoveryInterval < 100*time.Millisecond:
		return fmt.Errorf("%w: `discoveryInterval` %v is below 100ms", validate.ErrInvalid, c.DiscoveryInterval)
	case c.DrainTimeout < 0:
		return fmt.Errorf("%w: `lbDrainTimeout` %v must be positive", validate.ErrInvalid, c.DrainTimeout)
	case c.FeedPort < 0 || c.FeedPort > 65535:
		return fmt.Errorf("%w: `feedPort` %d is out of range 0-65535 (0: no feed)", validate.ErrInvalid, c.FeedPort)
	}
	if err := lb.CheckLimits(c.MaxConns, c.MaxConnsPerSource, c.IdleTimeout); err != nil {
		return err
	}
	if err := lb.CheckLoops(c.EventLoops); err != nil {
		return err
	}
	if c.Pprof && c.MetricsAddress == "" {
		return fmt.Errorf("%w: `pprof` serves on `metricsAddress`, which is empty", validate.ErrInvalid)
	}
	if err := validate.ListenAddress("`metricsAddress`", c.MetricsAddress, true); err != nil {
		return validate.Invalid(err)
	}
	return nil
}

// parseEtcdURLs checks etcd client URLs and returns their host:port and
// their common scheme (http or https). None is fine: the agent may run
// without etcd.
func parseEtcdURLs(urls []string) (hostPorts []string, scheme string, err error) {
	if len(urls) == 0 {
		return nil, "", nil
	}
	if err := validate.EtcdEndpoints(urls); err != nil {
		return nil, "", validate.Invalid(err)
	}
	for _, s := range urls {
		u, _ := url.Parse(s)
		scheme = u.Scheme
		hostPorts = append(hostPorts, u.Host)
	}
	return hostPorts, scheme, nil
}
