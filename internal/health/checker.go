package health

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vigil-ha/vigil/internal/validate"
)

// validate.ErrInvalid wraps every configuration error of this package.

// Defaults. They bound how long a backend that stops answering keeps getting
// new connections:
//
//   - refused (process dead, node up): the next check fails at once and the
//     data path marks it dead on its first refused connection anyway, so
//     within one interval plus fall-1 intervals: ≤ 0.8 s;
//   - silent (node powered off, process hung): each check waits Timeout, so
//     ≤ Interval + Fall*Timeout = 1.6 s.
//
// HAProxy's kubeadm recipe takes ~6 s, kube-vip's /version call every 5 s
// up to 10 s. /readyz of a live API server answers in milliseconds; 600 ms
// leaves room for a loaded one, and Fall 2 keeps a single lost check from
// ejecting a backend.
const (
	DefaultPath     = "/readyz"
	DefaultInterval = 400 * time.Millisecond
	DefaultTimeout  = 600 * time.Millisecond
	DefaultRise     = 2
	DefaultFall     = 2
)

// Config configures a Checker.
type Config struct {
	// Path is requested with GET over HTTPS; 200 means healthy.
	Path string
	// Port overrides the backend's port for checks; 0 checks the port
	// traffic goes to.
	Port     int
	Interval time.Duration
	Timeout  time.Duration
	Rise     int
	Fall     int
	// TLS verifies the backends' serving certificates (RootCAs), or skips
	// verification (InsecureSkipVerify) in labs. Certificates, if any, are
	// presented as client certificates (etcd's /health requires one when
	// client certificate auth is on).
	TLS *tls.Config
	// Scheme is "https" (the default), "http" (an etcd without TLS) or
	// SchemeTCP: a check then only opens a TCP connection and closes it,
	// for a backend that speaks no HTTP (Path is not used).
	Scheme string
	// KeepAlive reuses one connection per backend from check to check. A
	// check then costs the backend one request instead of a TCP and TLS
	// handshake: what the worker agent, run on every node, needs. A check
	// that times out closes its connection, so the next one dials afresh.
	KeepAlive bool
	// OnChange is called on every change of a backend's State or Cause, one
	// call at a time, in the order the changes happened. It must not call
	// MarkDead.
	OnChange func(Status)
	// Metrics receives the checker's metrics; nil keeps them private.
	Metrics prometheus.Registerer
}

// SchemeTCP checks that a backend accepts a TCP connection, nothing more.
const SchemeTCP = "tcp"

// WithDefaults fills zero fields with the defaults.
func (c Config) WithDefaults() Config {
	if c.Path == "" {
		c.Path = DefaultPath
	}
	if c.Scheme == "" {
		c.Scheme = "https"
	}
	if c.Interval == 0 {
		c.Interval = DefaultInterval
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.Rise == 0 {
		c.Rise = DefaultRise
	}
	if c.Fall == 0 {
		c.Fall = DefaultFall
	}
	return c
}

// Validate checks a config after WithDefaults.
func (c Config) Validate() error {
	if err := ValidatePath(c.Path); err != nil {
		return err
	}
	switch {
	case c.Scheme != "https" && c.Scheme != "http" && c.Scheme != SchemeTCP:
		return fmt.Errorf("%w: health check scheme %q must be https, http or tcp", validate.ErrInvalid, c.Scheme)
	case c.Port < 0 || c.Port > 65535:
		return fmt.Errorf("%w: health check port %d is out of range 1-65535", validate.ErrInvalid, c.Port)
	case c.Interval <= 0:
		return fmt.Errorf("%w: health check interval %v must be positive", validate.ErrInvalid, c.Interval)
	case c.Timeout <= 0:
		return fmt.Errorf("%w: health check timeout %v must be positive", validate.ErrInvalid, c.Timeout)
	case c.Rise < 1 || c.Fall < 1:
		return fmt.Errorf("%w: health check rise %d and fall %d must be at least 1", validate.ErrInvalid, c.Rise, c.Fall)
	}
	return nil
}

// ValidatePath accepts an absolute URL path with an optional query, such as
// /readyz or /readyz?exclude=etcd.
func ValidatePath(p string) error {
	if !strings.HasPrefix(p, "/") || strings.HasPrefix(p, "//") || strings.ContainsAny(p, " \t\r\n#") {
		return fmt.Errorf("%w: health check path %q must be an absolute path such as /readyz", validate.ErrInvalid, p)
	}
	u, err := url.ParseRequestURI(p)
	if err != nil || u.Host != "" || u.Scheme != "" {
		return fmt.Errorf("%w: health check path %q must be an absolute path such as /readyz", validate.ErrInvalid, p)
	}
	return nil
}

// Checker health-checks a changing set of backends, one goroutine each.
type Checker struct {
	cfg    Config
	log    *slog.Logger
	client *http.Client
	dialer *net.Dialer     // the TCP checks'
	ctx    context.Context // parent of every probe; cancelled by Close
	stop   context.CancelFunc
	wg     sync.WaitGroup

	notifyMu sync.Mutex // held across a state change and its OnChange call

	mu     sync.Mutex // guards probes, each probe's tracker, and pace
	probes map[string]*probe
	// pace, when set, gives each backend's next interval (SetPace).
	pace func(Status) time.Duration

	checks *prometheus.CounterVec
}

type probe struct {
	t      tracker
	cancel context.CancelFunc
	wake   chan struct{} // a check now (Wake)
	// rtt is a moving average of how long passed checks took; 0 until one
	// passed.
	rtt time.Duration
}

// New returns a checker with no backends.
func New(cfg Config, log *slog.Logger) (*Checker, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	tc := cfg.TLS
	if tc == nil {
		tc = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	tr := &http.Transport{
		// By default a fresh connection per check, as HAProxy does: a
		// check must prove that the backend accepts connections now.
		DisableKeepAlives:   !cfg.KeepAlive,
		MaxIdleConnsPerHost: 1,
		// An idle connection outlives its backend's removal by at most
		// this much.
		IdleConnTimeout:     3*cfg.Interval + cfg.Timeout,
		TLSClientConfig:     tc,
		TLSHandshakeTimeout: cfg.Timeout,
		Proxy:               nil, // never through an HTTP proxy from the environment
		DialContext:         (&net.Dialer{Timeout: cfg.Timeout}).DialContext,
	}
	ctx, stop := context.WithCancel(context.Background())
	c := &Checker{
		cfg:    cfg,
		log:    log,
		client: &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }},
		dialer: &net.Dialer{Timeout: cfg.Timeout},
		ctx:    ctx,
		stop:   stop,
		probes: map[string]*probe{},
		checks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vigil_health_checks_total",
			Help: "Health checks of API server backends, by result (ok, draining, dead: refused, unreachable: no answer in time or another failure).",
		}, []string{"backend", "result"}),
	}
	if cfg.Metrics != nil {
		if err := cfg.Metrics.Register(c.checks); err != nil {
			stop()
			return nil, fmt.Errorf("register health metrics: %w", err)
		}
	}
	return c, nil
}

// Set makes the checked backends exactly backends (host:port each): new ones
// are checked at once, removed ones are forgotten.
func (c *Checker) Set(backends []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ctx.Err() != nil {
		return
	}
	want := map[string]bool{}
	for _, b := range backends {
		want[b] = true
		if _, ok := c.probes[b]; ok {
			continue
		}
		ctx, cancel := context.WithCancel(c.ctx)
		p := &probe{t: tracker{rise: c.cfg.Rise, fall: c.cfg.Fall, st: Status{Backend: b, Since: time.Now()}}, cancel: cancel, wake: make(chan struct{}, 1)}
		c.probes[b] = p
		// A new backend is checked at once, unless a pace slows it: then
		// at a random time within its paced interval, so that a fleet of
		// agents told of a new API server at the same moment does not
		// open its connections to it in the same second.
		var first time.Duration
		if c.pace != nil {
			if d := c.pace(p.t.st); d > c.cfg.Interval {
				first = rand.N(d)
			}
		}
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			c.loop(ctx, b, p.wake, first)
		}()
	}
	for b, p := range c.probes {
		if !want[b] {
			p.cancel()
			delete(c.probes, b)
			for _, r := range []string{"ok", "draining", "dead", "unreachable"} {
				c.checks.DeleteLabelValues(b, r)
			}
		}
	}
}

// SetPace makes pace decide each backend's interval from its status after
// each check: the worker agent checks slowly what the control plane's feed
// vouches for (docs/agent.md, "At fleet scale"). The interval it returns
// is jittered like Interval; 0 or less, or a nil pace, means Interval. A
// backend added later whose pace is longer than Interval is first checked
// at a random time within it, not at once.
// Call Wake for the backends whose pace got shorter. pace runs under the
// checker's lock: it must not call the checker.
func (c *Checker) SetPace(pace func(Status) time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pace = pace
}

// Wake checks backend now, without waiting for its next check.
func (c *Checker) Wake(backend string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if p, ok := c.probes[backend]; ok {
		select {
		case p.wake <- struct{}{}:
		default:
		}
	}
}

// interval is backend's next interval, given its status now.
func (c *Checker) interval(backend string) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	p, ok := c.probes[backend]
	if !ok || c.pace == nil {
		return c.cfg.Interval
	}
	if d := c.pace(p.t.st); d > 0 {
		return d
	}
	return c.cfg.Interval
}

// MarkDead takes a backend down at once as Dead.
func (c *Checker) MarkDead(backend string, err error) {
	c.change(backend, func(t *tracker, now time.Time) bool { return t.markDead(err.Error(), now) })
	c.repace(backend)
}

// repace wakes backend's loop after a failure seen from outside it (a
// failed connection), when a pace may have it asleep for long: its next
// interval is the one for its state now.
func (c *Checker) repace(backend string) {
	c.mu.Lock()
	paced := c.pace != nil
	c.mu.Unlock()
	if paced {
		c.Wake(backend)
	}
}

// DialFailed is passive health checking: the data path calls it when a
// connection to backend failed. What the error proves decides what happens:
//
//   - refused: nothing listens on the port, so the process is gone. The
//     backend is marked Dead at once, before its next check.
//   - a local shortage (no free source port, out of file descriptors or
//     buffers) or a cancelled attempt: nothing about the backend. Ignored.
//   - anything else (a timeout, no route): counts as one failed check, with
//     cause Unreachable. A single slow answer takes nothing down; Fall of
//     them in a row, from checks or connections, do.
func (c *Checker) DialFailed(backend string, err error) {
	switch cause := dialCause(err); cause {
	case Dead:
		c.MarkDead(backend, err)
	case Unreachable:
		r := result{cause: Unreachable, err: err.Error(), started: time.Now()}
		c.change(backend, func(t *tracker, now time.Time) bool { return t.observe(r, now) })
		c.repace(backend)
	}
}

// dialCause says what a failed connection attempt proves about its
// backend: Dead, Unreachable, or NoCause when the failure is this host's
// own (or the attempt was cancelled).
func dialCause(err error) Cause {
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return Dead
	case errors.Is(err, syscall.EADDRNOTAVAIL), errors.Is(err, syscall.EMFILE), errors.Is(err, syscall.ENFILE),
		errors.Is(err, syscall.ENOBUFS), errors.Is(err, syscall.ENOMEM), errors.Is(err, context.Canceled):
		return NoCause
	default:
		return Unreachable
	}
}

// checkCause is what a failed check proves: Dead when the connection was
// refused, Unreachable otherwise (a local shortage too: the check could
// not prove the backend healthy, so it counts as a failure, but not as
// proof that its process is gone).
func checkCause(err error) Cause {
	if errors.Is(err, syscall.ECONNREFUSED) {
		return Dead
	}
	return Unreachable
}

// Status returns the status of one backend.
func (c *Checker) Status(backend string) (Status, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	p, ok := c.probes[backend]
	if !ok {
		return Status{}, false
	}
	return p.t.st, true
}

// Statuses returns every backend's status, sorted by backend.
func (c *Checker) Statuses() []Status {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]Status, 0, len(c.probes))
	for _, p := range c.probes {
		out = append(out, p.t.st)
	}
	slices.SortFunc(out, func(a, b Status) int { return strings.Compare(a.Backend, b.Backend) })
	return out
}

// Latency is a moving average of how long backend's passed checks took: a
// measure of how near it is. ok is false until one passed.
func (c *Checker) Latency(backend string) (d time.Duration, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	p, found := c.probes[backend]
	if !found || p.rtt == 0 {
		return 0, false
	}
	return p.rtt, true
}

// Close stops every check and waits for them. It is safe to call twice.
func (c *Checker) Close() {
	c.stop()
	c.wg.Wait()
	c.client.CloseIdleConnections()
}

func (c *Checker) loop(ctx context.Context, backend string, wake <-chan struct{}, first time.Duration) {
	next := time.NewTimer(first)
	defer next.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-next.C:
		case <-wake:
		}
		start := time.Now()
		r := c.check(ctx, backend)
		if ctx.Err() != nil {
			return
		}
		r.started, r.took = start, time.Since(start)
		if r.cause == NoCause {
			c.observeRTT(backend, r.took)
		}
		c.checks.WithLabelValues(backend, resultLabel(r.cause)).Inc()
		c.change(backend, func(t *tracker, now time.Time) bool { return t.observe(r, now) })
		// The next check starts one interval after this one started, or at
		// once if this one took longer (a timed-out check). The interval
		// is shortened by a random part of up to a fifth, so that checkers
		// started together (1,000 agents after a rollout) drift apart
		// instead of probing every API server in the same instant.
		iv := c.interval(backend)
		next.Reset(max(0, iv-rand.N(iv/5+1)-time.Since(start)))
	}
}

// observeRTT folds one passed check's duration into the backend's average
// (weight 1/4: a single slow answer does not reorder backends).
func (c *Checker) observeRTT(backend string, d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	p, ok := c.probes[backend]
	if !ok {
		return
	}
	if p.rtt == 0 {
		p.rtt = max(d, time.Microsecond)
		return
	}
	p.rtt += (d - p.rtt) / 4
}

// change applies f to a backend's tracker and reports a change to OnChange.
func (c *Checker) change(backend string, f func(*tracker, time.Time) bool) {
	c.notifyMu.Lock()
	defer c.notifyMu.Unlock()
	c.mu.Lock()
	p, ok := c.probes[backend]
	if !ok {
		c.mu.Unlock()
		return // removed meanwhile
	}
	changed := f(&p.t, time.Now())
	st := p.t.st
	c.mu.Unlock()
	if !changed {
		return
	}
	if st.State == Down {
		c.log.Warn("backend down", "backend", backend, "cause", st.Cause.String(), "err", st.LastError)
	} else {
		c.log.Info("backend "+st.State.String(), "backend", backend)
	}
	if c.cfg.OnChange != nil {
		c.cfg.OnChange(st)
	}
}

// check runs one health check.
func (c *Checker) check(ctx context.Context, backend string) result {
	host, port, err := net.SplitHostPort(backend)
	if err != nil {
		return result{cause: Unreachable, err: err.Error()}
	}
	if c.cfg.Port != 0 {
		port = strconv.Itoa(c.cfg.Port)
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	if c.cfg.Scheme == SchemeTCP {
		conn, err := c.dialer.DialContext(ctx, "tcp", net.JoinHostPort(host, port))
		if err != nil {
			return result{cause: checkCause(err), err: err.Error()}
		}
		_ = conn.Close()
		return result{}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.cfg.Scheme+"://"+net.JoinHostPort(host, port)+c.cfg.Path, nil)
	if err != nil {
		return result{cause: Unreachable, err: err.Error()}
	}
	req.Header.Set("User-Agent", "vigil-health")
	resp, err := c.client.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // the URL is the backend; logs say so already
		}
		return result{cause: checkCause(err), err: err.Error()}
	}
	_, err = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if err != nil {
		return result{cause: Unreachable, err: "read " + c.cfg.Path + ": " + err.Error()}
	}
	if resp.StatusCode != http.StatusOK {
		return result{cause: Draining, err: fmt.Sprintf("GET %s: HTTP %d", c.cfg.Path, resp.StatusCode)}
	}
	return result{}
}

// resultLabel is a check's result as its metric's label: "ok", or why it
// failed (Cause's names).
func resultLabel(c Cause) string {
	if c == NoCause {
		return "ok"
	}
	return c.String()
}
