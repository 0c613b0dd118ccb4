package lab

import (
	"bufio"
	"bytes"
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
	"time"
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
	Target     string   `json:"target"` // HOST:PORT of the VIP's balancer
	CAFile     string   `json:"caFile"`
	ServerName string   `json:"serverName"`
	Sources    []string `json:"sources"` // local addresses, taken in turn
	Clients    int      `json:"clients"`
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
}

// stormClient holds the storm's HTTP clients, one per source address.
type stormClient struct {
	cfg     StormConfig
	clients []*http.Client
	url     string

	mu     sync.Mutex // guards errors
	errors []string
}

func newStormClient(cfg StormConfig) (*stormClient, error) {
	switch {
	case cfg.Clients < 1 || len(cfg.Sources) == 0 || cfg.Target == "":
		return nil, fmt.Errorf("lab: storm: need --target, --source and --clients above 0 (got %q, %v, %d)", cfg.Target, cfg.Sources, cfg.Clients)
	case cfg.Every < WatchTick:
		return nil, fmt.Errorf("lab: storm: --every %v is below the stand-in's %v", cfg.Every, WatchTick)
	}
	pem, err := os.ReadFile(cfg.CAFile)
	if err != nil {
		return nil, fmt.Errorf("lab: storm: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("lab: storm: no certificate in %s", cfg.CAFile)
	}
	c := &stormClient{cfg: cfg, url: fmt.Sprintf("https://%s/watch?every=%s", cfg.Target, cfg.Every)}
	for _, src := range cfg.Sources {
		ip := net.ParseIP(src)
		if ip == nil {
			return nil, fmt.Errorf("lab: storm: source %q is not an address", src)
		}
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: ip}, Timeout: 5 * time.Second}
		c.clients = append(c.clients, &http.Client{Transport: &http.Transport{
			DisableKeepAlives:     true, // one connection per watch
			DialContext:           d.DialContext,
			TLSClientConfig:       &tls.Config{RootCAs: pool, ServerName: cfg.ServerName},
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
	req, err := http.NewRequestWithContext(wctx, http.MethodGet, c.url, nil)
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
		if time.Now().After(deadline) || !sleepCtx(ctx, time.Duration(100+rand.IntN(200))*time.Millisecond) {
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
	fmt.Fprintf(os.Stderr, "storm: %d watches open in %.0fms through %s; dropping them all\n", len(watches), res.OpenMillis, cfg.Target)
	// A quiet second: every watch has delivered its first event, the
	// balancer holds them all.
	if !sleepCtx(ctx, time.Second) {
		return res, ctx.Err()
	}

	// The storm: every client drops its watch and opens a new one, all at
	// once.
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

// StormResult adds what reconnect-storm measures to Result.
type StormResult struct {
	StormClientResult
	// LBMaxConns is the lab's --lb-max-conns (-1: none).
	LBMaxConns int `json:"lbMaxConns"`
	// The holder's vigil: resident memory before the storm and at most
	// during it (sampled every 100 ms), and the CPU it used from the drop
	// to the last reconnection.
	HolderRSSBeforeMiB float64 `json:"holderRSSBeforeMiB"`
	HolderRSSMiB       float64 `json:"holderRSSMiB"`
	HolderCPUSeconds   float64 `json:"holderCPUSeconds"`
}

func (s *StormResult) String() string {
	return fmt.Sprintf("%d clients from %d addresses (opened in %.0fms): %d reconnected, median %.0fms, p99 %.0fms, worst %.0fms (bound %v), %d failed attempts; watches per API server %v -> %v; holder's vigil %.1f CPU-s, RSS %.0f -> %.0f MiB",
		s.Clients, s.Sources, s.OpenMillis, s.Reconnected, s.MedianMillis, s.P99Millis, s.WorstMillis, StormBound, s.Failed,
		s.ServedBy, s.ServedAfter, s.HolderCPUSeconds, s.HolderRSSBeforeMiB, s.HolderRSSMiB)
}

// stormFits reports whether the lab's balancer takes StormClients
// connections.
func (s Settings) stormFits() bool { return s.LBMaxConns < 0 || s.LBMaxConns >= StormClients }

// stormDrill runs reconnect-storm: the storm client in the client
// namespace, while every node's addresses are sampled and the holder's
// vigil is watched.
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

	w, err := newVIPWatch(l.st.Nodes)
	if err != nil {
		return err
	}
	defer w.close()
	d := &drillRun{l: l, dead: map[string]bool{}, w: w}
	mon := startMonitor(w, d.live, probeInterval)
	defer mon.close()
	pid := h.PIDs[roleVigil]
	res := &StormResult{LBMaxConns: s.LBMaxConns, HolderRSSBeforeMiB: rssMiB(pid)}
	r.Storm = res
	type sample struct {
		at       time.Time
		cpu, rss float64
	}
	samples := newRecorder[sample]()
	go samples.every(100*time.Millisecond, func() {
		samples.add(sample{time.Now(), cpuSeconds(pid), rssMiB(pid)})
	})

	cfg, err := json.Marshal(StormConfig{
		Target: fmt.Sprintf("%s:%d", VIP.Addr(), s.LBPort), CAFile: l.caPath(), ServerName: VIP.Addr().String(),
		Sources: srcs, Clients: StormClients, Every: stormEvery,
	})
	if err != nil {
		return err
	}
	out, runErr := exec.CommandContext(ctx, "ip", "netns", "exec", clientNS, l.selfBin, "storm", "--config", string(cfg)).Output()
	var ee *exec.ExitError
	if errors.As(runErr, &ee) {
		runErr = fmt.Errorf("storm client: %w: %s", runErr, strings.TrimSpace(string(ee.Stderr)))
	}
	if runErr == nil {
		runErr = json.Unmarshal(out, &res.StormClientResult)
	}
	var before, after sample
	for _, x := range samples.close() {
		if !x.at.After(res.Start) {
			before = x
		}
		if after.at.IsZero() && !x.at.Before(res.End) {
			after = x
		}
		if !x.at.Before(res.Start) && !x.at.After(res.End.Add(time.Second)) {
			res.HolderRSSMiB = max(res.HolderRSSMiB, x.rss)
		}
	}
	if !before.at.IsZero() && !after.at.IsZero() {
		res.HolderCPUSeconds = after.cpu - before.cpu
	}

	final, err := r.judgeHolders(mon.close(), w, d.live())
	if err != nil {
		return errors.Join(runErr, err)
	}
	if len(final) == 1 {
		r.After = final[0]
	}
	errs := []error{runErr}
	if runErr == nil {
		switch {
		case res.Reconnected < res.Clients:
			errs = append(errs, fmt.Errorf("%d of %d clients had no watch %v after the storm: %v", res.Clients-res.Reconnected, res.Clients, stormGiveUp, res.FirstErrors))
		case res.WorstMillis > millis(StormBound):
			errs = append(errs, fmt.Errorf("the last client reconnected %.0fms after the storm, above %v", res.WorstMillis, StormBound))
		}
	}
	if r.After != holder {
		errs = append(errs, fmt.Errorf("the VIP moved from %s to %v during a reconnect storm", holder, final))
	}
	return errors.Join(errs...)
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
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The fields after the command name, which may hold spaces: state is
	// the first, utime and stime the 12th and 13th.
	i := bytes.LastIndexByte(b, ')')
	f := strings.Fields(string(b[i+1:]))
	if i < 0 || len(f) < 13 {
		return 0
	}
	var ut, st float64
	fmt.Sscan(f[11], &ut)
	fmt.Sscan(f[12], &st)
	return (ut + st) / 100 // USER_HZ
}
