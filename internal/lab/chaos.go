package lab

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/vigil-ha/vigil/internal/clock"
	"github.com/vigil-ha/vigil/internal/netfault"
)

// Chaos fault kinds: `vigil-lab chaos` injects them at random times, with
// random durations, into a running vigil lab and checks the VIP's
// invariants around each.
const (
	FaultKill           = "kill"             // power the holder off (link cut, every process SIGKILLed), later boot it
	FaultGraceful       = "graceful"         // SIGTERM the holder's vigil, later start it
	FaultPartition      = "partition"        // cut the holder's links, later plug them in
	FaultKillDaemon     = "kill-daemon"      // SIGKILL the holder's vigil only
	FaultKillEtcdLeader = "kill-etcd-leader" // SIGKILL the etcd raft leader
	FaultPause          = "pause"            // SIGSTOP the holder's vigil (not its guard)
	FaultFreeze         = "freeze"           // SIGSTOP the holder's vigil and its guard together
	FaultGuardStop      = "guard-stop"       // SIGSTOP the holder's guard, then 1-2.5 s later its vigil too
	FaultStrayVIP       = "stray-vip"        // add the VIP on a non-holder, as re-applied network config would
	FaultStrayPrefix    = "stray-prefix"     // the same with another prefix length (/32 beside a /24)
	FaultStrayLo        = "stray-lo"         // the same on lo, where Linux answers ARP for it on every interface
	FaultVIPLinkDown    = "vip-link-down"    // take the holder's VIP link down; etcd's stays up
	FaultFlap           = "flap"             // VIP link down and up again within a second
	FaultDuplicateName  = "duplicate-name"   // start a second vigil with the holder's node name on another node
	FaultImpostorEtcd   = "impostor-etcd"    // replace a non-holder's etcd member by a fresh one-member etcd at its address
	// Gray faults (gray.go): nothing dies.
	FaultLatency     = "latency"      // every etcd answer late by 100-700 ms (jitter up to 50 ms), to every client or one node
	FaultLoss        = "loss"         // drop 5-30 % of the packets on every path between the nodes
	FaultOneWay      = "one-way"      // the holder hears nothing from its peers, or they hear nothing from it
	FaultSlowProcess = "slow-process" // SIGSTOP/SIGCONT cycling of the holder's vigil or of an etcd member (a starved CPU)
)

// ChaosFaults lists every fault kind.
var ChaosFaults = []string{FaultKill, FaultGraceful, FaultPartition, FaultKillDaemon, FaultKillEtcdLeader,
	FaultPause, FaultFreeze, FaultGuardStop, FaultStrayVIP, FaultStrayPrefix, FaultStrayLo, FaultVIPLinkDown, FaultFlap, FaultDuplicateName,
	FaultImpostorEtcd, FaultLatency, FaultLoss, FaultOneWay, FaultSlowProcess}

// grayFaults are the kinds where nothing dies (gray.go).
var grayFaults = []string{FaultLatency, FaultLoss, FaultOneWay, FaultSlowProcess}

// DefaultFaults are the faults a chaos run on a lab built with s draws
// from: every kind, less the VIP link's faults in a lab without a VIP link
// (the routed lab, whose VIP sits on lo, where stray-lo is stray-vip).
func DefaultFaults(s Settings) []string {
	if s.VIPLink {
		return ChaosFaults
	}
	var fs []string
	for _, f := range ChaosFaults {
		if f != FaultVIPLinkDown && f != FaultFlap && f != FaultStrayLo {
			fs = append(fs, f)
		}
	}
	return fs
}

// Bounds the chaos run checks besides "never two holders".
const (
	// DefaultFreezeBound is how long two nodes may hold the VIP when vigil
	// and its guard are frozen together: nothing in user space runs on the
	// frozen node, and the kernel lifetime of the address (1 s, checked
	// with up to about a second of delay) is the only fence.
	DefaultFreezeBound = 1500 * time.Millisecond
	// strayBound is how long a stray VIP on a non-holder may live.
	strayBound = time.Second
	// thawBound is how long a thawed stale node may keep the VIP.
	thawBound = 100 * time.Millisecond
	// chaosSample is the address sampling interval on every node.
	chaosSample = 20 * time.Millisecond
	// chaosPostWatch is how long sampling goes on after the lab looks
	// healed, to catch a late second holder.
	chaosPostWatch = 500 * time.Millisecond
)

// ChaosConfig configures a chaos run.
type ChaosConfig struct {
	Duration time.Duration
	Seed     uint64
	// Faults to draw from; ChaosFaults when empty.
	Faults []string
	// MaxPause bounds pause durations (2 s up to this); 10 s when zero.
	MaxPause time.Duration
	// FreezeBound is the allowed dual-holder time of a freeze;
	// DefaultFreezeBound when zero.
	FreezeBound time.Duration
	// LogDir receives the nodes' logs of every fault that broke an
	// invariant, or whose outage exceeded SlowOutage.
	LogDir string
	// SlowOutage, when positive, also keeps the logs of faults whose outage
	// was longer (they break no invariant, but are worth a look).
	SlowOutage time.Duration
	// Progress, when set, is called after every fault.
	Progress func(FaultResult)
}

// FaultResult is one injected fault and what the invariants saw.
type FaultResult struct {
	N      int    `json:"n"`
	Kind   string `json:"kind"`
	Target string `json:"target"`
	Before string `json:"holderBefore"`
	After  string `json:"holderAfter"`
	// AtMillis is when the fault began, since the start of the run.
	AtMillis float64 `json:"atMillis"`
	// HeldMillis is how long the fault lasted before it was healed.
	HeldMillis float64 `json:"heldMillis"`
	// OutageMillis is the longest gap between the client's answers from
	// the VIP, from the fault until the lab was stable again.
	OutageMillis float64 `json:"outageMillis"`
	// DualSamples counts address samples (every node, every 20 ms) in which
	// two or more nodes had the VIP; DualMillis is the time they span.
	DualSamples int     `json:"dualSamples"`
	DualMillis  float64 `json:"dualMillis"`
	// NoHolderMillis is the time no live node had the VIP.
	NoHolderMillis float64 `json:"noHolderMillis"`
	// StrayGoneMillis (stray-vip) is how long the stray address lived.
	StrayGoneMillis float64 `json:"strayGoneMillis,omitempty"`
	// ThawDropMillis (freeze) is how long the thawed node kept the VIP;
	// -1 when it no longer had it at the thaw.
	ThawDropMillis float64 `json:"thawDropMillis,omitempty"`
	// Violations are the invariants this fault broke.
	Violations []string `json:"violations,omitempty"`
	// Detail says what a gray fault did (its latency, loss, direction or
	// duty cycle).
	Detail string `json:"detail,omitempty"`
	// Logs is where the nodes' logs of a failed fault were kept.
	Logs string `json:"logs,omitempty"`
}

// OK reports whether the fault broke no invariant.
func (r FaultResult) OK() bool { return len(r.Violations) == 0 }

func (r FaultResult) String() string {
	s := fmt.Sprintf("#%-4d %-16s %-3s held %6.0fms  %s -> %s  outage %6.0fms  no holder %6.0fms  dual-holder samples %d",
		r.N, r.Kind, r.Target, r.HeldMillis, orDash(r.Before), orDash(r.After), r.OutageMillis, r.NoHolderMillis, r.DualSamples)
	if r.DualMillis > 0 {
		s += fmt.Sprintf(" (%.0fms)", r.DualMillis)
	}
	if isStray(r.Kind) {
		s += fmt.Sprintf("  stray gone after %.1fms", r.StrayGoneMillis)
	}
	if r.Kind == FaultFreeze {
		if r.ThawDropMillis < 0 {
			s += "  VIP already gone at thaw"
		} else {
			s += fmt.Sprintf("  dropped %.1fms after thaw", r.ThawDropMillis)
		}
	}
	if r.Detail != "" {
		s += "  (" + r.Detail + ")"
	}
	if len(r.Violations) > 0 {
		s += "  VIOLATION: " + strings.Join(r.Violations, "; ")
	}
	if r.Logs != "" {
		s += "  (logs in " + r.Logs + ")"
	}
	return s
}

// Validate checks the configuration against the settings of the lab it is
// for, so that a command can refuse bad input before it builds a lab.
func (cfg ChaosConfig) Validate(s Settings) error {
	switch {
	case s.Impl != ImplVigil:
		return fmt.Errorf("lab: chaos needs a vigil lab (this one runs %s)", s.Impl)
	case s.Nodes < 2:
		return fmt.Errorf("lab: chaos needs at least 2 nodes, not %d", s.Nodes)
	case cfg.Duration <= 0:
		return fmt.Errorf("lab: chaos --duration %v must be positive", cfg.Duration)
	case cfg.MaxPause != 0 && cfg.MaxPause < 2*time.Second:
		return fmt.Errorf("lab: chaos --max-pause %v must be at least 2s (pauses last 2 s to --max-pause)", cfg.MaxPause)
	case cfg.FreezeBound < 0:
		return fmt.Errorf("lab: chaos --freeze-bound %v must not be negative", cfg.FreezeBound)
	}
	for _, f := range cfg.Faults {
		if !slices.Contains(ChaosFaults, f) {
			return fmt.Errorf("lab: unknown fault %q (one of %s)", f, strings.Join(ChaosFaults, ", "))
		}
		if (f == FaultVIPLinkDown || f == FaultFlap) && !s.VIPLink {
			return fmt.Errorf("lab: fault %s needs a lab built with --vip-link", f)
		}
	}
	faults := cfg.Faults
	if len(faults) == 0 {
		faults = DefaultFaults(s)
	}
	for _, f := range faults {
		if f == FaultLoss || f == FaultOneWay {
			return needNft("the " + f + " fault")
		}
	}
	return nil
}

// Chaos runs faults against the lab until cfg.Duration has passed, and
// returns every fault's result. The lab must be a vigil lab; link faults
// need one built with VIPLink. It stops early, with an error, only when the
// lab cannot be used at all; broken invariants are in the results.
func (l *Lab) Chaos(ctx context.Context, cfg ChaosConfig) ([]FaultResult, error) {
	if err := cfg.Validate(l.st.Settings); err != nil {
		return nil, err
	}
	if len(l.st.Nodes) < 2 {
		return nil, fmt.Errorf("lab: chaos needs at least 2 nodes")
	}
	if len(cfg.Faults) == 0 {
		cfg.Faults = DefaultFaults(l.st.Settings)
	}
	if cfg.MaxPause <= 0 {
		cfg.MaxPause = 10 * time.Second
	}
	if cfg.FreezeBound <= 0 {
		cfg.FreezeBound = DefaultFreezeBound
	}
	if _, err := l.waitStable(ctx, recoverTimeout); err != nil {
		return nil, fmt.Errorf("lab not stable before chaos: %w", err)
	}
	c, err := l.newChaos(cfg)
	if err != nil {
		return nil, err
	}
	defer c.close()

	start := time.Now()
	var (
		results []FaultResult
		order   []string
	)
	for n := 1; time.Since(start) < cfg.Duration && ctx.Err() == nil; n++ {
		if len(order) == 0 {
			order = slices.Clone(cfg.Faults)
			c.rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		}
		kind := order[0]
		order = order[1:]
		// A random phase against the holder's renewals and the lab's
		// timers: faults land anywhere in a renewal period.
		if !clock.Sleep(ctx, c.between(0, time.Second)) {
			break
		}
		r := c.fault(ctx, n, kind, start)
		results = append(results, r)
		if cfg.Progress != nil {
			cfg.Progress(r)
		}
	}
	return results, nil
}

// chaos is the state of one run.
type chaos struct {
	l   *Lab
	cfg ChaosConfig
	rng *rand.Rand
	d   *drillRun // dead nodes, inject and heal of the drill faults
	smp *sampler
	pr  *prober
}

func (l *Lab) newChaos(cfg ChaosConfig) (*chaos, error) {
	w, err := newVIPWatch(l.st.Nodes)
	if err != nil {
		return nil, err
	}
	d := &drillRun{l: l, dead: map[string]bool{}, w: w}
	smp, err := startSampler(l.st.Nodes, d.live, chaosSample)
	if err != nil {
		w.close()
		return nil, err
	}
	pr, err := startProber(probeInterval, l.st.Settings.vipAddr())
	if err != nil {
		smp.close()
		w.close()
		return nil, err
	}
	return &chaos{l: l, cfg: cfg, rng: rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15)), d: d, smp: smp, pr: pr}, nil
}

func (c *chaos) close() {
	c.pr.close()
	c.smp.close()
	c.d.w.close()
}

// between draws a duration in [lo, hi).
func (c *chaos) between(lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(c.rng.Int64N(int64(hi-lo)))
}

// other draws a node other than name.
func (c *chaos) other(name string) *Node {
	var out []*Node
	for _, n := range c.l.st.Nodes {
		if n.Name != name {
			out = append(out, n)
		}
	}
	return out[c.rng.IntN(len(out))]
}

// fault injects one fault, heals it, waits for the lab to be stable and
// judges the invariants over the whole episode.
func (c *chaos) fault(ctx context.Context, n int, kind string, runStart time.Time) FaultResult {
	r := FaultResult{N: n, Kind: kind}
	l := c.l
	// Every etcd member follows one leader again: a member still
	// catching up after the last fault (a one-way cut or loss leaves one
	// without a leader for seconds) makes the next fault that stops a
	// member a loss of quorum, two faults at once, where the holder must
	// step down. (The kubeadm lab's etcd is its own; chaos there waits
	// for the holder only.)
	if l.st.Settings.Impl == ImplVigil && !l.st.Settings.Kubeadm {
		if err := l.waitEtcdHealthy(ctx, recoverTimeout); err != nil {
			r.Violations = append(r.Violations, "etcd not healthy before the fault: "+err.Error())
			return r
		}
	}
	holder, err := l.waitStable(ctx, recoverTimeout)
	if err != nil {
		r.Violations = append(r.Violations, "no single holder before the fault: "+err.Error())
		return r
	}
	r.Before = holder
	target, err := l.node(holder)
	if err != nil {
		r.Violations = append(r.Violations, err.Error())
		return r
	}
	marks := l.logMarks()
	begin := time.Now()
	r.AtMillis = millis(begin.Sub(runStart))
	var ferr error
	switch kind {
	case FaultKill, FaultGraceful, FaultPartition, FaultKillDaemon, FaultKillEtcdLeader:
		target, ferr = c.drillFault(ctx, kind, target)
	case FaultPause:
		ferr = c.pause(ctx, target, false, c.between(2*time.Second, c.cfg.MaxPause), &r)
	case FaultFreeze:
		ferr = c.pause(ctx, target, true, c.between(500*time.Millisecond, 3*time.Second), &r)
	case FaultGuardStop:
		ferr = c.guardStop(ctx, target, c.between(time.Second, 2500*time.Millisecond), c.between(time.Second, 3*time.Second))
	case FaultStrayVIP, FaultStrayPrefix, FaultStrayLo:
		target = c.other(holder)
		ferr = c.stray(ctx, kind, target, &r)
	case FaultVIPLinkDown:
		ferr = c.linkDown(ctx, target, c.between(time.Second, 4*time.Second))
	case FaultFlap:
		ferr = c.linkDown(ctx, target, c.between(100*time.Millisecond, 900*time.Millisecond))
	case FaultDuplicateName:
		target = c.other(holder)
		ferr = c.duplicate(ctx, target, holder)
	case FaultImpostorEtcd:
		target = c.other(holder)
		var storeSlow time.Duration
		storeSlow, ferr = c.l.impostorEtcd(ctx, target, holder, c.between(3*time.Second, 8*time.Second))
		if storeSlow > 0 {
			c.l.log.Info("chaos: the VIP left its holder while etcd was slower than vigil's promise", "fault", kind, "slowest_write", storeSlow.Round(time.Millisecond))
		}
	case FaultLatency:
		ferr = c.latency(ctx, target, &r)
	case FaultLoss:
		ferr = c.loss(ctx, &r)
	case FaultOneWay:
		ferr = c.oneWay(ctx, target, &r)
	case FaultSlowProcess:
		target, ferr = c.slowProcess(ctx, target, &r)
	}
	r.Target = target.Name
	healed := time.Now()
	r.HeldMillis = millis(healed.Sub(begin))
	if ferr != nil {
		r.Violations = append(r.Violations, ferr.Error())
	}
	after, err := l.waitStable(ctx, recoverTimeout)
	if err != nil {
		r.Violations = append(r.Violations, "the fault ended without a single holder: "+err.Error())
	}
	r.After = after
	stable := time.Now()
	clock.Sleep(ctx, chaosPostWatch)

	samples := c.smp.between(begin, time.Now())
	dual, dualT, none := judgeSamples(samples)
	r.DualSamples, r.DualMillis, r.NoHolderMillis = dual, millis(dualT), millis(none)
	r.OutageMillis = millis(longestGap(c.pr.snapshot(), begin, stable))
	switch {
	case kind == FaultFreeze && dualT > c.cfg.FreezeBound:
		r.Violations = append(r.Violations, fmt.Sprintf("two holders for %.0fms while vigil and its guard were frozen, over the %v bound", millis(dualT), c.cfg.FreezeBound))
	case kind != FaultFreeze && dual > 0:
		r.Violations = append(r.Violations, fmt.Sprintf("%d address samples with two holders (%s)", dual, describeDual(samples)))
	}
	slow := c.cfg.SlowOutage > 0 && r.OutageMillis > millis(c.cfg.SlowOutage)
	if (!r.OK() || slow) && c.cfg.LogDir != "" {
		r.Logs = l.keepLogs(c.cfg.LogDir, fmt.Sprintf("fault-%03d-%s", n, kind), marks)
	}
	return r
}

// drillFault runs one of the drills' faults with a random duration.
func (c *chaos) drillFault(ctx context.Context, kind string, holder *Node) (*Node, error) {
	drill := map[string]string{
		FaultKill: DrillKillLeader, FaultGraceful: DrillGraceful, FaultPartition: DrillPartitionLeader,
		FaultKillDaemon: DrillKillDaemon, FaultKillEtcdLeader: DrillKillEtcdLeader,
	}[kind]
	hold := map[string][2]time.Duration{
		FaultKill: {time.Second, 3 * time.Second}, FaultGraceful: {200 * time.Millisecond, 2 * time.Second},
		FaultPartition: {time.Second, 5 * time.Second}, FaultKillDaemon: {200 * time.Millisecond, 2 * time.Second},
		FaultKillEtcdLeader: {time.Second, 3 * time.Second},
	}[kind]
	c.d.target = holder
	if kind == FaultKillEtcdLeader {
		t, err := c.l.etcdLeaderNotHolding(ctx, holder.Name)
		if err != nil {
			return holder, err
		}
		c.d.target = t
	}
	if err := c.d.inject(ctx, drill); err != nil {
		return c.d.target, fmt.Errorf("inject: %w", err)
	}
	clock.Sleep(ctx, c.between(hold[0], hold[1]))
	if err := c.d.heal(ctx, drill); err != nil {
		return c.d.target, fmt.Errorf("heal: %w", err)
	}
	return c.d.target, nil
}

// pause stops the node's vigil (and with freeze its guard too) for hold,
// then lets it go on. With freeze it measures how long the thawed node keeps
// the VIP.
func (c *chaos) pause(ctx context.Context, n *Node, freeze bool, hold time.Duration, r *FaultResult) error {
	pid := n.PIDs[roleVigil]
	if pid == 0 || !alive(pid) {
		return fmt.Errorf("vigil on %s is not running", n.Name)
	}
	pids := []int{pid}
	if freeze {
		pids = append(pids, childPIDs(pid)...)
		if len(pids) < 2 {
			return fmt.Errorf("vigil on %s has no guard process to freeze", n.Name)
		}
	}
	for _, p := range pids {
		if err := syscall.Kill(p, syscall.SIGSTOP); err != nil {
			return fmt.Errorf("stop %d on %s: %w", p, n.Name, err)
		}
	}
	clock.Sleep(ctx, hold)
	had, _ := c.d.w.has(n.Name)
	thaw := time.Now()
	for _, p := range pids {
		_ = syscall.Kill(p, syscall.SIGCONT) // a process that died meanwhile needs nothing
	}
	if !freeze {
		return nil
	}
	r.ThawDropMillis = -1
	if !had {
		return nil
	}
	gone, err := waitVIPGone(ctx, c.d.w, n.Name, 2*time.Second)
	if err != nil {
		return err
	}
	r.ThawDropMillis = millis(gone.Sub(thaw))
	if gone.Sub(thaw) > thawBound {
		return fmt.Errorf("the thawed node kept the VIP %.0fms, over %v", millis(gone.Sub(thaw)), thawBound)
	}
	return nil
}

// guardStop stops the holder's guard and, gap later, its vigil as well;
// both resume after hold. A stopped guard still has its pipe open, and
// vigil's writes land in the kernel's buffer: vigil must notice from the
// missing answers and give the VIP up before it is stopped itself, or two
// nodes hold the VIP until the kernel lifetime ends it (with --vip-lifetime
// 0, for as long as vigil is stopped). A gap shorter than the guard's
// answer bound (300 ms at the defaults) is the freeze fault, judged there.
func (c *chaos) guardStop(ctx context.Context, n *Node, gap, hold time.Duration) error {
	pid := n.PIDs[roleVigil]
	if pid == 0 || !alive(pid) {
		return fmt.Errorf("vigil on %s is not running", n.Name)
	}
	guards := childPIDs(pid)
	if len(guards) == 0 {
		return fmt.Errorf("vigil on %s has no guard process to stop", n.Name)
	}
	stopped := []int{}
	defer func() {
		for _, p := range stopped {
			_ = syscall.Kill(p, syscall.SIGCONT) // a process that died meanwhile needs nothing
		}
	}()
	for _, p := range guards {
		if err := syscall.Kill(p, syscall.SIGSTOP); err != nil {
			return fmt.Errorf("stop guard %d on %s: %w", p, n.Name, err)
		}
		stopped = append(stopped, p)
	}
	clock.Sleep(ctx, gap)
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		return fmt.Errorf("stop vigil %d on %s: %w", pid, n.Name, err)
	}
	stopped = append(stopped, pid)
	clock.Sleep(ctx, hold)
	return nil
}

// stray adds the VIP on a non-holder, as re-applied network config does,
// and measures how long it stays. The sampler leaves that node out until
// the address is gone: the stray is the fault, its lifetime is measured
// here.
func (c *chaos) stray(ctx context.Context, kind string, n *Node, r *FaultResult) error {
	c.smp.exclude(n.Name)
	defer c.smp.exclude("")
	// In dual-stack, either family's address: each alone is a stray.
	vips := c.l.st.Settings.vips()
	vip := vips[0]
	if len(vips) > 1 {
		vip = vips[c.rng.IntN(len(vips))]
	}
	form, dev := strayForm(kind, vip, c.l.st.Settings.vipIface())
	args := []string{"-n", nodeNS(n.Name), "addr", "add", form.String(), "dev", dev}
	if form.Addr().Is6() {
		args = append(args, "nodad") // usable at once, as the VIP would be
	}
	added := time.Now()
	if err := ip(ctx, args...); err != nil {
		return err
	}
	gone, err := waitVIPGone(ctx, c.d.w, n.Name, 5*time.Second)
	if err != nil {
		_ = c.d.w.flushVIP(n.Name)
		return fmt.Errorf("stray VIP on %s: %w", n.Name, err)
	}
	r.StrayGoneMillis = millis(gone.Sub(added))
	if gone.Sub(added) > strayBound {
		return fmt.Errorf("the stray VIP on %s lived %.0fms, over %v", n.Name, r.StrayGoneMillis, strayBound)
	}
	return nil
}

// isStray tells whether a fault kind adds the VIP on a non-holder.
func isStray(kind string) bool {
	return kind == FaultStrayVIP || kind == FaultStrayPrefix || kind == FaultStrayLo
}

// strayForm is the address and interface a stray fault of kind adds: the
// VIP as configured (stray-vip), with another prefix length (stray-prefix:
// the host's own /32 or /128 beside a wider VIP, a /24 or /64 beside a host
// one), or on lo (stray-lo).
func strayForm(kind string, vip netip.Prefix, iface string) (netip.Prefix, string) {
	switch kind {
	case FaultStrayPrefix:
		bits := vip.Addr().BitLen()
		if vip.Bits() == bits {
			bits -= 8
		}
		return netip.PrefixFrom(vip.Addr(), bits), iface
	case FaultStrayLo:
		return vip, "lo"
	}
	return vip, iface
}

// linkDown takes the node's VIP link down for hold, then up.
func (c *chaos) linkDown(ctx context.Context, n *Node, hold time.Duration) error {
	port := n.Name + vipPortSuffix
	if err := setPort(ctx, port, false); err != nil {
		return err
	}
	clock.Sleep(ctx, hold)
	return setPort(context.WithoutCancel(ctx), port, true)
}

// duplicate starts a second vigil with the holder's name on node n (a
// cloned VM) and checks that it refuses to run and never holds the VIP.
func (c *chaos) duplicate(ctx context.Context, n *Node, name string) error {
	s := c.l.st.Settings
	args := []string{"run"}
	for _, v := range s.vips() {
		args = append(args, "--vip", v.String())
	}
	args = append(args, "--interface", s.vipIface(), "--node-name", name,
		"--etcd-endpoints", strings.Join(c.l.etcdEndpoints(), ","), "--metrics-address", "")
	out, code, err := c.l.runWithTimeout(ctx, n, 15*time.Second, c.l.vigilBin, args...)
	switch {
	case err != nil:
		return fmt.Errorf("twin of %s on %s: %w", name, n.Name, err)
	case code == 0:
		return fmt.Errorf("twin of %s on %s exited 0; want a refusal", name, n.Name)
	case !strings.Contains(out, "node name"):
		return fmt.Errorf("twin of %s on %s failed without naming the duplicate node name: %s", name, n.Name, lastLine(out))
	}
	return nil
}

// judgeSamples counts samples with two or more holders and adds up the time
// spans with two holders and with none.
func judgeSamples(ss []sample) (dual int, dualT, none time.Duration) {
	for i, s := range ss {
		var span time.Duration
		if i+1 < len(ss) {
			span = ss[i+1].at.Sub(s.at)
		}
		switch len(s.holders) {
		case 0:
			none += span
		case 1:
		default:
			dual++
			dualT += span
		}
	}
	return dual, dualT, none
}

func describeDual(ss []sample) string {
	for _, s := range ss {
		if len(s.holders) > 1 {
			return "first " + strings.Join(s.holders, "+") + " at " + s.at.Format("15:04:05.000")
		}
	}
	return ""
}

// latency delays every etcd answer by 100-700 ms, with up to 50 ms of
// jitter, for 2-6 s: to every client, or (one time in three) to the holder
// alone.
func (c *chaos) latency(ctx context.Context, holder *Node, r *FaultResult) error {
	d := netfault.Delay{Latency: c.between(100*time.Millisecond, 700*time.Millisecond).Round(time.Millisecond),
		Jitter: c.between(0, 50*time.Millisecond).Round(time.Millisecond)}
	r.Detail = fmt.Sprintf("etcd answers +%v, jitter %v", d.Latency, d.Jitter)
	if c.rng.IntN(3) == 0 {
		d.From = []netip.Addr{holder.IP}
		r.Detail += ", to the holder only"
	}
	if err := c.l.SetEtcdLatency(ctx, nil, d); err != nil {
		return err
	}
	clock.Sleep(ctx, c.between(2*time.Second, 6*time.Second))
	return c.l.SetEtcdLatency(context.WithoutCancel(ctx), nil, netfault.Delay{})
}

// loss drops 5-30 % of the packets on every path between the nodes, both
// ways, for 2-6 s.
func (c *chaos) loss(ctx context.Context, r *FaultResult) error {
	pct := 5 + c.rng.IntN(26)
	r.Detail = fmt.Sprintf("%d%% loss on every path", pct)
	defer func() { _ = c.l.ClearGray(context.WithoutCancel(ctx)) }()
	for _, n := range c.l.st.Nodes {
		// On input only: each packet is dropped once, by its receiver.
		if err := c.l.SetLoss(ctx, Loss{Node: n.Name, Pct: pct, Dir: DirIn}); err != nil {
			return err
		}
	}
	clock.Sleep(ctx, c.between(2*time.Second, 6*time.Second))
	return nil
}

// oneWay cuts one direction between the holder and its peers for 1-5 s.
func (c *chaos) oneWay(ctx context.Context, holder *Node, r *FaultResult) error {
	dir := DirIn
	if c.rng.IntN(2) == 0 {
		dir = DirOut
	}
	r.Detail = "holder's " + dir + "bound traffic to its peers dropped"
	defer func() { _ = c.l.ClearGray(context.WithoutCancel(ctx), holder.Name) }()
	if err := c.l.SetOneWay(ctx, holder.Name, dir, nil); err != nil {
		return err
	}
	clock.Sleep(ctx, c.between(time.Second, 5*time.Second))
	return nil
}

// slowProcess starves the holder's vigil (its guard runs on) or a random
// node's etcd for 2-6 s: stopped 20-150 ms, running 20-100 ms, over and
// over.
func (c *chaos) slowProcess(ctx context.Context, holder *Node, r *FaultResult) (*Node, error) {
	target, role := holder, roleVigil
	if c.rng.IntN(2) == 0 {
		target, role = c.l.st.Nodes[c.rng.IntN(len(c.l.st.Nodes))], roleEtcd
	}
	stop := c.between(20*time.Millisecond, 150*time.Millisecond).Round(time.Millisecond)
	run := c.between(20*time.Millisecond, 100*time.Millisecond).Round(time.Millisecond)
	r.Detail = fmt.Sprintf("%s stopped %v, running %v", role, stop, run)
	return target, SlowProcess(ctx, target.PIDs[role], stop, run, c.between(2*time.Second, 6*time.Second))
}
