package lab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/vigil-ha/vigil/internal/clock"
)

// The prune drills check that vigil run --prune-after removes a member only
// when the cluster agrees it is gone. They need a lab started with
// --prune-after.
const (
	// DrillPruneOneSided: on the VIP holder only, drop packets to another
	// member's client port for 25 s (or 2.5 periods, if longer). That member
	// keeps serving the other nodes; it must stay.
	DrillPruneOneSided = "prune-one-sided"
	// DrillPruneColdStart: stop vigil everywhere (for --prune-after + 15 s:
	// every report vigil published has expired by then), block one
	// member's client port, start vigil, and lift the block 2 s after a
	// holder is elected. No member may go.
	DrillPruneColdStart = "prune-cold-start"
	// DrillPruneRealDeath: power off a member that does not hold the VIP.
	// It must be pruned within --prune-after + 5 s (+ 7 s in all when its
	// etcd member led raft), and not before --prune-after; then a new node
	// joins in its place.
	DrillPruneRealDeath = "prune-real-death"
	// DrillPruneClientPort: on a member that does not hold the VIP, drop
	// every packet that arrives on its network interface for its client
	// port, for 5 periods (25 s at least). Its peer port works: raft
	// replicates to it, and every other vigil sees it unreachable for
	// longer than --prune-after. It must stay.
	DrillPruneClientPort = "prune-client-port"
)

// PruneDrills lists the prune drills.
var PruneDrills = []string{DrillPruneOneSided, DrillPruneColdStart, DrillPruneRealDeath, DrillPruneClientPort}

const (
	// oneSidedBlock is how long the one-sided block lasts at least.
	oneSidedBlock = 25 * time.Second
	// coldStartExtra is how much longer than --prune-after vigil stays
	// stopped everywhere in the cold-start drill: the published member
	// views live 10 s after their vigil stops, so none is left when vigil
	// starts again, and the member has been unreachable from nowhere for
	// longer than the period.
	coldStartExtra = 15 * time.Second
	// realDeathSlack is how much later than --prune-after a dead member
	// may be pruned: the observers' rounds, report freshness and the
	// removal itself.
	realDeathSlack = 5 * time.Second
	// leaderLossSlack is how much later still a dead member may be pruned
	// when it led etcd's raft: the survivors first elect a leader (the
	// lab's etcd runs the default 1 s election timeout, then a round of
	// votes), and meanwhile no vigil can publish what it saw, so the
	// observers' first failed rounds reach the holder later.
	leaderLossSlack = 2 * time.Second
)

// PruneResult is what a prune drill saw.
type PruneResult struct {
	PruneAfterMillis float64 `json:"pruneAfterMillis"`
	Victim           string  `json:"victim"`
	// Members are the etcd members at the end (before a replacement joins).
	Members []string `json:"members"`
	Pruned  bool     `json:"pruned"`
	// PrunedAfterMillis (real death): from power-off to the removal, with
	// the bound it must meet.
	PrunedAfterMillis float64 `json:"prunedAfterMillis,omitempty"`
	BoundMillis       float64 `json:"boundMillis,omitempty"`
	// VictimLedRaft (real death): the victim's etcd member led raft when
	// it lost power, which gives the bound leaderLossSlack more.
	VictimLedRaft bool `json:"victimLedRaft,omitempty"`
	// EtcdAnsweredAfterMillis (real death): from the removal to the first
	// linearizable read that succeeded. etcd's raft leader closes its
	// connections to a removed member before it goes on, and a write to a
	// powered-off machine can hold it there for up to 5 s (etcd's raft
	// write timeout); this shows how long it did.
	EtcdAnsweredAfterMillis float64 `json:"etcdAnsweredAfterMillis,omitempty"`
	// HolderSawDownMillis (one-sided): the longest the holder's published
	// view had the victim unreachable, which shows the block took.
	HolderSawDownMillis float64 `json:"holderSawDownMillis,omitempty"`
	// Witnesses is what every vigil's view said of the victim at the
	// end of the fault.
	Witnesses string `json:"witnesses,omitempty"`
	// SeenBackMillis (one-sided, client port): from lifting the block to
	// the holder's published view showing the member reachable again.
	SeenBackMillis float64 `json:"seenBackMillis,omitempty"`
	// RaftLinkedFrom (client port): the members whose raft transport the
	// holder's vigil members list found linked with the victim, last
	// time it answered during the block.
	RaftLinkedFrom []string `json:"raftLinkedFrom,omitempty"`
}

func (p *PruneResult) String() string {
	s := fmt.Sprintf("victim %s, --prune-after %.0fs, members after: %s", p.Victim, p.PruneAfterMillis/1000, strings.Join(p.Members, ","))
	if p.BoundMillis > 0 {
		led := ""
		if p.VictimLedRaft {
			led = ", it led raft"
		}
		s += fmt.Sprintf(", pruned after %.0fms (bound %.0fms%s), etcd answered %.0fms later", p.PrunedAfterMillis, p.BoundMillis, led, p.EtcdAnsweredAfterMillis)
	} else {
		s += ", pruned: " + yesNo(p.Pruned)
	}
	if p.HolderSawDownMillis > 0 {
		s += fmt.Sprintf(", holder saw it down for %.0fms", p.HolderSawDownMillis)
	}
	if p.Witnesses != "" {
		s += " [" + p.Witnesses + "]"
	}
	if len(p.RaftLinkedFrom) > 0 {
		s += ", raft linked from " + strings.Join(p.RaftLinkedFrom, ",")
	}
	return s
}

func (l *Lab) pruneDrill(ctx context.Context, kind string, r *Result) error {
	// Refused before anything is touched or waited for.
	after := l.st.Settings.PruneAfter
	switch {
	case l.st.Settings.Impl != ImplVigil:
		return fmt.Errorf("drill %s needs etcd and vigil; the lab runs %s", kind, l.st.Settings.Impl)
	case after == 0:
		return fmt.Errorf("drill %s needs a lab started with --prune-after (e.g. vigil-lab up --prune-after 10s)", kind)
	case len(l.st.Nodes) < 3:
		return fmt.Errorf("drill %s needs 3 or more nodes; the lab has %d", kind, len(l.st.Nodes))
	}
	holder, err := l.settledVigilLab(ctx, kind)
	if err != nil {
		return err
	}
	victim := l.otherNode(holder)
	r.Target, r.Before = victim.Name, holder
	p := &PruneResult{PruneAfterMillis: millis(after), Victim: victim.Name}
	r.Prune = p
	start := time.Now()
	phase := r.phaser(start)
	switch kind {
	case DrillPruneOneSided:
		return l.pruneOneSided(ctx, r, p, holder, victim, phase)
	case DrillPruneColdStart:
		return l.pruneColdStart(ctx, r, p, victim, phase)
	case DrillPruneClientPort:
		return l.pruneClientPort(ctx, r, p, holder, victim, phase)
	default:
		return l.pruneRealDeath(ctx, r, p, holder, victim, phase)
	}
}

func (l *Lab) pruneOneSided(ctx context.Context, r *Result, p *PruneResult, holder string, victim *Node, phase func(string, string)) error {
	h, err := l.node(holder)
	if err != nil {
		return err
	}
	pr, err := startProber(probeInterval, l.st.Settings.vipAddr())
	if err != nil {
		return err
	}
	defer pr.close()
	start := time.Now()
	block := max(oneSidedBlock, l.st.Settings.PruneAfter*5/2)
	rule := fmt.Sprintf("ip daddr %s tcp dport %d", victim.IP, etcdClientPort)
	if err := l.block(ctx, h, "output", rule); err != nil {
		return err
	}
	defer l.unblock(h)
	phase(fmt.Sprintf("block %s -> %s:%d", holder, victim.Name, etcdClientPort), "")
	if err := l.holdBlock(ctx, p, h, holder, victim, block, "while only "+holder+" could not reach it", phase); err != nil {
		return err
	}
	return l.finishStill(ctx, r, pr, start, holder, "during a one-sided block")
}

// seenBackBound is how soon after a block is lifted the holder must see
// the member again: its connection's next attempt (at most 2 s away), an
// observer round (1 s) and the published view's round trip.
const seenBackBound = 8 * time.Second

// clientPortBlock is how many periods the client-port drill blocks the
// port for, and its least duration.
const (
	clientPortPeriods  = 5
	clientPortBlockMin = 25 * time.Second
)

func (l *Lab) pruneClientPort(ctx context.Context, r *Result, p *PruneResult, holder string, victim *Node, phase func(string, string)) error {
	pr, err := startProber(probeInterval, l.st.Settings.vipAddr())
	if err != nil {
		return err
	}
	defer pr.close()
	start := time.Now()
	block := max(clientPortBlockMin, clientPortPeriods*l.st.Settings.PruneAfter)
	// Only what arrives on the network interface: the member's own vigil
	// and API server reach it over loopback, as kubeadm's do.
	rule := fmt.Sprintf("iifname %q tcp dport %d", nodeIface, etcdClientPort)
	if err := l.block(ctx, victim, "input", rule); err != nil {
		return err
	}
	defer l.unblock(victim)
	phase(fmt.Sprintf("drop %s:%d from the network", victim.Name, etcdClientPort), "")
	if err := l.holdBlock(ctx, p, victim, holder, victim, block, "while only its client port was filtered", phase); err != nil {
		return err
	}
	if len(p.RaftLinkedFrom) == 0 {
		return fmt.Errorf("vigil members list never showed raft hearing from %s during the block", victim.Name)
	}
	return l.finishStill(ctx, r, pr, start, holder, "while a member's client port was filtered")
}

// holdBlock keeps the block on node at for block, watching: the victim
// must never leave the member list; the holder's published view of it and
// what raft says of it (vigil members list on the holder) are kept in p.
// Then it lifts the block and waits until etcd answers; the victim must
// still be a member, and the holder must have seen it down for the whole
// period (or the block did not take).
func (l *Lab) holdBlock(ctx context.Context, p *PruneResult, at *Node, holder string, victim *Node, block time.Duration, while string, phase func(string, string)) error {
	for end := time.Now().Add(block); time.Now().Before(end); {
		if gone, err := l.memberGone(ctx, victim.Name); err == nil && gone {
			return fmt.Errorf("PRUNED A WORKING MEMBER: %s was removed %s", victim.Name, while)
		}
		if v, linked, err := l.viewsOf(ctx, holder, victim.Name); err == nil {
			if s, ok := v[holder]; ok && !s.Reachable {
				p.HolderSawDownMillis = max(p.HolderSawDownMillis, float64(s.DownMillis))
			}
			p.Witnesses = describeViews(v)
			p.RaftLinkedFrom = linked
		}
		if !clock.Sleep(ctx, time.Second) {
			return ctx.Err()
		}
	}
	phase(fmt.Sprintf("hold the block %v", block), p.Witnesses)
	if err := l.unblock(at); err != nil {
		return err
	}
	// The holder must see the member again within seconds: its
	// connection's reconnect attempts are paced for that
	// (etcdcluster.reconnectBackoff), where gRPC's default would wait up
	// to 20 s per attempt and 120 s between them.
	lifted := time.Now()
	for {
		if v, _, err := l.viewsOf(ctx, holder, victim.Name); err == nil && v[holder].Reachable {
			p.SeenBackMillis = millis(time.Since(lifted))
			break
		}
		if time.Since(lifted) > seenBackBound {
			return fmt.Errorf("%s still saw %s unreachable %v after the block was lifted", holder, victim.Name, seenBackBound)
		}
		if !clock.Sleep(ctx, 250*time.Millisecond) {
			return ctx.Err()
		}
	}
	if err := l.pruneSettle(ctx, p, victim.Name); err != nil {
		return err
	}
	phase("unblock, settle", fmt.Sprintf("%s sees it again after %.0fms", holder, p.SeenBackMillis))
	if p.Pruned {
		return fmt.Errorf("PRUNED A WORKING MEMBER: %s is gone; members %v", victim.Name, p.Members)
	}
	if p.HolderSawDownMillis < p.PruneAfterMillis {
		return fmt.Errorf("the block did not take: %s saw %s down for only %.0fms of the %.0fms period", holder, victim.Name, p.HolderSawDownMillis, p.PruneAfterMillis)
	}
	return nil
}

func (l *Lab) pruneColdStart(ctx context.Context, r *Result, p *PruneResult, victim *Node, phase func(string, string)) error {
	for _, n := range l.st.Nodes {
		if err := l.signal(ctx, n, roleVigil, syscall.SIGTERM, 10*time.Second); err != nil {
			return err
		}
	}
	phase("stop vigil everywhere", "")
	pause := l.st.Settings.PruneAfter + coldStartExtra
	if !clock.Sleep(ctx, pause) {
		return ctx.Err()
	}
	phase(fmt.Sprintf("vigil stopped for %v", pause), "")
	if err := l.block(ctx, victim, "input", fmt.Sprintf("tcp dport %d", etcdClientPort)); err != nil {
		return err
	}
	defer l.unblock(victim)
	for _, n := range l.st.Nodes {
		if err := l.startVigil(n); err != nil {
			return err
		}
	}
	if err := l.save(); err != nil {
		return err
	}
	holder, err := l.waitStable(ctx, recoverTimeout)
	if err != nil {
		return fmt.Errorf("no holder after the cold start: %w", err)
	}
	phase("block "+victim.Name+":2379, start vigil, holder elected", holder)
	if !clock.Sleep(ctx, 2*time.Second) {
		return ctx.Err()
	}
	if v, _, err := l.viewsOf(ctx, holder, victim.Name); err == nil {
		p.Witnesses = describeViews(v)
	}
	if err := l.unblock(victim); err != nil {
		return err
	}
	phase("2 s more, unblock", p.Witnesses)
	if !clock.Sleep(ctx, l.st.Settings.PruneAfter+5*time.Second) {
		return ctx.Err()
	}
	if err := l.pruneSettle(ctx, p, victim.Name); err != nil {
		return err
	}
	phase("wait --prune-after + 5 s", "")
	if p.Pruned {
		return fmt.Errorf("PRUNED A HEALTHY MEMBER after a cold start: %s is gone; members %v", victim.Name, p.Members)
	}
	if r.HoldersAfterHeal, err = l.vipHolders(); err != nil {
		return err
	}
	r.After = holder
	if len(r.HoldersAfterHeal) != 1 {
		return fmt.Errorf("after the cold start the VIP is on %v", r.HoldersAfterHeal)
	}
	return nil
}

func (l *Lab) pruneRealDeath(ctx context.Context, r *Result, p *PruneResult, holder string, victim *Node, phase func(string, string)) error {
	pr, err := startProber(probeInterval, l.st.Settings.vipAddr())
	if err != nil {
		return err
	}
	defer pr.close()
	// Whether the victim leads raft: its death then costs an etcd election
	// before anyone can publish what they saw. Unknown counts as no (the
	// stricter bound).
	if st, err := l.etcdStatus(ctx); err == nil && st.Leader == victim.Name {
		p.VictimLedRaft = true
	}
	start := time.Now()
	if err := l.setNodePorts(ctx, victim, false); err != nil {
		return err
	}
	victim.Cut = true
	if err := l.killNode(ctx, victim); err != nil {
		return err
	}
	fault := time.Now()
	phase("power off "+victim.Name, "")
	slack := realDeathSlack
	if p.VictimLedRaft {
		slack += leaderLossSlack
	}
	bound := l.st.Settings.PruneAfter + slack
	p.BoundMillis = millis(bound)
	for {
		if l.removedEverywhere(ctx, victim.Name) {
			p.PrunedAfterMillis = millis(time.Since(fault))
			break
		}
		if time.Since(fault) > bound+30*time.Second {
			return fmt.Errorf("%s was not pruned within %v of its power-off", victim.Name, bound+30*time.Second)
		}
		// The views are read only during the period: `vigil members list`
		// reads linearizably, and once a removal is near, a stall of etcd
		// would delay this loop and the moment it sees the removal.
		if time.Since(fault) < l.st.Settings.PruneAfter {
			if v, _, err := l.viewsOf(ctx, holder, victim.Name); err == nil {
				p.Witnesses = describeViews(v)
			}
		}
		if !clock.Sleep(ctx, 100*time.Millisecond) {
			return ctx.Err()
		}
	}
	pruned := time.Now()
	if err := l.pruneSettle(ctx, p, victim.Name); err != nil {
		return err
	}
	p.EtcdAnsweredAfterMillis = millis(time.Since(pruned))
	phase("pruned "+victim.Name, p.Witnesses)
	// The lab gets its third member back, as an operator would: a new
	// node joins, the dead one is retired.
	if err := l.retireNode(ctx, victim); err != nil {
		return err
	}
	n, err := l.joinNode(ctx, holder)
	if err != nil {
		return err
	}
	phase("join "+n.Name, "")
	switch {
	case p.PrunedAfterMillis < p.PruneAfterMillis:
		return fmt.Errorf("%s was pruned %.0fms after its power-off, before --prune-after (%.0fms)", victim.Name, p.PrunedAfterMillis, p.PruneAfterMillis)
	case p.PrunedAfterMillis > p.BoundMillis:
		return fmt.Errorf("%s was pruned %.0fms after its power-off, later than --prune-after + %v", victim.Name, p.PrunedAfterMillis, slack)
	}
	return l.finishStill(ctx, r, pr, start, holder, "while a member that did not hold it was pruned")
}

// removedEverywhere tells whether every live member's own (serializable)
// member list lacks name: the removal was committed and every live member
// applied it. A linearizable read would also wait out a stall of etcd's
// leader after the removal, which is measured apart.
func (l *Lab) removedEverywhere(ctx context.Context, name string) bool {
	for _, n := range l.st.Nodes {
		if n.Cut {
			continue
		}
		cli, err := etcdClient([]string{fmt.Sprintf("http://%s:%d", n.IP, etcdClientPort)})
		if err != nil {
			return false
		}
		mctx, cancel := context.WithTimeout(ctx, time.Second)
		resp, err := cli.MemberList(mctx, clientv3.WithSerializable())
		cancel()
		cli.Close()
		if err != nil {
			return false
		}
		for _, m := range resp.Members {
			if m.Name == name {
				return false
			}
		}
	}
	return true
}

// pruneSettle waits until etcd answers and records its members.
func (l *Lab) pruneSettle(ctx context.Context, p *PruneResult, victim string) error {
	var err error
	for deadline := time.Now().Add(recoverTimeout); time.Now().Before(deadline); {
		var names []string
		if names, err = l.memberNames(ctx); err == nil {
			p.Members = names
			p.Pruned = !slices.Contains(names, victim)
			return nil
		}
		if !clock.Sleep(ctx, 500*time.Millisecond) {
			return ctx.Err()
		}
	}
	return fmt.Errorf("etcd did not answer after the drill: %w", err)
}

// memberNames lists etcd's members (linearizable), sorted. It asks only
// the nodes whose link is up: a request balanced onto a powered-off
// member would hang until its deadline.
func (l *Lab) memberNames(ctx context.Context) ([]string, error) {
	var eps []string
	for _, n := range l.st.Nodes {
		if !n.Cut {
			eps = append(eps, fmt.Sprintf("http://%s:%d", n.IP, etcdClientPort))
		}
	}
	cli, err := etcdClient(eps)
	if err != nil {
		return nil, err
	}
	defer cli.Close()
	mctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	resp, err := cli.MemberList(mctx)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, m := range resp.Members {
		names = append(names, m.Name)
	}
	slices.Sort(names)
	return names, nil
}

// etcdClientPort is the lab's etcd client port.
const etcdClientPort = 2379

// labTable is the nftables table the drills put their rules in, in a
// node's namespace.
const labTable = "vigil_lab"

// block drops packets matching match at hook (input or output) in n's
// namespace.
func (l *Lab) block(ctx context.Context, n *Node, hook, match string) error {
	if err := needNft("this drill's firewall rule"); err != nil {
		return err
	}
	script := fmt.Sprintf("table inet %s {\n\tchain drill_%s {\n\t\ttype filter hook %s priority 0; policy accept;\n\t\t%s drop\n\t}\n}\n", labTable, hook, hook, match)
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", nodeNS(n.Name), "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("nft in %s: %w: %s", n.Name, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// unblock removes every rule block added in n's namespace.
func (l *Lab) unblock(n *Node) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ip", "netns", "exec", nodeNS(n.Name), "nft", "delete", "table", "inet", labTable).CombinedOutput()
	if err != nil && !strings.Contains(string(out), "No such file") {
		return fmt.Errorf("nft in %s: %w: %s", n.Name, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// sighting is what one vigil's published view says of one member.
type sighting struct {
	Reachable  bool  `json:"reachable"`
	DownMillis int64 `json:"downMs"`
}

// viewsOf returns every vigil's published view of member name, by
// observer, and the members whose raft transport hears from it, as
// `vigil members list` (run on node from) shows them.
func (l *Lab) viewsOf(ctx context.Context, from, name string) (map[string]sighting, []string, error) {
	out, err := l.vigilMembers(ctx, from, "list", "-o", "json")
	if err != nil {
		return nil, nil, err
	}
	var ms []struct {
		Name   string              `json:"name"`
		SeenBy map[string]sighting `json:"seenBy"`
		Raft   *struct {
			LinkedFrom []string `json:"linkedFrom"`
		} `json:"raft"`
	}
	if err := json.Unmarshal([]byte(out), &ms); err != nil {
		return nil, nil, fmt.Errorf("vigil members list -o json: %w", err)
	}
	for _, m := range ms {
		if m.Name == name {
			var linked []string
			if m.Raft != nil {
				linked = m.Raft.LinkedFrom
			}
			return m.SeenBy, linked, nil
		}
	}
	return nil, nil, errors.New("no member " + name)
}

func describeViews(v map[string]sighting) string {
	var parts []string
	for _, o := range slices.Sorted(maps.Keys(v)) {
		if v[o].Reachable {
			parts = append(parts, o+" reaches it")
		} else {
			parts = append(parts, fmt.Sprintf("%s: down %.1fs", o, float64(v[o].DownMillis)/1000))
		}
	}
	return strings.Join(parts, ", ")
}
