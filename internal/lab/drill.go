package lab

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vigil-ha/vigil/internal/clock"
)

// Drill kinds.
const (
	DrillKillLeader      = "kill-leader"      // cut the holder's port, SIGKILL its processes
	DrillGraceful        = "graceful"         // SIGTERM the holder's daemon
	DrillPartitionLeader = "partition-leader" // cut the holder's port, leave it running
	DrillKillEtcdLeader  = "kill-etcd-leader" // SIGKILL the etcd raft leader (not the holder)
	DrillKillDaemon      = "kill-daemon"      // SIGKILL the holder's vigil or keepalived; the node stays up
	DrillImpostorEtcd    = "impostor-etcd"    // a fresh one-member etcd at a non-holder's member address (impostor.go)
	probeInterval        = 10 * time.Millisecond
	// settle is how long one node must have answered without a gap before
	// the lab calls the VIP recovered.
	settle = time.Second
	// postHealWatch is how long probing goes on after the lab looks healed.
	// VRRP preemption happens within three adverts (3 s with kubeadm's
	// keepalived settings), so this covers it.
	postHealWatch = 3500 * time.Millisecond
	// recoverTimeout bounds the wait for a new holder; far above any
	// failover a working system shows.
	recoverTimeout = 30 * time.Second
)

// Drills lists the drill kinds.
var Drills = []string{DrillKillLeader, DrillGraceful, DrillHandoff, DrillPartitionLeader, DrillKillEtcdLeader, DrillKillDaemon, DrillImpostorEtcd, DrillAPIServerDown, DrillAPIServerSlow, DrillBackendPaused, DrillBackendKilled, DrillReconnectStorm, DrillReplaceNode, DrillReplaceHealthy, DrillScale, DrillScaleWorkers, DrillPruneOneSided, DrillPruneColdStart, DrillPruneRealDeath, DrillPruneClientPort, DrillRecover, DrillKubeadmVigilKilled, DrillKubeadmVigilOOM, DrillKubeadmVigilRestart, DrillKubeadmCertsRenew, DrillKubeadmReplace, DrillKubeadmRecover, DrillKubeadmLease, DrillECMPNodeKilled, DrillPrometheus, DrillRollingUpgrade}

// MembershipDrills lists the drills that change the lab's membership (they
// leave it with new nodes), and with --prune-after the prune drills; vigil
// labs only.
func MembershipDrills(s Settings) []string {
	if s.Impl != ImplVigil || s.Kubeadm {
		return nil
	}
	out := []string{DrillScale, DrillReplaceHealthy, DrillReplaceNode, DrillScaleWorkers}
	if s.PruneAfter > 0 {
		out = append(out, PruneDrills...)
	}
	return append(out, DrillRecover)
}

// failoverDrills are the drills every implementation can run.
var failoverDrills = []string{DrillKillLeader, DrillGraceful, DrillPartitionLeader, DrillKillDaemon}

// DrillsFor lists the drills that apply to a lab: without etcd there is no
// etcd leader to kill, and without vigil's load balancer no API server
// drill.
func DrillsFor(s Settings) []string {
	if s.Kubeadm {
		return KubeadmDrills
	}
	if s.ecmp() {
		return []string{DrillECMPNodeKilled}
	}
	if s.Impl != ImplVigil {
		return failoverDrills
	}
	out := []string{DrillKillLeader, DrillGraceful, DrillHandoff, DrillPartitionLeader, DrillKillEtcdLeader, DrillKillDaemon, DrillImpostorEtcd}
	// The API server and watch drills go through the IPv4 VIP.
	if s.LBPort != 0 && (s.BackendPort == 0 || s.BackendPort == APIServerPort) && !s.kube() && s.has4() {
		out = append(out, DrillAPIServerDown, DrillAPIServerSlow, DrillBackendPaused, DrillBackendKilled)
		if s.stormFits() {
			out = append(out, DrillReconnectStorm)
		}
	}
	return out
}

// Result is one drill's outcome.
type Result struct {
	Drill string `json:"drill"`
	Impl  string `json:"impl"`
	Run   int    `json:"run"`
	// Target is the node the fault hit.
	Target string `json:"target"`
	// Before and After are the nodes that answered on the VIP before the
	// fault and once it recovered.
	Before string `json:"before"`
	After  string `json:"after"`
	// OutageMillis is the longest gap between two answers from the VIP,
	// from the last answer before the fault to recovery (probes every 10 ms,
	// so a drill without outage shows about 10).
	OutageMillis float64 `json:"outageMillis"`
	// HealOutageMillis is the longest gap while the failed node came back.
	HealOutageMillis float64 `json:"healOutageMillis"`
	// SplitBrain is set when two live nodes had the VIP at once, or two
	// nodes answered on it in turn within a second.
	SplitBrain       bool     `json:"splitBrain"`
	SplitDetail      string   `json:"splitDetail,omitempty"`
	HoldersAfterHeal []string `json:"holdersAfterHeal"`
	// LateReplies are probe replies that arrived after the reply to a
	// later probe (held in a cut-off node's ARP queue until its link came
	// back); they are not counted as answers.
	LateReplies int `json:"lateReplies,omitempty"`
	// API is set by the API server drills.
	API *APIResult `json:"api,omitempty"`
	// Watch is set by the watch drills (backend-paused, backend-killed).
	Watch *WatchResult `json:"watch,omitempty"`
	// Storm is set by reconnect-storm.
	Storm *StormResult `json:"storm,omitempty"`
	// Phases are the timed steps of multi-step drills (replace-node).
	Phases []Phase `json:"phases,omitempty"`
	// Workers is set by scale-workers-unaffected.
	Workers []WorkerResult `json:"workers,omitempty"`
	// Prune is set by the prune drills.
	Prune *PruneResult `json:"prune,omitempty"`
	// Recovery is set by the recover drill.
	Recovery *RecoveryResult `json:"recovery,omitempty"`
	// Kubeadm is set by the kubeadm lab's drills.
	Kubeadm *KubeadmResult `json:"kubeadm,omitempty"`
	// Handoff is set by the handoff drill.
	Handoff *HandoffResult `json:"handoff,omitempty"`
	// ECMP is set by ecmp-node-killed.
	ECMP *ECMPResult `json:"ecmp,omitempty"`
	// Prometheus is set by the prometheus drill.
	Prometheus *PromResult `json:"prometheus,omitempty"`
	// Families is the outage of each VIP address, in labs with IPv6
	// (OutageMillis is then the longest of them).
	Families []FamilyResult `json:"families,omitempty"`
	// SkewMillis, in a dual-stack lab, is how far apart the two families
	// switched to the new holder.
	SkewMillis float64 `json:"skewMillis,omitempty"`
	// StoreSlowMillis, in a drill that promises the VIP stays put, is the
	// slowest write through etcd under way when the VIP left its holder:
	// vigil promises no move only while etcd answers within 400 ms, and a
	// holder steps down when it cannot renew (see storePromise).
	StoreSlowMillis float64 `json:"storeSlowMillis,omitempty"`
	Error           string  `json:"error,omitempty"`
}

// FamilyResult is one VIP address's view of a drill.
type FamilyResult struct {
	Family       string  `json:"family"`
	VIP          string  `json:"vip"`
	OutageMillis float64 `json:"outageMillis"`
	// SwitchedMillis is when the node that answered after recovery first
	// answered on this address, counted from the fault.
	SwitchedMillis float64 `json:"switchedMillis"`
	After          string  `json:"after"`
}

func (f FamilyResult) String() string {
	return fmt.Sprintf("%s outage %.0fms (answered by %s from %+.0fms)", f.Family, f.OutageMillis, orDash(f.After), f.SwitchedMillis)
}

// OK reports whether the drill ended well: no error, no split brain, one
// holder after the heal.
func (r Result) OK() bool {
	for _, w := range r.Workers {
		if !w.ok() {
			return false
		}
	}
	if r.ECMP != nil { // every node carries the VIP by design
		return r.Error == "" && r.ECMP.ok()
	}
	return r.Error == "" && !r.SplitBrain && len(r.HoldersAfterHeal) == 1
}

func (r Result) String() string {
	s := fmt.Sprintf("%-17s #%-3d outage %7.0fms  %s -> %s  heal-outage %5.0fms  split-brain: %-3s holder after heal: %s",
		r.Drill, r.Run, r.OutageMillis, orDash(r.Before), orDash(r.After), r.HealOutageMillis, yesNo(r.SplitBrain), strings.Join(r.HoldersAfterHeal, ","))
	if len(r.Phases) > 0 {
		var ps []string
		for _, p := range r.Phases {
			ps = append(ps, fmt.Sprintf("%s %.0fms", p.Name, p.Millis))
		}
		s = fmt.Sprintf("%-17s #%-3d client outage %5.0fms  %s -> %s  split-brain: %s  phases: %s",
			r.Drill, r.Run, r.OutageMillis, orDash(r.Before), orDash(r.After), yesNo(r.SplitBrain), strings.Join(ps, ", "))
	}
	if a := r.API; a != nil {
		s = fmt.Sprintf("%-17s #%-3d VIP moved after %5.0fms (bound %.0fms)  %s -> %s  requests %d, failed %d in the move window, %d outside; longest without an answer %.0fms  split-brain: %s",
			r.Drill, r.Run, a.MovedAfterMillis, a.BoundMillis, orDash(r.Before), orDash(r.After), a.Requests, a.FailedInWindow, a.FailedOutside, a.LongestFailureMillis, yesNo(r.SplitBrain))
	}
	if w := r.Watch; w != nil {
		s = fmt.Sprintf("%-17s #%-3d %s's API server, VIP on %s -> %s  %s  split-brain: %s",
			r.Drill, r.Run, orDash(r.Target), orDash(r.Before), orDash(r.After), w, yesNo(r.SplitBrain))
	}
	if st := r.Storm; st != nil {
		s = fmt.Sprintf("%-17s #%-3d VIP on %s -> %s  split-brain: %s\n    %s",
			r.Drill, r.Run, orDash(r.Before), orDash(r.After), yesNo(r.SplitBrain), st)
	}
	for _, w := range r.Workers {
		s += "\n    " + w.String()
	}
	if r.Prune != nil {
		s += "\n    " + r.Prune.String()
	}
	if r.Prometheus != nil {
		s += "\n    " + r.Prometheus.String()
	}
	if r.Recovery != nil {
		s += "\n    " + r.Recovery.String()
	}
	if r.Kubeadm != nil {
		s += "\n    " + r.Kubeadm.String()
	}
	if r.Handoff != nil {
		s += "\n    " + r.Handoff.String()
	}
	if r.ECMP != nil {
		s = fmt.Sprintf("%-17s #%-3d victim %s\n    %s", r.Drill, r.Run, orDash(r.Target), r.ECMP)
	}
	if r.SplitDetail != "" {
		s += "  (" + r.SplitDetail + ")"
	}
	if r.LateReplies > 0 {
		s += fmt.Sprintf("  (%d late replies left out)", r.LateReplies)
	}
	if len(r.Families) > 0 {
		var fs []string
		for _, f := range r.Families {
			fs = append(fs, f.String())
		}
		s += "\n    " + strings.Join(fs, "; ")
		if len(r.Families) > 1 {
			s += fmt.Sprintf("; families switched %.0fms apart", r.SkewMillis)
		}
	}
	if r.StoreSlowMillis > 0 {
		s += fmt.Sprintf("  the VIP left its holder while etcd answered a write in %.0fms (vigil promises to stay put within 400 ms)", r.StoreSlowMillis)
	}
	if r.Error != "" {
		s += "  ERROR: " + r.Error
	}
	return s
}

// drillRun is the state of one drill in progress.
type drillRun struct {
	l       *Lab
	handoff []string   // what vigil handoff printed
	mu      sync.Mutex // guards dead
	dead    map[string]bool
	w       *vipWatch
	target  *Node
}

// newDrillRun starts watching every node's addresses for a drill; the
// caller closes d.w.
func (l *Lab) newDrillRun() (*drillRun, error) {
	w, err := newVIPWatch(l.st.Nodes)
	if err != nil {
		return nil, err
	}
	return &drillRun{l: l, dead: map[string]bool{}, w: w}, nil
}

// live returns the nodes whose processes run (a partitioned node is live).
func (d *drillRun) live() []*Node {
	nodes := d.l.liveNodes()
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []*Node
	for _, n := range nodes {
		if !d.dead[n.Name] {
			out = append(out, n)
		}
	}
	return out
}

func (d *drillRun) setDead(name string, dead bool) {
	d.mu.Lock()
	d.dead[name] = dead
	d.mu.Unlock()
}

// watchJoined restarts the drill's VIP watch and its monitor over the
// lab's nodes now, after a node joined. It returns the new monitor and the
// double holds the old one saw. On an error the watch left is empty (its
// close does nothing) and the monitor returned is the old, closed one, so
// the drill's deferred closes stay safe.
func (d *drillRun) watchJoined(mon *monitor) (*monitor, []doubleHold, error) {
	doubles := mon.close()
	d.w.close()
	w, err := newVIPWatch(d.l.st.Nodes)
	if err != nil {
		d.w = &vipWatch{}
		return mon, doubles, err
	}
	d.w = w
	return startMonitor(w, d.live, probeInterval), doubles, nil
}

// Drill runs one drill of the given kind and heals the lab afterwards.
func (l *Lab) Drill(ctx context.Context, kind string, run int) Result {
	r := Result{Drill: kind, Impl: l.st.Settings.Impl, Run: run}
	if err := l.drill(ctx, kind, &r); err != nil {
		r.Error = err.Error()
	}
	return r
}

func (l *Lab) drill(ctx context.Context, kind string, r *Result) error {
	if !slices.Contains(Drills, kind) {
		return fmt.Errorf("unknown drill %q (one of %s)", kind, strings.Join(Drills, ", "))
	}
	if (kind == DrillKillEtcdLeader || kind == DrillImpostorEtcd) && l.st.Settings.Impl != ImplVigil {
		return fmt.Errorf("drill %s needs etcd, which the %s lab does not run", kind, l.st.Settings.Impl)
	}
	if kind == DrillECMPNodeKilled {
		return l.ecmpDrill(ctx, r)
	}
	if l.st.Settings.ecmp() {
		return fmt.Errorf("drill %s needs one VIP holder; in a --bgp-mode ecmp lab every node carries the VIP: run %s", kind, DrillECMPNodeKilled)
	}
	if kind == DrillImpostorEtcd {
		return l.impostorDrill(ctx, r)
	}
	if kind == DrillPrometheus {
		return l.promDrill(ctx, r)
	}
	if kind == DrillRollingUpgrade {
		return l.rollingUpgrade(ctx, r)
	}
	if kind == DrillAPIServerDown || kind == DrillAPIServerSlow {
		return l.apiDrill(ctx, kind, r)
	}
	if kind == DrillBackendPaused || kind == DrillBackendKilled {
		return l.watchDrill(ctx, kind, r)
	}
	if kind == DrillReconnectStorm {
		return l.stormDrill(ctx, r)
	}
	if kind == DrillReplaceNode {
		return l.replaceNode(ctx, r)
	}
	if kind == DrillReplaceHealthy {
		return l.replaceHealthy(ctx, r)
	}
	if kind == DrillScale {
		return l.scale(ctx, r)
	}
	if kind == DrillScaleWorkers {
		return l.scaleWorkers(ctx, r)
	}
	if slices.Contains(PruneDrills, kind) {
		return l.pruneDrill(ctx, kind, r)
	}
	if kind == DrillRecover {
		return l.recoverDrill(ctx, r)
	}
	if slices.Contains(KubeadmDrills, kind) {
		return l.kubeadmDrill(ctx, kind, r)
	}
	if l.st.Settings.Kubeadm {
		return fmt.Errorf("drill %s needs the lab's own etcd and vigil processes; the kubeadm lab runs %s", kind, strings.Join(KubeadmDrills, " and "))
	}
	holder, err := l.waitStable(ctx, recoverTimeout)
	if err != nil {
		return fmt.Errorf("lab not stable before the drill: %w", err)
	}
	d, err := l.newDrillRun()
	if err != nil {
		return err
	}
	defer d.w.close()
	if d.target, err = l.node(holder); err != nil {
		return err
	}
	if kind == DrillKillEtcdLeader {
		if d.target, err = l.etcdLeaderNotHolding(ctx, holder); err != nil {
			return err
		}
	}
	r.Target = d.target.Name

	var probers []*prober // one per VIP address, the first family's first
	for _, v := range l.st.Settings.vips() {
		p, err := startProber(probeInterval, v.Addr())
		if err != nil {
			return err
		}
		defer p.close()
		probers = append(probers, p)
	}
	pr := probers[0]
	mon := startMonitor(d.w, d.live, probeInterval)
	defer mon.close()
	var kac *keepAliveClients
	if kind == DrillHandoff && l.st.Settings.LBPort != 0 && l.st.Settings.has4() {
		if kac, err = l.startKeepAliveClients(l.st.Settings.LBPort); err != nil {
			return err
		}
		defer func() {
			res := kac.stop()
			res.Output = d.handoff
			res.classify(time.Now())
			r.Handoff = &res
		}()
	}
	if !clock.Sleep(ctx, 300*time.Millisecond) { // baseline
		return ctx.Err()
	}

	fault := time.Now()
	if err := d.inject(ctx, kind); err != nil {
		return fmt.Errorf("inject %s: %w", kind, err)
	}
	avoid := d.target.Name
	if kind == DrillKillEtcdLeader {
		avoid = ""
	}
	recovered, err := waitAnswering(ctx, pr, avoid, fault)
	for _, p := range probers[1:] {
		if err == nil {
			_, err = waitAnswering(ctx, p, avoid, fault)
			if err != nil {
				err = fmt.Errorf("%s: %w", p.vip, err)
			}
		}
	}
	if err != nil {
		r.Before = lastBefore(pr.snapshot(), fault)
		r.SplitBrain, r.SplitDetail = judgeSplit(mon.close(), pr.snapshot(), fault)
		herr := d.heal(ctx, kind)
		return errors.Join(err, herr)
	}
	healStart := time.Now()
	if err := d.heal(ctx, kind); err != nil {
		return fmt.Errorf("heal after %s: %w", kind, err)
	}
	if _, err := l.waitStable(ctx, recoverTimeout); err != nil {
		return fmt.Errorf("no single holder after healing: %w", err)
	}
	// Watch a while longer: a late second holder, or a failback (keepalived
	// preempts when its MASTER returns), must be seen and counted.
	if !clock.Sleep(ctx, postHealWatch) {
		return ctx.Err()
	}
	doubles := mon.close()
	replies := pr.close()
	r.LateReplies = pr.lateReplies()
	r.Before = lastBefore(replies, fault)
	r.After = nodeAt(replies, recovered)
	r.OutageMillis = millis(longestGap(replies, fault, recovered))
	r.HealOutageMillis = millis(longestGap(replies, healStart, time.Now()))
	r.SplitBrain, r.SplitDetail = judgeSplit(doubles, replies, fault)
	if l.st.Settings.has6() {
		if err := r.judgeFamilies(probers, fault, healStart); err != nil {
			return err
		}
	}
	final, err := d.w.holders(d.live())
	if err != nil {
		return err
	}
	r.HoldersAfterHeal = final
	if len(final) != 1 {
		return fmt.Errorf("after the heal the VIP is on %v", final)
	}
	return nil
}

// judgeFamilies fills Families and SkewMillis from every address's
// replies, and fails the drill when the addresses ended on different
// nodes. The first prober's replies are in r already (outage, heal
// outage, late replies, split brain); the others' are added to them.
func (r *Result) judgeFamilies(probers []*prober, fault, healStart time.Time) error {
	var switched []time.Time
	for i, p := range probers {
		rs := p.close()
		rec := recoveredAt(rs, r.After, fault)
		f := FamilyResult{Family: family(p.vip), VIP: p.vip.String(), After: nodeAt(rs, rec)}
		f.OutageMillis = millis(longestGap(rs, fault, rec))
		f.SwitchedMillis = millis(rec.Sub(fault))
		r.Families = append(r.Families, f)
		switched = append(switched, rec)
		if i == 0 {
			continue
		}
		r.OutageMillis = max(r.OutageMillis, f.OutageMillis)
		r.HealOutageMillis = max(r.HealOutageMillis, millis(longestGap(rs, healStart, time.Now())))
		r.LateReplies += p.lateReplies()
		if split, detail := judgeSplit(nil, rs, fault); split {
			r.SplitBrain = true
			r.SplitDetail = strings.TrimPrefix(r.SplitDetail+"; "+f.Family+": "+detail, "; ")
		}
	}
	if len(switched) > 1 {
		r.SkewMillis = millis(max(switched[0].Sub(switched[1]), switched[1].Sub(switched[0])))
	}
	for _, f := range r.Families {
		if f.After != r.After {
			return fmt.Errorf("after the fault %s answered on %s, but %s on %s", r.After, r.Families[0].VIP, f.After, f.VIP)
		}
	}
	return nil
}

// recoveredAt is when node first answered after fault: the first reply
// from it that has no reply from another node after it (the new holder's
// run of answers), or the fault itself when node answered throughout.
func recoveredAt(rs []reply, node string, fault time.Time) time.Time {
	at := time.Time{}
	for _, x := range rs {
		if x.at.Before(fault) {
			continue
		}
		switch {
		case x.node != node:
			at = time.Time{}
		case at.IsZero():
			at = x.at
		}
	}
	if at.IsZero() {
		return fault
	}
	return at
}

// inject breaks the lab.
func (d *drillRun) inject(ctx context.Context, kind string) error {
	l, t := d.l, d.target
	switch kind {
	case DrillKillLeader:
		if err := l.setNodePorts(ctx, t, false); err != nil {
			return err
		}
		t.Cut = true
		d.setDead(t.Name, true)
		return l.killNode(ctx, t)
	case DrillGraceful:
		return l.signal(ctx, t, l.daemonRole(), syscall.SIGTERM, 10*time.Second)
	case DrillHandoff:
		var err error
		d.handoff, err = l.runHandoff(ctx, t.Name)
		return err
	case DrillPartitionLeader:
		if err := l.setNodePorts(ctx, t, false); err != nil {
			return err
		}
		t.Cut = true
		return l.save()
	case DrillKillEtcdLeader:
		return l.signal(ctx, t, roleEtcd, syscall.SIGKILL, 5*time.Second)
	case DrillKillDaemon:
		if l.st.Settings.Impl == ImplVigil {
			// Only vigil run: its guard process is what this drill tests.
			return l.signal(ctx, t, roleVigil, syscall.SIGKILL, 5*time.Second)
		}
		return l.killComm(ctx, t, "keepalived") // parent and VRRP child
	}
	return fmt.Errorf("unknown drill %q", kind)
}

// heal undoes inject.
func (d *drillRun) heal(ctx context.Context, kind string) error {
	l, t := d.l, d.target
	switch kind {
	case DrillKillLeader:
		// A power cut ends with a reboot: the VIP is gone from the
		// interface, the link comes back, then the services start.
		if err := d.w.flushVIP(t.Name); err != nil {
			return err
		}
		if err := l.setNodePorts(ctx, t, true); err != nil {
			return err
		}
		t.Cut = false
		if err := l.startNode(t); err != nil {
			return err
		}
		d.setDead(t.Name, false)
	case DrillHandoff:
		return nil // nothing broke
	case DrillGraceful, DrillKillDaemon:
		if l.st.Settings.Impl == ImplVigil {
			return l.startVigil(t)
		}
		return l.startKeepalived(t)
	case DrillPartitionLeader:
		if err := l.setNodePorts(ctx, t, true); err != nil {
			return err
		}
		t.Cut = false
		return l.save()
	case DrillKillEtcdLeader:
		if err := l.startEtcd(t); err != nil {
			return err
		}
	}
	if l.st.Settings.Impl == ImplVigil {
		return l.waitEtcdHealthy(ctx, recoverTimeout)
	}
	return nil
}

func (l *Lab) daemonRole() string {
	if l.st.Settings.Impl == ImplVigil {
		return roleVigil
	}
	return roleKeepalived
}

// etcdLeaderNotHolding returns the node whose etcd member leads raft. If
// that is the VIP holder (vigil moves leadership away, so this is rare), the
// drill moves leadership itself first: the drill is about the other case.
func (l *Lab) etcdLeaderNotHolding(ctx context.Context, holder string) (*Node, error) {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		st, err := l.etcdStatus(ctx)
		if err == nil && st.Leader != "" && st.Leader != holder {
			return l.node(st.Leader)
		}
		if !clock.Sleep(ctx, 200*time.Millisecond) {
			return nil, ctx.Err()
		}
	}
	return nil, fmt.Errorf("etcd raft leadership stayed on the VIP holder %s", holder)
}

// waitStable waits until exactly one live, connected node has the VIP and it
// answers on the VIP, three times in a row.
func (l *Lab) waitStable(ctx context.Context, d time.Duration) (string, error) {
	w, err := newVIPWatch(l.st.Nodes)
	if err != nil {
		return "", err
	}
	defer w.close()
	vips := l.st.Settings.vips()
	deadline := time.Now().Add(d)
	streak, last := 0, ""
	var why string
	for time.Now().Before(deadline) {
		h, err := w.holders(l.st.Nodes)
		switch {
		case err != nil:
			why = err.Error()
			streak = 0
		case len(h) != 1:
			why = fmt.Sprintf("VIP on %d nodes %v", len(h), h)
			streak = 0
		default:
			bad := false
			for _, v := range vips {
				ans, err := probeOnce(ctx, v.Addr(), 200*time.Millisecond)
				if err != nil || ans != h[0] {
					why = fmt.Sprintf("VIP on %s but %s answered by %q (%v)", h[0], v.Addr(), ans, err)
					bad = true
					break
				}
			}
			if bad {
				streak = 0
				break
			}
			if h[0] != last {
				streak = 0
			}
			last = h[0]
			streak++
			if streak >= 3 {
				return last, nil
			}
		}
		if !clock.Sleep(ctx, 100*time.Millisecond) {
			return "", ctx.Err()
		}
	}
	return "", fmt.Errorf("not stable after %v: %s", d, why)
}

// waitAnswering waits until one node other than avoid has answered on the
// VIP for `settle` without a gap over 100 ms, and returns when that run of
// answers began.
func waitAnswering(ctx context.Context, p *prober, avoid string, since time.Time) (time.Time, error) {
	return waitAnsweringWithin(ctx, p, avoid, since, recoverTimeout)
}

// waitAnsweringWithin is waitAnswering with the bound d.
func waitAnsweringWithin(ctx context.Context, p *prober, avoid string, since time.Time, d time.Duration) (time.Time, error) {
	deadline := since.Add(d)
	for time.Now().Before(deadline) {
		if !clock.Sleep(ctx, 50*time.Millisecond) {
			return time.Time{}, ctx.Err()
		}
		rs := p.snapshot()
		if len(rs) == 0 {
			continue
		}
		end := rs[len(rs)-1]
		if end.node == avoid || time.Since(end.at) > 100*time.Millisecond {
			continue
		}
		start := end.at
		for i := len(rs) - 2; i >= 0; i-- {
			if rs[i].node != end.node || rs[i+1].at.Sub(rs[i].at) > 100*time.Millisecond || rs[i].at.Before(since) {
				break
			}
			start = rs[i].at
		}
		if end.at.Sub(start) >= settle {
			return start, nil
		}
	}
	return time.Time{}, fmt.Errorf("no node answered on the VIP steadily within %v", d)
}
