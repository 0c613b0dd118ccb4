package lab

import (
	"bufio"
	"context"
	_ "embed"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/vigil-ha/vigil/internal/clock"
)

// The load balancer benchmark runs on a lab built with
//
//	vigil-lab up --lb-port 7443 --backend-port 7000 --health-port 6443
//
// so vigil balances VIP:7443 over every node's bench backend (port 7000) and
// health-checks the stand-in API server next to it (6443). HAProxy runs on
// the VIP holder with kubeadm's recommended configuration on VIP:8443 over
// the same backends. The client namespace drives both, and each node's
// backend directly as the baseline.
const (
	BenchVigilPort   = 7443
	BenchHAProxyPort = 8443
	roleHAProxy      = "haproxy"
)

// LBBenchConfig configures a benchmark run.
type LBBenchConfig struct {
	Rounds    int
	Duration  time.Duration // of each conns and throughput measurement
	Workers   int           // parallel clients for conns
	Streams   int           // parallel connections for throughput
	Samples   int           // rtt and connect samples
	Ejections int
	// Flood, when not 0, ends the run with that many connection attempts
	// from FloodSources source addresses through vigil's balancer (see
	// FloodResult).
	Flood int
	// FloodSources is how many source addresses the flood comes from
	// (default 1): one meets the per-source limit; more than
	// --lb-max-conns / --lb-max-conns-per-source meet the total limit.
	FloodSources int
}

// MaxFloodSources bounds --flood-sources: the flood's addresses run from
// 10.250.0.3 up, below the first node's.
const MaxFloodSources = 8

// Validate refuses a configuration that cannot measure anything, before
// the lab is touched.
func (c LBBenchConfig) Validate() error {
	switch {
	case c.Rounds < 0 || c.Ejections < 0 || c.Flood < 0:
		return fmt.Errorf("lab: --rounds %d, --ejections %d and --flood %d must not be negative", c.Rounds, c.Ejections, c.Flood)
	case c.FloodSources < 1 || c.FloodSources > MaxFloodSources:
		return fmt.Errorf("lab: --flood-sources %d must be 1 to %d", c.FloodSources, MaxFloodSources)
	case c.Duration <= 0:
		return fmt.Errorf("lab: --duration %v must be positive", c.Duration)
	case c.Workers < 1 || c.Streams < 1 || c.Samples < 1:
		return fmt.Errorf("lab: --workers %d, --streams %d and --samples %d must be at least 1", c.Workers, c.Streams, c.Samples)
	}
	return nil
}

// LBBenchResult is a whole run.
type LBBenchResult struct {
	Config    LBBenchConfig `json:"config"`
	Holder    string        `json:"holder"`
	Loads     []LoadResult  `json:"loads"`
	Ejections []Ejection    `json:"ejections"`
	Flood     *FloodResult  `json:"flood,omitempty"`
	// SchedGroups is the scheduler autogroup (/proc/PID/autogroup) of
	// vigil, HAProxy and the load generator, where the kernel has them.
	SchedGroups map[string]string `json:"schedGroups,omitempty"`
}

// Where the kernel groups tasks by session for CPU fairness
// (sched_autogroup_enabled), a process sharing the load generator's group
// gets more CPU than one alone in its own when the cores are saturated:
// HAProxy moved 1.4 times the bytes that way (bench/lb/results/
// 20261203-202022-autogroup/NOTE). The lab starts vigil and HAProxy each in
// a session of its own; checkSchedGroups refuses a run where that is not so.
func checkSchedGroups(g map[string]string) error {
	v, h, lg := g["vigil"], g[roleHAProxy], g["loadgen"]
	if v == "" || h == "" || lg == "" {
		return nil // no autogroups in this kernel
	}
	if v == h || v == lg || h == lg {
		return fmt.Errorf("lab: the balancers must each have a scheduler group of their own, apart from the load generator's, for a fair comparison; they have vigil %s, haproxy %s, load generator %s", v, h, lg)
	}
	return nil
}

// schedGroup is a process's autogroup, "" if the kernel has none.
func schedGroup(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/autogroup", pid))
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return ""
	}
	return f[0]
}

// FloodResult is a flood of connections from one or more source addresses
// through vigil's balancer, while another client keeps connecting from its
// own address: the flooder's connections beyond the per-source limit (or
// the total one) must be reset, the other client must keep being served,
// and the VIP must stay on its holder the whole time, with that holder's
// memory bounded.
type FloodResult struct {
	Source string     `json:"source"` // comma-separated when several
	Flood  LoadResult `json:"flood"`
	// Other is the other client's new connections (connect mode) during
	// the flood.
	Other  LoadResult `json:"other"`
	Holder string     `json:"holder"`
	// VIPSamples counts samples of every node's addresses every 20 ms;
	// NotOnHolder those in which the VIP was anywhere but only on Holder.
	VIPSamples  int `json:"vipSamples"`
	NotOnHolder int `json:"notOnHolder"`
	// HolderRSSMiB is the largest resident set of the holder's vigil seen
	// during the flood, sampled every 200 ms; HolderRSSBeforeMiB before it.
	HolderRSSBeforeMiB float64 `json:"holderRSSBeforeMiB"`
	HolderRSSMiB       float64 `json:"holderRSSMiB"`
}

// floodSource returns the i-th (0-based) address the client namespace
// floods from: 10.250.0.3 onward.
func floodSource(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 250, 0, byte(3 + i)}) }

// addClientSources gives the client namespace the first n floodSource
// addresses and returns them; remove takes back those it added, also when
// it fails.
func addClientSources(ctx context.Context, n int) (srcs []string, remove func(), err error) {
	var added []string
	remove = func() {
		for _, a := range added {
			_ = ip(context.Background(), "-n", clientNS, "addr", "del", a, "dev", nodeIface)
		}
	}
	for i := range n {
		src := floodSource(i)
		addr := fmt.Sprintf("%s/%d", src, subnetBits)
		if err := ip(ctx, "-n", clientNS, "addr", "add", addr, "dev", nodeIface); err != nil {
			return srcs, remove, err
		}
		added = append(added, addr)
		srcs = append(srcs, src.String())
	}
	return srcs, remove, nil
}

// floodHold is how long the flooder keeps what was accepted after its last
// attempt; floodOther is how long the other client keeps connecting.
const (
	floodHold  = 5 * time.Second
	floodOther = 15 * time.Second
)

func (l *Lab) floodOnce(ctx context.Context, holder string, attempts, sources int) (*FloodResult, error) {
	res := &FloodResult{Holder: holder}
	h, err := l.node(holder)
	if err != nil {
		return nil, err
	}
	srcs, removeSources, err := addClientSources(ctx, sources)
	defer removeSources()
	if err != nil {
		return nil, err
	}
	res.Source = strings.Join(srcs, ",")
	w, err := newVIPWatch(l.st.Nodes)
	if err != nil {
		return nil, err
	}
	defer w.close()
	res.HolderRSSBeforeMiB = rssMiB(h.PIDs[roleVigil])
	sctx, stop := context.WithCancel(ctx)
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for i := 0; ; i++ {
			hs, err := w.holders(l.st.Nodes)
			res.VIPSamples++
			if err != nil || len(hs) != 1 || hs[0] != holder {
				res.NotOnHolder++
			}
			if i%10 == 0 {
				res.HolderRSSMiB = max(res.HolderRSSMiB, rssMiB(h.PIDs[roleVigil]))
			}
			select {
			case <-sctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	target := fmt.Sprintf("%s:%d", VIP.Addr(), BenchVigilPort)
	other := make(chan error, 1)
	go func() {
		var err error
		res.Other, err = l.runLoad(ctx, LoadConfig{Mode: LoadConnect, Target: target, Duration: floodOther})
		other <- err
	}()
	res.Flood, err = l.runLoad(ctx, LoadConfig{Mode: LoadFlood, Target: target, Samples: attempts, Workers: 64, Duration: floodHold, Source: res.Source})
	oerr := <-other
	stop()
	<-sampled
	if err != nil {
		return res, fmt.Errorf("flood: %w", err)
	}
	if oerr != nil {
		return res, fmt.Errorf("the other client: %w", oerr)
	}
	return res, nil
}

// rssMiB is a process's resident set in MiB, or 0 if it cannot be read.
func rssMiB(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "VmRSS:" {
			var kb float64
			fmt.Sscan(f[1], &kb)
			return kb / 1024
		}
	}
	return 0
}

// Ejection is one killed backend as both balancers saw it.
type Ejection struct {
	Backend             string  `json:"backend"`
	VigilMillis         float64 `json:"vigilMillis"`
	HAProxyMillis       float64 `json:"haproxyMillis"`
	VigilClientErrors   int     `json:"vigilClientErrors"`
	HAProxyClientErrors int     `json:"haproxyClientErrors"`
	VigilConns          int     `json:"vigilConns"`
	HAProxyConns        int     `json:"haproxyConns"`
}

// haproxyTemplate is shared with bench/lb/cpu.sh, so both benchmarks run
// the same HAProxy.
//
//go:embed haproxy.cfg
var haproxyTemplate string

// haproxyConf is kubeadm's recommended haproxy.cfg (kubeadm's
// docs/ha-considerations.md), with the bench's addresses, a health-check
// port next to the backend port (the bench backends are plain TCP, the API
// server stand-in beside them speaks TLS), a stats socket to read server
// state, and without syslog (there is none in the lab; this only spares
// HAProxy work). Note that in the recipe option ssl-hello-chk replaces the
// httpchk before it: HAProxy checks with a TLS hello, every 2 s, 3 failures
// to go down.
func (l *Lab) haproxyConf(statsSock string) string {
	var servers []string
	for _, n := range l.st.Nodes {
		servers = append(servers, fmt.Sprintf("    server %s %s:%d check port %d", n.Name, n.IP, BulkPort, APIServerPort))
	}
	return strings.NewReplacer(
		"@STATS_SOCKET@", statsSock,
		"@BIND@", fmt.Sprintf("%s:%d", VIP.Addr(), BenchHAProxyPort),
		"@SERVERS@", strings.Join(servers, "\n"),
	).Replace(haproxyTemplate)
}

// BenchLB runs the load balancer benchmark.
func (l *Lab) BenchLB(ctx context.Context, cfg LBBenchConfig, progress io.Writer) (LBBenchResult, error) {
	res := LBBenchResult{Config: cfg}
	if err := cfg.Validate(); err != nil {
		return res, err
	}
	s := l.st.Settings
	if s.Impl != ImplVigil || s.LBPort != BenchVigilPort || s.BackendPort != BulkPort || s.HealthPort != APIServerPort {
		return res, fmt.Errorf("lab: the benchmark needs vigil-lab up --lb-port %d --backend-port %d --health-port %d", BenchVigilPort, BulkPort, APIServerPort)
	}
	if _, err := exec.LookPath("haproxy"); err != nil {
		return res, errors.New("lab: haproxy is not installed (apt-get install haproxy)")
	}
	holder, err := l.waitStable(ctx, recoverTimeout)
	if err != nil {
		return res, err
	}
	res.Holder = holder
	h, _ := l.node(holder)
	sock := filepath.Join(l.nodeDir(h), "haproxy.sock")
	conf := filepath.Join(l.nodeDir(h), "haproxy.cfg")
	if err := os.WriteFile(conf, []byte(l.haproxyConf(sock)), 0o644); err != nil {
		return res, err
	}
	if err := l.start(h, roleHAProxy, "haproxy", "-f", conf, "-db"); err != nil {
		return res, err
	}
	defer func() { _ = l.signal(context.Background(), h, roleHAProxy, syscall.SIGKILL, 5*time.Second) }()
	if err := l.waitBenchBackendsUp(ctx, holder, sock, "", 30*time.Second); err != nil {
		return res, err
	}
	// The load generator runs as this process's child, in its session.
	res.SchedGroups = map[string]string{"vigil": schedGroup(h.PIDs[roleVigil]), roleHAProxy: schedGroup(h.PIDs[roleHAProxy]), "loadgen": schedGroup(os.Getpid())}
	if err := checkSchedGroups(res.SchedGroups); err != nil {
		return res, err
	}

	direct := fmt.Sprintf("%s:%d", l.otherNode(holder).IP, BulkPort)
	targets := map[string]string{
		"direct":  direct,
		"vigil":   fmt.Sprintf("%s:%d", VIP.Addr(), BenchVigilPort),
		"haproxy": fmt.Sprintf("%s:%d", VIP.Addr(), BenchHAProxyPort),
	}
	order := []string{"direct", "vigil", "haproxy"}
	for round := range cfg.Rounds {
		for i := range order {
			name := order[(i+round)%len(order)] // rotate: no target always goes first
			for _, lc := range []LoadConfig{
				{Mode: LoadRTT, Samples: cfg.Samples},
				{Mode: LoadConnect, Samples: cfg.Samples},
				{Mode: LoadConns, Duration: cfg.Duration, Workers: cfg.Workers},
				{Mode: LoadThroughput, Duration: cfg.Duration, Workers: cfg.Streams},
			} {
				lc.Target = targets[name]
				r, err := l.runLoad(ctx, lc)
				if err != nil {
					return res, fmt.Errorf("%s %s: %w", name, lc.Mode, err)
				}
				r.Target = name
				res.Loads = append(res.Loads, r)
				fmt.Fprintf(progress, "round %d  %-8s %-10s count %6d errors %3d  p50 %8.1fus  p99 %8.1fus  per-second %9.1f\n",
					round+1, name, r.Mode, r.Count, r.Errors, r.P50us, r.P99us, r.PerSecond)
			}
		}
	}
	for i := range cfg.Ejections {
		e, err := l.ejectOnce(ctx, holder, sock, targets)
		if err != nil {
			return res, fmt.Errorf("ejection %d: %w", i+1, err)
		}
		res.Ejections = append(res.Ejections, e)
		fmt.Fprintf(progress, "ejection %d  %s  vigil %6.0fms (%d client errors of %d)  haproxy %6.0fms (%d client errors of %d)\n",
			i+1, e.Backend, e.VigilMillis, e.VigilClientErrors, e.VigilConns, e.HAProxyMillis, e.HAProxyClientErrors, e.HAProxyConns)
	}
	if cfg.Flood > 0 {
		f, err := l.floodOnce(ctx, holder, cfg.Flood, cfg.FloodSources)
		if err != nil {
			return res, err
		}
		res.Flood = f
		fmt.Fprintf(progress, "flood  %d attempts from %s at %.0f/s: %d held to the end, %d reset, %d dial errors; other client %d connections, %d errors, p50 %.0fus p99 %.0fus; VIP not only on %s in %d of %d samples; holder RSS %.1f -> max %.1f MiB\n",
			f.Flood.Count, f.Source, f.Flood.PerSecond, f.Flood.Held, f.Flood.Refused, f.Flood.Errors,
			f.Other.Count, f.Other.Errors, f.Other.P50us, f.Other.P99us, holder, f.NotOnHolder, f.VIPSamples, f.HolderRSSBeforeMiB, f.HolderRSSMiB)
	}
	return res, nil
}

// otherNode returns a node that is not name.
func (l *Lab) otherNode(name string) *Node {
	for _, n := range l.st.Nodes {
		if n.Name != name {
			return n
		}
	}
	return l.st.Nodes[0]
}

// runLoad runs the load generator inside the client namespace.
func (l *Lab) runLoad(ctx context.Context, lc LoadConfig) (LoadResult, error) {
	var r LoadResult
	out, err := exec.CommandContext(ctx, "ip", "netns", "exec", clientNS, l.selfBin, "loadgen",
		"--mode", lc.Mode, "--target", lc.Target, "--duration", lc.Duration.String(),
		"--samples", itoa(lc.Samples), "--workers", itoa(lc.Workers), "--source", lc.Source).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return r, fmt.Errorf("loadgen: %w: %s", err, strings.TrimSpace(string(ee.Stderr)))
		}
		return r, fmt.Errorf("loadgen: %w", err)
	}
	return r, json.Unmarshal(out, &r)
}

// ejectOnce SIGKILLs the stand-in (API server and bench backend) on a node
// that does not hold the VIP while clients connect through both balancers,
// measures when each balancer stops using it, then restarts it.
func (l *Lab) ejectOnce(ctx context.Context, holder, sock string, targets map[string]string) (Ejection, error) {
	victim := l.otherNode(holder)
	backend := fmt.Sprintf("%s:%d", victim.IP, BulkPort)
	e := Ejection{Backend: backend}
	type loadOut struct {
		r   LoadResult
		err error
	}
	loads := map[string]chan loadOut{}
	for _, name := range []string{"vigil", "haproxy"} {
		ch := make(chan loadOut, 1)
		loads[name] = ch
		go func() {
			r, err := l.runLoad(ctx, LoadConfig{Mode: LoadConns, Target: targets[name], Duration: 8 * time.Second, Workers: 1})
			ch <- loadOut{r, err}
		}()
	}
	if !clock.Sleep(ctx, time.Second) {
		return e, ctx.Err()
	}
	kill := time.Now()
	if err := l.signal(ctx, victim, roleAPIServer, syscall.SIGKILL, 5*time.Second); err != nil {
		return e, err
	}
	vigilDown, haproxyDown := time.Time{}, time.Time{}
	deadline := kill.Add(30 * time.Second)
	for (vigilDown.IsZero() || haproxyDown.IsZero()) && time.Now().Before(deadline) {
		if vigilDown.IsZero() {
			if st, err := l.vigilBackendState(ctx, holder, backend); err == nil && st == "down" {
				vigilDown = time.Now()
			}
		}
		if haproxyDown.IsZero() {
			if st, err := haproxyServerState(sock, victim.Name); err == nil && strings.HasPrefix(st, "DOWN") {
				haproxyDown = time.Now()
			}
		}
		if !clock.Sleep(ctx, 10*time.Millisecond) {
			return e, ctx.Err()
		}
	}
	if vigilDown.IsZero() || haproxyDown.IsZero() {
		return e, fmt.Errorf("a balancer did not eject %s within 30s (vigil %v, haproxy %v)", backend, !vigilDown.IsZero(), !haproxyDown.IsZero())
	}
	e.VigilMillis, e.HAProxyMillis = millis(vigilDown.Sub(kill)), millis(haproxyDown.Sub(kill))
	for name, ch := range loads {
		o := <-ch
		if o.err != nil {
			return e, o.err
		}
		if name == "vigil" {
			e.VigilClientErrors, e.VigilConns = o.r.Errors, o.r.Count
		} else {
			e.HAProxyClientErrors, e.HAProxyConns = o.r.Errors, o.r.Count
		}
	}
	if err := l.startAPIServer(victim); err != nil {
		return e, err
	}
	return e, l.waitBenchBackendsUp(ctx, holder, sock, backend, 30*time.Second)
}

// waitBenchBackendsUp waits until both balancers use every backend.
func (l *Lab) waitBenchBackendsUp(ctx context.Context, holder, sock, _ string, d time.Duration) error {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		ok := l.waitBackendsUp(ctx, holder, len(l.st.Nodes), 10*time.Millisecond) == nil
		for _, n := range l.st.Nodes {
			st, err := haproxyServerState(sock, n.Name)
			ok = ok && err == nil && strings.HasPrefix(st, "UP") && !strings.Contains(st, "going down")
		}
		if ok {
			return nil
		}
		if !clock.Sleep(ctx, 100*time.Millisecond) {
			return ctx.Err()
		}
	}
	return fmt.Errorf("lab: not every backend is up in both balancers after %v", d)
}

func (l *Lab) vigilBackendState(ctx context.Context, node, backend string) (string, error) {
	rep, err := l.vigilStatus(ctx, node)
	if err != nil {
		return "", err
	}
	for _, b := range rep.Backends {
		if b.Address == backend {
			return b.State, nil
		}
	}
	return "", fmt.Errorf("vigil on %s does not know %s", node, backend)
}

// haproxyServerState reads a server's status ("UP", "DOWN", "UP 1/3"...)
// from HAProxy's stats socket.
func haproxyServerState(sock, server string) (string, error) {
	c, err := net.DialTimeout("unix", sock, time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := io.WriteString(c, "show stat\n"); err != nil {
		return "", err
	}
	r := csv.NewReader(bufio.NewReader(c))
	r.FieldsPerRecord = -1
	recs, err := r.ReadAll()
	if err != nil {
		return "", err
	}
	status := -1
	for _, rec := range recs {
		if len(rec) > 0 && strings.HasPrefix(rec[0], "# ") {
			rec[0] = strings.TrimPrefix(rec[0], "# ")
			status = slices.Index(rec, "status")
			continue
		}
		if status >= 0 && len(rec) > status && rec[0] == "apiserverbackend" && rec[1] == server {
			return rec[status], nil
		}
	}
	return "", fmt.Errorf("haproxy: no server %s", server)
}
