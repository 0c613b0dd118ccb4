package lab

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vigil-ha/vigil/internal/clock"
)

// The reconnect-storm drill: StormClients watches through the VIP holder's
// load balancer, from StormSources addresses, all dropped by their clients
// at the same instant and opened again at once, as thousands of kubelets
// and kube-proxies do when the VIP moves or an API server restarts. Every
// client must have a working watch again within StormBound, and the VIP
// must not move: the storm must not starve the holder's renewals.
const (
	DrillReconnectStorm = "reconnect-storm"
	StormClients        = 5000
	StormBound          = 5 * time.Second
	// StormSources spreads the clients over this many source addresses,
	// StormClients/StormSources each: below vigil's default per-source
	// limit (--lb-max-conns-per-source 768), as many nodes would be.
	StormSources = MaxFloodSources
	// stormEvery is how often each watch delivers an event: a quiet
	// cluster's watch, so the drill measures connections, not throughput.
	stormEvery = 5 * time.Second
	// stormOpeners bounds the watches opened at once before the storm.
	stormOpeners = 100
	// stormGiveUp is how long the client keeps reconnecting before it
	// reports the clients still without a watch.
	stormGiveUp = 60 * time.Second
)

// StormConfig configures the storm client, `vigil-lab storm`, which runs
// inside the client namespace.
type StormConfig struct {
	// Targets are HOST:PORT, taken in turn: the VIP's balancer, or each API
	// server directly. Each is verified under its host.
	Targets []string `json:"targets"`
	CAFile  string   `json:"caFile"`
	Sources []string `json:"sources"` // local addresses, taken in turn
	Clients int      `json:"clients"`
	// Every is the watches' event interval.
	Every time.Duration `json:"every"`
}

// StormClientResult is what the storm client measured.
type StormClientResult struct {
	Clients int `json:"clients"`
	Sources int `json:"sources"`
	// OpenMillis is how long opening every watch took, at most
	// stormOpeners at a time; OpenRetries the failed attempts then.
	OpenMillis  float64 `json:"openMillis"`
	OpenRetries int     `json:"openRetries"`
	// Start and End bound the storm: from dropping every watch to the last
	// one open again (or giving up).
	Start time.Time `json:"start"`
	End   time.Time `json:"end"`
	// Reconnected clients had a watch delivering events again; Failed
	// counts the attempts that failed during the storm, each retried after
	// 100-300 ms.
	Reconnected int `json:"reconnected"`
	Failed      int `json:"failed"`
	// From the drop to each client's first event on its new watch.
	MedianMillis float64 `json:"medianMillis"`
	P99Millis    float64 `json:"p99Millis"`
	WorstMillis  float64 `json:"worstMillis"`
	// ServedBy counts the watches per API server before the storm, and
	// ServedAfter after it.
	ServedBy    map[string]int `json:"servedBy"`
	ServedAfter map[string]int `json:"servedAfter"`
	FirstErrors []string       `json:"firstErrors,omitempty"`
	// CPUSeconds is what the clients' process used during the storm: its
	// TLS handshakes are most of what a storm costs on one machine.
	CPUSeconds float64 `json:"cpuSeconds"`
}

// stormClient holds the storm's HTTP clients, one per source address.
type stormClient struct {
	cfg     StormConfig
	clients []*http.Client
	urls    []string

	mu     sync.Mutex // guards errors
	errors []string
}

func newStormClient(cfg StormConfig) (*stormClient, error) {
	switch {
	case cfg.Clients < 1 || len(cfg.Sources) == 0 || len(cfg.Targets) == 0:
		return nil, fmt.Errorf("lab: storm: need targets, sources and clients above 0 (got %v, %v, %d)", cfg.Targets, cfg.Sources, cfg.Clients)
	case cfg.Every < WatchTick:
		return nil, fmt.Errorf("lab: storm: every %v is below the stand-in's %v", cfg.Every, WatchTick)
	}
	pem, err := os.ReadFile(cfg.CAFile)
	if err != nil {
		return nil, fmt.Errorf("lab: storm: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("lab: storm: no certificate in %s", cfg.CAFile)
	}
	c := &stormClient{cfg: cfg}
	for _, t := range cfg.Targets {
		c.urls = append(c.urls, fmt.Sprintf("https://%s/watch?every=%s", t, cfg.Every))
	}
	for _, src := range cfg.Sources {
		ip := net.ParseIP(src)
		if ip == nil {
			return nil, fmt.Errorf("lab: storm: source %q is not an address", src)
		}
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: ip}, Timeout: 5 * time.Second}
		c.clients = append(c.clients, &http.Client{Transport: &http.Transport{
			DisableKeepAlives:     true, // one connection per watch
			DialContext:           d.DialContext,
			TLSClientConfig:       &tls.Config{RootCAs: pool},
			TLSHandshakeTimeout:   10 * time.Second,
			ResponseHeaderTimeout: 10 * time.Second,
		}})
	}
	return c, nil
}

// stormWatch is one client's open watch.
type stormWatch struct {
	node   string
	cancel context.CancelFunc
	done   chan struct{} // closed when its reader returns
}

// open starts client i's watch and returns once its first event arrived.
func (c *stormClient) open(ctx context.Context, i int) (*stormWatch, error) {
	wctx, cancel := context.WithCancel(ctx)
	// The first event must come within 10 s; after it the watch lives
	// until cancelled.
	first := time.AfterFunc(10*time.Second, cancel)
	req, err := http.NewRequestWithContext(wctx, http.MethodGet, c.urls[i%len(c.urls)], nil)
	if err != nil {
		cancel()
		return nil, err
	}
	resp, err := c.clients[i%len(c.clients)].Do(req)
	if err != nil {
		cancel()
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		cancel()
		return nil, fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	r := bufio.NewReader(resp.Body)
	var ev struct{ Node string }
	line, err := r.ReadBytes('\n')
	if err == nil {
		err = json.Unmarshal(line, &ev)
	}
	if !first.Stop() && err == nil {
		err = errors.New("no first event within 10s")
	}
	if err != nil {
		resp.Body.Close()
		cancel()
		return nil, err
	}
	w := &stormWatch{node: ev.Node, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		defer resp.Body.Close()
		for {
			if _, err := r.ReadBytes('\n'); err != nil {
				return
			}
		}
	}()
	return w, nil
}

func (c *stormClient) noteError(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.errors) < 5 {
		c.errors = append(c.errors, err.Error())
	}
}

// openRetrying opens client i's watch, retrying after 100-300 ms (a
// client's jittered backoff) until it works or deadline; it returns the
// watch (nil at the deadline) and the failed attempts.
func (c *stormClient) openRetrying(ctx context.Context, i int, deadline time.Time) (*stormWatch, int) {
	failed := 0
	for {
		w, err := c.open(ctx, i)
		if err == nil {
			return w, failed
		}
		failed++
		c.noteError(err)
		if time.Now().After(deadline) || !clock.Sleep(ctx, time.Duration(100+rand.IntN(200))*time.Millisecond) {
			return nil, failed
		}
	}
}

// RunStorm opens cfg.Clients watches, then drops them all at once and
// opens them again at once, and reports how that went.
func RunStorm(ctx context.Context, cfg StormConfig) (StormClientResult, error) {
	res := StormClientResult{Clients: cfg.Clients, Sources: len(cfg.Sources), ServedBy: map[string]int{}, ServedAfter: map[string]int{}}
	c, err := newStormClient(cfg)
	if err != nil {
		return res, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	watches := make([]*stormWatch, cfg.Clients)
	defer func() {
		cancel()
		for _, w := range watches {
			if w != nil {
				<-w.done
			}
		}
	}()

	start := time.Now()
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, stormOpeners)
	for i := range watches {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			w, failed := c.openRetrying(ctx, i, time.Now().Add(30*time.Second))
			mu.Lock()
			watches[i], res.OpenRetries = w, res.OpenRetries+failed
			mu.Unlock()
		})
	}
	wg.Wait()
	res.OpenMillis = millis(time.Since(start))
	for _, w := range watches {
		if w == nil {
			return res, fmt.Errorf("lab: storm: not every watch opened (%d failed attempts): %v", res.OpenRetries, c.errors)
		}
		res.ServedBy[w.node]++
	}
	fmt.Fprintf(os.Stderr, "storm: %d watches open in %.0fms through %s; dropping them all\n", len(watches), res.OpenMillis, strings.Join(cfg.Targets, ","))
	// A quiet second: every watch has delivered its first event, the
	// balancer holds them all.
	if !clock.Sleep(ctx, time.Second) {
		return res, ctx.Err()
	}

	// The storm: every client drops its watch and opens a new one, all at
	// once.
	cpu0 := ownCPU()
	res.Start = time.Now()
	deadline := res.Start.Add(stormGiveUp)
	took := make([]float64, len(watches))
	for i, w := range watches {
		wg.Go(func() {
			w.cancel()
			<-w.done
			nw, failed := c.openRetrying(ctx, i, deadline)
			at := time.Now()
			mu.Lock()
			defer mu.Unlock()
			watches[i], res.Failed = nw, res.Failed+failed
			if nw != nil {
				took[i] = millis(at.Sub(res.Start))
				res.Reconnected++
				res.ServedAfter[nw.node]++
			}
		})
	}
	wg.Wait()
	res.End = time.Now()
	res.CPUSeconds = ownCPU() - cpu0
	res.FirstErrors = c.errors
	var ok []float64
	for i, w := range watches {
		if w != nil {
			ok = append(ok, took[i])
		}
	}
	if len(ok) > 0 {
		slices.Sort(ok)
		res.MedianMillis, res.WorstMillis = median(ok), ok[len(ok)-1]
		res.P99Millis = ok[min(len(ok)-1, int(0.99*float64(len(ok))+0.5)-1)]
	}
	return res, nil
}

// StormResult adds what reconnect-storm measures to Result: the same storm
// sent straight to the API servers, then through the VIP. On one machine
// the clients' and the API servers' TLS handshakes share its cores with the
// balancer; the direct storm shows what they cost without it.
type StormResult struct {
	Direct  StormRun `json:"direct"`
	Through StormRun `json:"through"`
	// LBMaxConns is the lab's --lb-max-conns (-1: none).
	LBMaxConns int `json:"lbMaxConns"`
}

// StormRun is one storm: what the clients measured, and the CPU the
// holder's vigil and the API servers used from the drop to the last
// reconnection, with the holder's resident memory before and at most
// during it (sampled every 100 ms).
type StormRun struct {
	StormClientResult
	HolderCPUSeconds     float64 `json:"holderCPUSeconds"`
	HolderRSSBeforeMiB   float64 `json:"holderRSSBeforeMiB"`
	HolderRSSMiB         float64 `json:"holderRSSMiB"`
	APIServersCPUSeconds float64 `json:"apiServersCPUSeconds"`
}

func (s *StormRun) String() string {
	return fmt.Sprintf("%d clients from %d addresses (opened in %.0fms): %d reconnected, median %.0fms, p99 %.0fms, worst %.0fms, %d failed attempts; watches per API server %v -> %v; CPU-s during the storm: holder's vigil %.1f (RSS %.0f -> %.0f MiB), API servers %.1f, clients %.1f",
		s.Clients, s.Sources, s.OpenMillis, s.Reconnected, s.MedianMillis, s.P99Millis, s.WorstMillis, s.Failed,
		s.ServedBy, s.ServedAfter, s.HolderCPUSeconds, s.HolderRSSBeforeMiB, s.HolderRSSMiB, s.APIServersCPUSeconds, s.CPUSeconds)
}

func (s *StormResult) String() string {
	return fmt.Sprintf("direct to the API servers: %s\n    through the VIP:           %s", &s.Direct, &s.Through)
}

// stormFits reports whether the lab's balancer takes StormClients
// connections.
func (s Settings) stormFits() bool { return s.LBMaxConns < 0 || s.LBMaxConns >= StormClients }

// stormDrill runs reconnect-storm: the storm client in the client
// namespace, straight to the API servers and then through the VIP, while
// every node's addresses are sampled and the holder's vigil is watched.
func (l *Lab) stormDrill(ctx context.Context, r *Result) error {
	s := l.st.Settings
	if err := l.needStandInLB(DrillReconnectStorm); err != nil {
		return err
	}
	if !s.stormFits() {
		return fmt.Errorf("drill %s opens %d connections through the VIP; this lab's vigil takes %s at once: vigil-lab up --lb-max-conns %d (or more)",
			DrillReconnectStorm, StormClients, conns(s.LBMaxConns), 2*StormClients)
	}
	holder, err := l.waitStable(ctx, recoverTimeout)
	if err != nil {
		return fmt.Errorf("lab not stable before the drill: %w", err)
	}
	if err := l.waitBackendsUp(ctx, holder, len(l.st.Nodes), recoverTimeout); err != nil {
		return err
	}
	h, err := l.node(holder)
	if err != nil {
		return err
	}
	r.Before = holder
	srcs, removeSources, err := addClientSources(ctx, StormSources)
	defer removeSources()
	if err != nil {
		return err
	}

	d, err := l.newDrillRun()
	if err != nil {
		return err
	}
	defer d.w.close()
	mon := startMonitor(d.w, d.live, probeInterval)
	defer mon.close()
	mon.expect(holder)
	// vigil promises the VIP stays put only while etcd answers within
	// storePromise, and a storm on this machine's two cores can starve
	// etcd too: a store watch writes through the members meanwhile, as
	// the holder's renewals do, and a move is excused only by such a
	// write just before the VIP left that leaves room for the promise to
	// have been broken (slower than storeDoubt, or failed).
	stw, stopStore, err := l.startLabStoreWatch(nil)
	if err != nil {
		return err
	}
	defer stopStore()
	res := &StormResult{LBMaxConns: s.LBMaxConns}
	r.Storm = res
	var direct []string
	for _, n := range l.st.Nodes {
		direct = append(direct, fmt.Sprintf("%s:%d", n.IP, APIServerPort))
	}
	errs := []error{}
	for _, run := range []struct {
		name    string
		targets []string
		into    *StormRun
	}{
		{"direct to the API servers", direct, &res.Direct},
		{"through the VIP", []string{fmt.Sprintf("%s:%d", VIP.Addr(), s.LBPort)}, &res.Through},
	} {
		l.progress("reconnect-storm: %d clients %s", StormClients, run.name)
		err := l.storm(ctx, h, run.targets, srcs, run.into)
		if err == nil && run.into.Reconnected < run.into.Clients {
			err = fmt.Errorf("%d of %d clients had no watch %v after the storm: %v", run.into.Clients-run.into.Reconnected, run.into.Clients, stormGiveUp, run.into.FirstErrors)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", run.name, err))
		}
	}
	// The balancer may add to the storm's time, within reason: on one
	// machine both are bound by the same two cores.
	if bound := max(StormBound, 2*time.Duration(res.Direct.WorstMillis*float64(time.Millisecond))); len(errs) == 0 && res.Through.WorstMillis > millis(bound) {
		errs = append(errs, fmt.Errorf("through the VIP the last client reconnected %.0fms after the storm, above %v (the larger of %v and twice the direct storm's %.0fms)",
			res.Through.WorstMillis, bound.Round(time.Millisecond), StormBound, res.Direct.WorstMillis))
	}

	final, err := r.judgeHolders(mon.close(), d.w, d.live())
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	if len(final) == 1 {
		r.After = final[0]
	}
	if r.After != holder {
		left := mon.leftAt()
		if slowest, ok := slowStoreBefore(stw.close(), left, checkEvery); ok && !left.IsZero() {
			r.StoreSlowMillis = millis(slowest)
		} else {
			errs = append(errs, fmt.Errorf("the VIP moved from %s to %v during a reconnect storm, while etcd answered the lab's writes within %v", holder, final, storeDoubt))
		}
	}
	return errors.Join(errs...)
}

// storm runs the storm client once against targets, from srcs, and samples
// the holder h's vigil and the API servers meanwhile.
func (l *Lab) storm(ctx context.Context, h *Node, targets, srcs []string, into *StormRun) error {
	type sample struct {
		at            time.Time
		cpu, rss, api float64
	}
	pid := h.PIDs[roleVigil]
	var apis []int
	for _, n := range l.st.Nodes {
		apis = append(apis, n.PIDs[roleAPIServer])
	}
	into.HolderRSSBeforeMiB = rssMiB(pid)
	samples := newRecorder[sample]()
	go samples.every(100*time.Millisecond, func() {
		x := sample{at: time.Now(), cpu: cpuSeconds(pid), rss: rssMiB(pid)}
		for _, p := range apis {
			x.api += cpuSeconds(p)
		}
		samples.add(x)
	})
	cfg, err := json.Marshal(StormConfig{Targets: targets, CAFile: l.caPath(), Sources: srcs, Clients: StormClients, Every: stormEvery})
	if err != nil {
		return err
	}
	out, runErr := exec.CommandContext(ctx, "ip", "netns", "exec", clientNS, l.selfBin, "storm", "--config", string(cfg)).Output()
	var ee *exec.ExitError
	if errors.As(runErr, &ee) {
		runErr = fmt.Errorf("storm client: %w: %s", runErr, strings.TrimSpace(string(ee.Stderr)))
	}
	if runErr == nil {
		runErr = json.Unmarshal(out, &into.StormClientResult)
	}
	var before, after sample
	for _, x := range samples.close() {
		if !x.at.After(into.Start) {
			before = x
		}
		if after.at.IsZero() && !x.at.Before(into.End) {
			after = x
		}
		if !x.at.Before(into.Start) && !x.at.After(into.End.Add(time.Second)) {
			into.HolderRSSMiB = max(into.HolderRSSMiB, x.rss)
		}
	}
	if !before.at.IsZero() && !after.at.IsZero() {
		into.HolderCPUSeconds = after.cpu - before.cpu
		into.APIServersCPUSeconds = after.api - before.api
	}
	return runErr
}

// conns says what an --lb-max-conns value lets in.
func conns(max int) string {
	switch {
	case max < 0:
		return "any number"
	case max == 0:
		return "vigil's default (--lb-max-conns)"
	}
	return fmt.Sprintf("%d", max)
}

// cpuSeconds is the CPU time (user and system) a process has used, 0 if
// it cannot be read.
func cpuSeconds(pid int) float64 {
	f, err := procStat(pid)
	if err != nil || len(f) < 13 {
		return 0
	}
	var ut, st float64
	fmt.Sscan(f[11], &ut)
	fmt.Sscan(f[12], &st)
	return (ut + st) / 100 // USER_HZ
}

// ownCPU is the CPU time this process has used, in seconds.
func ownCPU() float64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}
