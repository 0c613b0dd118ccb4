package lab

import (
	"context"

	"errors"
	"fmt"
	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/vigil-ha/vigil/internal/clock"
)

// DrillReplaceNode is the seed story end to end: the VIP holder loses power
// for good, the VIP moves, the dead etcd member is pruned with `vigil
// members prune`, and a new node joins as kubeadm join would (a plain
// MemberAdd, which etcd refuses while the dead member still counts), then
// runs etcd, its API server and vigil. The client of the VIP must see only
// the failover itself.
const DrillReplaceNode = "replace-node"

// phaser returns a function that records a phase lasting from the end of
// the previous one (or start) until now.
func (r *Result) phaser(start time.Time) func(name, detail string) {
	t := start
	return func(name, detail string) {
		now := time.Now()
		r.Phases = append(r.Phases, Phase{Name: name, Millis: millis(now.Sub(t)), Detail: detail})
		t = now
	}
}

// Phase is one timed step of a multi-step drill.
type Phase struct {
	Name   string  `json:"name"`
	Millis float64 `json:"millis"`
	Detail string  `json:"detail,omitempty"`
}

// maxNodeIndex is the highest node index: node addresses run from
// 10.250.0.11 up to just below the VIP (10.250.0.100). Indexes of retired
// nodes are not reused while the lab is up, so that no peer's ARP cache or
// etcd's memory of a removed member can point a new node's address at an
// old one.
const maxNodeIndex = 89

// addNode creates the namespace and certificate of a new node with the next
// free index and records it in the lab state (without processes).
func (l *Lab) addNode(ctx context.Context) (*Node, error) {
	idx := 0
	for _, n := range l.st.Nodes {
		idx = max(idx, n.Index)
	}
	idx++
	for _, n := range l.st.Retired {
		idx = max(idx, n+1)
	}
	if idx > maxNodeIndex {
		return nil, fmt.Errorf("lab: no free node index (the lab has room for n1..n%d); run vigil-lab down and up again", maxNodeIndex)
	}
	n := &Node{Name: "n" + itoa(idx), Index: idx, IP: nodeIP(idx), PIDs: map[string]int{}}
	if err := os.MkdirAll(l.nodeDir(n), 0o755); err != nil {
		return nil, fmt.Errorf("lab: %w", err)
	}
	ca, err := l.loadPKI()
	if err != nil {
		return nil, err
	}
	if err := ca.issue(n.Name, []netip.Addr{n.IP, VIP.Addr(), VIP6.Addr(), netip.MustParseAddr("127.0.0.1")}, l.apiCert(n), l.apiKey(n)); err != nil {
		return nil, err
	}
	if err := l.createNodeHost(ctx, n); err != nil {
		return nil, err
	}
	l.editNodes(appendNode(n))
	return n, l.save()
}

// retireNode kills whatever runs on n, deletes its namespace and forgets it.
func (l *Lab) retireNode(ctx context.Context, n *Node) error {
	_ = l.killNode(ctx, n)
	err := ip(ctx, "netns", "del", nodeNS(n.Name))
	l.editNodes(dropNodes(func(m *Node) bool { return m == n }))
	if !slices.Contains(l.st.Retired, n.Index) {
		l.st.Retired = append(l.st.Retired, n.Index)
	}
	return errors.Join(err, l.save())
}

// joinEtcd adds n to etcd as a voter, the way kubeadm join does, and starts
// its etcd with the initial cluster the answer implies.
func (l *Lab) joinEtcd(ctx context.Context, n *Node) error {
	cli, err := etcdClient(l.etcdEndpoints())
	if err != nil {
		return err
	}
	defer cli.Close()
	peer := fmt.Sprintf("http://%s:2380", n.IP)
	// With a dead member still listed etcd's refusal never ends.
	resp, err := addMember(ctx, cli, peer, false, 10*time.Second, time.Second)
	if err != nil {
		return fmt.Errorf("JOIN REFUSED: etcd would not add %s (%w); with a dead member still listed, etcd counts it towards the quorum of the larger cluster", n.Name, err)
	}
	ic, _ := initialCluster(resp.Members, n.Name, peer)
	return l.startEtcdWith(n, ic, "existing")
}

// addMember adds peer to etcd (as a learner if asked) as kubeadm join
// does: etcd refuses changes for 5 s after a member (re)connects
// ("unhealthy cluster"), so that refusal is retried every `every` for
// retryFor.
func addMember(ctx context.Context, cli *clientv3.Client, peer string, learner bool, retryFor, every time.Duration) (*clientv3.MemberAddResponse, error) {
	add := cli.MemberAdd
	if learner {
		add = cli.MemberAddAsLearner
	}
	deadline := time.Now().Add(retryFor)
	for {
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := add(actx, []string{peer})
		cancel()
		if !errors.Is(err, rpctypes.ErrUnhealthy) || time.Now().After(deadline) || !clock.Sleep(ctx, every) {
			return resp, err
		}
	}
}

// vigilMembersTimeout bounds one `vigil members` command in a drill; the
// slowest (prune, replace) take a few seconds each.
const vigilMembersTimeout = 2 * time.Minute

// vigilMembers runs `vigil members ARGS` inside node's namespace, against
// the lab's etcd, and returns its output.
func (l *Lab) vigilMembers(ctx context.Context, node string, args ...string) (string, error) {
	full := append([]string{"netns", "exec", nodeNS(node), l.vigilBin, "members", "--etcd-endpoints", strings.Join(l.etcdEndpoints(), ",")}, args...)
	// Bounded, so that a command that hangs fails the drill with its
	// output instead of stalling it.
	ctx, cancel := context.WithTimeout(ctx, vigilMembersTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ip", full...)
	cmd.WaitDelay = 5 * time.Second
	began := time.Now()
	out, err := cmd.CombinedOutput()
	l.noteMembers(began, args, out, err)
	if err != nil {
		return string(out), fmt.Errorf("vigil members %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// membersLog is the file in the lab's directory that keeps the output of
// every `vigil members` command a drill ran, for the story behind a
// failed drill (TestDrills prints it).
const membersLog = "members.log"

// noteMembers appends one command's output to membersLog. The record is
// best effort: a drill does not fail for want of it.
func (l *Lab) noteMembers(began time.Time, args []string, out []byte, err error) {
	f, ferr := os.OpenFile(filepath.Join(l.dir, membersLog), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if ferr != nil {
		return
	}
	defer f.Close()
	result := "ok"
	if err != nil {
		result = err.Error()
	}
	fmt.Fprintf(f, "--- %s vigil members %s (%v: %s)\n%s", began.UTC().Format(time.RFC3339Nano), strings.Join(args, " "),
		time.Since(began).Round(time.Millisecond), result, out)
}

// settledVigilLab checks that the lab runs vigil and waits until it has one
// VIP holder and a healthy etcd; it returns the holder.
func (l *Lab) settledVigilLab(ctx context.Context, kind string) (string, error) {
	if l.st.Settings.Impl != ImplVigil {
		return "", fmt.Errorf("drill %s needs etcd and vigil", kind)
	}
	holder, err := l.waitStable(ctx, recoverTimeout)
	if err != nil {
		return "", fmt.Errorf("lab not stable before the drill: %w", err)
	}
	return holder, l.waitEtcdHealthy(ctx, recoverTimeout)
}

// initialCluster is the --initial-cluster value for a new member at peer,
// to be named name, from a member list that already announces it.
func initialCluster(members []*etcdserverpb.Member, name, peer string) (string, bool) {
	var initial []string
	found := false
	for _, m := range members {
		mname := m.Name
		if slices.Contains(m.PeerURLs, peer) {
			mname, found = name, true
		}
		if mname == "" {
			continue // announced, not started: not part of the initial cluster
		}
		for _, p := range m.PeerURLs {
			initial = append(initial, mname+"="+p)
		}
	}
	return strings.Join(initial, ","), found
}

// replaceNode runs the replace-node drill.
func (l *Lab) replaceNode(ctx context.Context, r *Result) error {
	holder, err := l.settledVigilLab(ctx, DrillReplaceNode)
	if err != nil {
		return err
	}
	w, err := newVIPWatch(l.st.Nodes)
	if err != nil {
		return err
	}
	d := &drillRun{l: l, dead: map[string]bool{}, w: w}
	defer func() { d.w.close() }()
	if d.target, err = l.node(holder); err != nil {
		return err
	}
	dead := d.target
	r.Target, r.Before = holder, holder
	pr, err := startProber(probeInterval, l.st.Settings.vipAddr())
	if err != nil {
		return err
	}
	defer pr.close()
	mon := startMonitor(w, d.live, probeInterval)
	defer func() { mon.close() }()
	var doubles []doubleHold
	if !clock.Sleep(ctx, 300*time.Millisecond) {
		return ctx.Err()
	}
	start := time.Now()
	phase := func(name string, since time.Time, detail string) time.Time {
		now := time.Now()
		r.Phases = append(r.Phases, Phase{Name: name, Millis: millis(now.Sub(since)), Detail: detail})
		l.log.Info("phase", "drill", DrillReplaceNode, "phase", name, "took", now.Sub(since).Round(time.Millisecond), "detail", detail)
		return now
	}

	// 1. Power off the holder for good.
	if err := l.setNodePorts(ctx, dead, false); err != nil {
		return err
	}
	d.setDead(dead.Name, true)
	if err := l.killNode(ctx, dead); err != nil {
		return err
	}
	// From here the lab's node list is the live nodes; the dead machine's
	// namespace goes at the end.
	l.editNodes(dropNodes(func(m *Node) bool { return m == dead }))
	l.st.Retired = append(l.st.Retired, dead.Index)
	if err := l.save(); err != nil {
		return err
	}
	t := phase("power off "+dead.Name, start, "")

	// 2. The VIP moves.
	recovered, err := waitAnswering(ctx, pr, dead.Name, t)
	if err != nil {
		return fmt.Errorf("failover: %w", err)
	}
	r.After = nodeAt(pr.snapshot(), recovered)
	t = phase("VIP failover + 1s steady", t, "to "+r.After)

	// 3. Prune the dead member: vigil run does it by itself with
	// --prune-after; otherwise `vigil members prune` from a live node. The
	// dead member's last-seen-healthy record was written by the old holder
	// at most two seconds before it died.
	var out string
	deadline := time.Now().Add(30*time.Second + l.st.Settings.PruneAfter)
	for {
		if l.st.Settings.PruneAfter > 0 {
			gone, err := l.memberGone(ctx, dead.Name)
			if err == nil && gone {
				out = "pruned by vigil run --prune-after " + l.st.Settings.PruneAfter.String()
				break
			}
		} else {
			out, err = l.vigilMembers(ctx, r.After, "prune", "--min-down", "3s")
			if err == nil && strings.Contains(out, "removed "+dead.Name) {
				break
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s was not pruned in time: %v\n%s", dead.Name, err, out)
		}
		if !clock.Sleep(ctx, 200*time.Millisecond) {
			return ctx.Err()
		}
	}
	t = phase("prune "+dead.Name, t, strings.TrimSpace(lastLine(out)))

	// 4. A new node joins: etcd first (kubeadm join adds the member),
	// then its API server, vigil and responder.
	n, err := l.addNode(ctx)
	if err != nil {
		return err
	}
	if err := l.joinEtcd(ctx, n); err != nil {
		return err
	}
	if err := l.waitEtcdHealthy(ctx, recoverTimeout); err != nil {
		return fmt.Errorf("after %s joined: %w", n.Name, err)
	}
	t = phase("join "+n.Name+" to etcd", t, "")
	if err := l.startServices(n); err != nil {
		return err
	}
	// Watch the new node too.
	var seen []doubleHold
	mon, seen, err = d.watchJoined(mon)
	doubles = append(doubles, seen...)
	if err != nil {
		return err
	}
	// 5. Converged: three healthy voters, and the holder balances over the
	// new node's API server and no longer over the dead one's.
	newBackend := netip.AddrPortFrom(n.IP, APIServerPort).String()
	deadBackend := netip.AddrPortFrom(dead.IP, APIServerPort).String()
	deadline = time.Now().Add(recoverTimeout)
	for {
		rep, err := l.vigilStatus(ctx, r.After)
		if err == nil && l.st.Settings.LBPort != 0 {
			var up, stale bool
			for _, b := range rep.Backends {
				up = up || (b.Address == newBackend && b.State == "up")
				stale = stale || b.Address == deadBackend
			}
			if up && !stale {
				break
			}
		} else if err == nil {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the holder's load balancer did not pick up %s (and drop %s) within %v", newBackend, deadBackend, recoverTimeout)
		}
		if !clock.Sleep(ctx, 100*time.Millisecond) {
			return ctx.Err()
		}
	}
	// And vigil has recorded the new member healthy, so a later prune
	// knows it (in a real cluster replacements are minutes apart; drills
	// run back to back).
	for !l.recordedHealthy(ctx, r.After, n.Name) {
		if time.Now().After(deadline) {
			return fmt.Errorf("vigil did not record %s healthy within %v", n.Name, recoverTimeout)
		}
		if !clock.Sleep(ctx, 200*time.Millisecond) {
			return ctx.Err()
		}
	}
	phase("vigil on "+n.Name+", backends updated", t, "")
	r.Phases = append(r.Phases, Phase{Name: "total", Millis: millis(time.Since(start))})

	if err := l.retireNode(ctx, dead); err != nil {
		return err
	}
	if !clock.Sleep(ctx, postHealWatch) {
		return ctx.Err()
	}
	replies := pr.close()
	r.OutageMillis = millis(longestGap(replies, start, time.Now()))
	r.SplitBrain, r.SplitDetail = judgeSplit(append(doubles, mon.close()...), replies, start)
	st, err := l.etcdStatus(ctx)
	if err != nil {
		return err
	}
	healthy := 0
	for _, m := range st.Members {
		if m.Reachable && m.Leader == st.Leader && st.Leader != "" {
			healthy++
		}
	}
	if healthy != 3 {
		return fmt.Errorf("after the replacement %d of the members are healthy followers of one leader, want 3: %+v", healthy, st)
	}
	final, err := d.w.holders(l.st.Nodes)
	if err != nil {
		return err
	}
	r.HoldersAfterHeal = final
	if len(final) != 1 {
		return fmt.Errorf("after the replacement the VIP is on %v", final)
	}
	return nil
}

// memberGone tells whether etcd no longer lists member name.
func (l *Lab) memberGone(ctx context.Context, name string) (bool, error) {
	names, err := l.memberNames(ctx)
	if err != nil {
		return false, err
	}
	return !slices.Contains(names, name), nil
}

// recordedHealthy tells whether some vigil's published view, as `vigil
// members list` on node from shows it, has member name reachable.
func (l *Lab) recordedHealthy(ctx context.Context, from, name string) bool {
	v, _, err := l.viewsOf(ctx, from, name)
	if err != nil {
		return false
	}
	for _, s := range v {
		if s.Reachable {
			return true
		}
	}
	return false
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// DrillReplaceHealthy replaces a healthy node that does not hold the VIP
// with `vigil members replace OLD --with NEW=PEER_URL`: the new member joins
// as a learner, is promoted once caught up, and only then is the old one
// removed. The VIP should not move at all.
const DrillReplaceHealthy = "replace-healthy"

func (l *Lab) replaceHealthy(ctx context.Context, r *Result) error {
	holder, err := l.settledVigilLab(ctx, DrillReplaceHealthy)
	if err != nil {
		return err
	}
	old := l.otherNode(holder)
	r.Target, r.Before = old.Name, holder
	pr, err := startProber(probeInterval, l.st.Settings.vipAddr())
	if err != nil {
		return err
	}
	defer pr.close()
	start := time.Now()
	phase := r.phaser(start)
	if _, _, err := l.replaceWith(ctx, holder, old, phase); err != nil {
		return err
	}
	return l.finishStill(ctx, r, pr, start, holder, "during a planned replacement of a node that did not hold it")
}

// replaceWith replaces old by a new node with `vigil members replace`, run
// on holder: the new member joins as a learner, is promoted once caught up,
// and only then is old removed. The lab starts the new etcd once the
// learner is announced, as an operator following the printed instructions
// would; then old is shut down and the new node's services start. It
// returns the new node and the command's output.
func (l *Lab) replaceWith(ctx context.Context, holder string, old *Node, phase func(name, detail string)) (*Node, string, error) {
	n, err := l.addNode(ctx)
	if err != nil {
		return nil, "", err
	}
	peer := fmt.Sprintf("http://%s:2380", n.IP)
	type res struct {
		out string
		err error
	}
	done := make(chan res, 1)
	go func() {
		out, err := l.vigilMembers(ctx, holder, "replace", old.Name, "--with", n.Name+"="+peer, "--timeout", "60s")
		done <- res{out, err}
	}()
	started := false
	var rr res
	for rr.out == "" && rr.err == nil {
		select {
		case rr = <-done:
			continue
		case <-time.After(200 * time.Millisecond):
		}
		if started {
			continue
		}
		ic, ok, err := l.learnerCluster(ctx, n, peer)
		if err != nil || !ok {
			continue
		}
		phase("add "+n.Name+" as learner", "")
		if err := l.startEtcdWith(n, ic, "existing"); err != nil {
			return nil, "", err
		}
		started = true
	}
	if rr.err != nil {
		return nil, rr.out, rr.err
	}
	phase("catch up, promote "+n.Name+", remove "+old.Name, lastLine(rr.out))
	// The old node's etcd stops itself once removed; its other processes
	// and the machine go.
	if err := l.retireNode(ctx, old); err != nil {
		return nil, rr.out, err
	}
	if err := l.startServices(n); err != nil {
		return nil, rr.out, err
	}
	if err := l.waitEtcdHealthy(ctx, recoverTimeout); err != nil {
		return nil, rr.out, err
	}
	if err := l.waitBackendsUp(ctx, holder, len(l.st.Nodes), recoverTimeout); err != nil {
		return nil, rr.out, err
	}
	phase("vigil on "+n.Name+", backends updated", "")
	return n, rr.out, nil
}

// joinNode adds a control-plane node as kubeadm join does (a voting
// MemberAdd, then etcd, the API server and vigil) and waits until holder
// balances over its API server.
func (l *Lab) joinNode(ctx context.Context, holder string) (*Node, error) {
	n, err := l.addNode(ctx)
	if err != nil {
		return nil, err
	}
	if err := l.joinEtcd(ctx, n); err != nil {
		return nil, err
	}
	if err := l.waitEtcdHealthy(ctx, recoverTimeout); err != nil {
		return nil, fmt.Errorf("after %s joined: %w", n.Name, err)
	}
	if err := l.startServices(n); err != nil {
		return nil, err
	}
	return n, l.waitBackendsUp(ctx, holder, len(l.st.Nodes), recoverTimeout)
}

// removeNode removes victim with `vigil members remove --force`, run on
// another node, shuts victim down, and waits until the VIP has one holder
// that balances over exactly the remaining API servers. It returns that
// holder: if victim held the VIP, the VIP has moved.
func (l *Lab) removeNode(ctx context.Context, victim *Node) (string, error) {
	if _, err := l.vigilMembers(ctx, l.otherNode(victim.Name).Name, "remove", victim.Name, "--force"); err != nil {
		return "", err
	}
	if err := l.retireNode(ctx, victim); err != nil {
		return "", err
	}
	if err := l.waitEtcdHealthy(ctx, recoverTimeout); err != nil {
		return "", fmt.Errorf("after removing %s: %w", victim.Name, err)
	}
	holder, err := l.waitStable(ctx, recoverTimeout)
	if err != nil {
		return "", fmt.Errorf("after removing %s: %w", victim.Name, err)
	}
	return holder, l.waitBackendsUp(ctx, holder, len(l.st.Nodes), recoverTimeout)
}

// learnerCluster reports, once the member with peer is announced, the
// initial cluster its etcd must start with.
func (l *Lab) learnerCluster(ctx context.Context, n *Node, peer string) (string, bool, error) {
	cli, err := etcdClient(l.etcdEndpoints())
	if err != nil {
		return "", false, err
	}
	defer cli.Close()
	mctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	resp, err := cli.MemberList(mctx)
	if err != nil {
		return "", false, err
	}
	ic, found := initialCluster(resp.Members, n.Name, peer)
	return ic, found, nil
}

// DrillScale grows the control plane from 3 to 5 nodes (each joining etcd
// as kubeadm join does, then starting its API server and vigil) and shrinks
// it back to 3 with `vigil members remove --force` of two nodes that do not
// hold the VIP, which are then shut down. Every API server is balanced over
// as it comes and dropped as it goes; the VIP must not move.
const DrillScale = "scale"

func (l *Lab) scale(ctx context.Context, r *Result) error {
	holder, err := l.settledVigilLab(ctx, DrillScale)
	if err != nil {
		return err
	}
	if len(l.st.Nodes) != 3 {
		return fmt.Errorf("drill %s starts from 3 nodes; the lab has %d", DrillScale, len(l.st.Nodes))
	}
	r.Before = holder
	pr, err := startProber(probeInterval, l.st.Settings.vipAddr())
	if err != nil {
		return err
	}
	defer pr.close()
	start := time.Now()
	phase := r.phaser(start)
	for range 2 {
		n, err := l.joinNode(ctx, holder)
		if err != nil {
			return err
		}
		phase(fmt.Sprintf("join %s (%d nodes)", n.Name, len(l.st.Nodes)), "")
	}
	for range 2 {
		victim := l.otherNode(holder)
		if _, err := l.removeNode(ctx, victim); err != nil {
			return err
		}
		phase(fmt.Sprintf("remove %s (%d nodes)", victim.Name, len(l.st.Nodes)), "")
	}
	return l.finishStill(ctx, r, pr, start, holder, "while scaling")
}

// vipHolders lists the nodes that have the VIP now.
func (l *Lab) vipHolders() ([]string, error) {
	w, err := newVIPWatch(l.st.Nodes)
	if err != nil {
		return nil, err
	}
	defer w.close()
	return w.holders(l.st.Nodes)
}

// finishStill ends a drill in which the VIP must not move: it records the
// total, the client outage since start and the holder, and fails if the
// VIP is anywhere but on holder (with holder "": on more or fewer than one
// node).
func (l *Lab) finishStill(ctx context.Context, r *Result, pr *prober, start time.Time, holder, during string) error {
	r.Phases = append(r.Phases, Phase{Name: "total", Millis: millis(time.Since(start))})
	if !clock.Sleep(ctx, time.Second) {
		return ctx.Err()
	}
	replies := pr.close()
	r.OutageMillis = millis(longestGap(replies, start, time.Now()))
	r.After = lastBefore(replies, time.Now())
	var err error
	if r.HoldersAfterHeal, err = l.vipHolders(); err != nil {
		return err
	}
	if len(r.HoldersAfterHeal) != 1 || (holder != "" && r.HoldersAfterHeal[0] != holder) {
		return fmt.Errorf("the VIP moved %s: now on %v", during, r.HoldersAfterHeal)
	}
	return nil
}
