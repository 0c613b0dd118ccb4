package membership

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/vigil-ha/vigil/internal/etcdcluster"
	"github.com/vigil-ha/vigil/internal/validate"
)

// PruneConfig says what Prune may remove.
type PruneConfig struct {
	// MinDown is how long a majority of the voters must have seen a
	// member unreachable.
	MinDown time.Duration
	// DryRun only says what would be removed.
	DryRun bool
	// Force removes every member unreachable from here, whatever the
	// reports say (vigil members prune --force). The quorum rules still
	// apply.
	Force bool
	// Self is this process's own view (vigil run). It stands in for the
	// published one, and it must itself show a member unreachable for
	// MinDown, or the member is not removed.
	Self *Report
	// Fresh tells whether an observer's report is fresh.
	Fresh func(observer string) bool
	// View, when set, is a view read a moment ago, used for the first
	// decision instead of reading another; every later one is read anew.
	View *View
	// OnRemoved, when set, is called right after each removal.
	OnRemoved func(Member)
	// Veto, when set, is asked about each member just before it would be
	// removed; a non-empty answer says why it must not be (something
	// else manages that machine's membership) and keeps it.
	Veto func(ctx context.Context, m Member) string
}

// Prune removes the unreachable members that a majority of the voters
// agree have been unreachable for at least MinDown, one at a time, reading
// the cluster again before each removal and applying CheckRemove every
// time. It never removes below a healthy quorum, and two prunes at once
// (or two VIP holders in a row) never remove more than the rules allow.
// It returns the members removed and the evidence about every member still
// unreachable, so the caller can say why each stays.
func (c *Cluster) Prune(ctx context.Context, pc PruneConfig, say Reporter) ([]Member, []Case, error) {
	var removed []Member
	for first := true; ; first = false {
		var v View
		var err error
		if first && pc.View != nil {
			v = *pc.View
		} else if v, err = c.View(ctx); err != nil {
			return removed, nil, err
		}
		if v.raftUnchecked() {
			c.CheckRaft(ctx, &v)
		}
		cases := v.Cases(pc)
		var next *Case
		for i, cs := range cases {
			if pc.DryRun {
				if cs.Removable(pc) {
					if why := pc.veto(ctx, cs.Member); why != "" {
						say.say(EventVetoed, cs.Member.Label(), "would not remove %s: %s", cs.Member.Label(), why)
						continue
					}
					if err := v.CheckRemove(cs.Member, false); err != nil {
						say.say(EventWouldKeep, cs.Member.Label(), "would not remove %s: %v", cs.Member.Label(), err)
						continue
					}
					say.say(EventWouldRemove, cs.Member.Label(), "would remove %s: %s", cs.Member.Label(), cs.Evidence())
					v = v.without(cs.Member.ID)
				}
				continue
			}
			if next == nil && cs.Removable(pc) {
				if why := pc.veto(ctx, cs.Member); why != "" {
					say.say(EventVetoed, cs.Member.Label(), "not removing %s: %s", cs.Member.Label(), why)
					continue
				}
				next = &cases[i]
			}
		}
		if pc.DryRun || next == nil {
			return removed, cases, nil
		}
		if pc.Force && next.Verdict != Agreed {
			say.say(EventEvidence, next.Member.Label(), "%s is unreachable from here; removing it by --force, although %s", next.Member.Label(), next.Evidence())
		} else {
			say.say(EventEvidence, next.Member.Label(), "%s: %s", next.Member.Label(), next.Evidence())
		}
		if err := c.remove(ctx, v, next.Member, false, say); err != nil {
			return removed, cases, err
		}
		removed = append(removed, next.Member)
		if pc.OnRemoved != nil {
			pc.OnRemoved(next.Member)
		}
	}
}

// Cases weighs the evidence about every member unreachable in v. A member
// that never started (no name yet: added, its etcd not running) has no
// case: nothing proves how long it has been down.
func (v View) Cases(pc PruneConfig) []Case {
	reports := slices.Clone(v.Reports)
	fresh := pc.Fresh
	if pc.Self != nil {
		reports = slices.DeleteFunc(reports, func(r Report) bool { return r.Observer == pc.Self.Observer })
		reports = append(reports, *pc.Self)
		fresh = func(o string) bool { return o == pc.Self.Observer || (pc.Fresh != nil && pc.Fresh(o)) }
	}
	if fresh == nil {
		fresh = func(string) bool { return false }
	}
	var out []Case
	for _, m := range v.Members {
		if m.Reachable || m.Name == "" {
			continue
		}
		cs := v.Judge(m, pc.MinDown, reports, fresh)
		if pc.Self != nil {
			s := pc.Self.Members[m.IDString()]
			cs.SelfDownMillis = s.DownMillis
		}
		out = append(out, cs)
	}
	return out
}

func (pc PruneConfig) veto(ctx context.Context, m Member) string {
	if pc.Veto == nil {
		return ""
	}
	return pc.Veto(ctx, m)
}

// Removable tells whether Prune may remove the member of c under pc.
// Never while raft may still have it (RaftHolds), not even with Force.
func (c Case) Removable(pc PruneConfig) bool {
	switch {
	case c.RaftHolds() != "":
		return false
	case pc.Force:
		return true
	case pc.Self != nil && c.SelfDownMillis < pc.MinDown.Milliseconds():
		return false // this process has not itself seen it down long enough
	default:
		return c.Verdict == Agreed
	}
}

// RaftHolds says why raft may still have the member of c ("" when the
// answering members' transports have all stopped hearing from it): its
// messages still arriving at one of them, or no counts that show it silent.
func (c Case) RaftHolds() string {
	r := c.Member.Raft
	switch {
	case r == nil:
		return "raft's view of it was not read"
	case r.Linked():
		return "raft still has a working link with it, " + r.String() + ": its client port is filtered or too busy to answer, not the member gone"
	case !r.Known():
		return "cannot tell whether raft still has it: " + r.String()
	}
	return ""
}

// raftUnchecked tells whether v has an unreachable started member whose
// raft links were not read.
func (v View) raftUnchecked() bool {
	for _, m := range v.Members {
		if !m.Reachable && m.Name != "" && m.Raft == nil {
			return true
		}
	}
	return false
}

func (v View) without(id uint64) View {
	out := View{LeaderID: v.LeaderID, RaftLeader: v.RaftLeader}
	for _, m := range v.Members {
		if m.ID != id {
			out.Members = append(out.Members, m)
		}
	}
	return out
}

// ParseNewMember parses NAME=PEER_URL.
func ParseNewMember(s string) (name, peerURL string, err error) {
	name, peerURL, ok := strings.Cut(s, "=")
	if !ok || name == "" || peerURL == "" {
		return "", "", fmt.Errorf("%w: `with` %q must be NAME=PEER_URL, e.g. cp4=https://10.0.0.14:2380", validate.ErrInvalid, s)
	}
	if err := validate.PeerURL(peerURL); err != nil {
		return "", "", fmt.Errorf("%w: %w", validate.ErrInvalid, err)
	}
	return name, peerURL, nil
}

// ReplaceConfig describes a replacement.
type ReplaceConfig struct {
	Old     string // name or ID of the member to replace
	NewName string
	NewPeer string
	// Timeout bounds the wait for the new member to start and catch up.
	Timeout time.Duration
	// OnAdded is called once the new member is announced, with the
	// --initial-cluster value its etcd must start with (the lab starts it
	// here; a person starts it by hand, from what Replace prints).
	OnAdded func(initialCluster string)
}

// Replace swaps Old for a new member in the order the etcd documentation
// gives for each case:
//
//   - Old is dead: remove it first (a dead voter plus a new, not yet
//     started one would need a larger quorum), then add the new member as a
//     learner, wait until it has caught up, promote it.
//   - Old is healthy: add the new member as a learner, wait until it has
//     caught up, promote it, then remove Old (moving raft leadership off it
//     first if it leads).
//
// Every step first looks at what is already done, so Replace can be run
// again after an interruption at any point and does no harm.
func (c *Cluster) Replace(ctx context.Context, rc ReplaceConfig, say Reporter) error {
	if _, _, err := ParseNewMember(rc.NewName + "=" + rc.NewPeer); err != nil {
		return err
	}
	v, err := c.View(ctx)
	if err != nil {
		return err
	}
	old, oldErr := v.Find(rc.Old)
	if oldErr == nil && slices.Contains(old.PeerURLs, rc.NewPeer) {
		return fmt.Errorf("%w: %s already has peer URL %s", validate.ErrInvalid, old.Label(), rc.NewPeer)
	}
	for _, m := range v.Members {
		if m.Name == rc.NewName && !slices.Contains(m.PeerURLs, rc.NewPeer) {
			return fmt.Errorf("%w: a member named %s with other peer URLs %v exists already", validate.ErrInvalid, rc.NewName, m.PeerURLs)
		}
	}
	if oldErr != nil {
		say.say(EventStep, rc.Old, "step 1: %s is not a member (removed earlier); going on with %s", rc.Old, rc.NewName)
	} else if !old.Reachable {
		say.say(EventStep, old.Label(), "step 1: %s is down: removing it before adding %s", old.Label(), rc.NewName)
		if err := c.remove(ctx, v, old, false, say); err != nil {
			return err
		}
	} else {
		say.say(EventStep, old.Label(), "step 1: %s is healthy: it stays until %s has joined as a voter", old.Label(), rc.NewName)
	}
	newM, err := c.addLearner(ctx, rc, say)
	if err != nil {
		return err
	}
	if err := c.promote(ctx, newM, rc, say); err != nil {
		return err
	}
	if oldErr == nil && old.Reachable {
		say.say(EventStep, old.Label(), "step 4: removing %s", old.Label())
		v, err := c.View(ctx)
		if err != nil {
			return err
		}
		cur, err := v.Find(old.IDString())
		if err != nil {
			say.say(EventAlreadyGone, old.Label(), "%s was already removed", old.Label())
		} else if err := c.remove(ctx, v, cur, true, say, newM.ID); err != nil {
			return err
		}
	}
	say.say(EventDone, rc.NewName, "done: %s replaced %s", rc.NewName, rc.Old)
	return nil
}

// addLearner announces the new member as a learner unless a member with its
// peer URL exists already, and calls OnAdded with its initial cluster.
func (c *Cluster) addLearner(ctx context.Context, rc ReplaceConfig, say Reporter) (Member, error) {
	members, err := c.cl.FreshMemberList(ctx)
	if err != nil {
		return Member{}, fmt.Errorf("read the etcd member list: %w", err)
	}
	var existing *Member
	initial := []string{}
	for _, m := range members {
		name := m.Name
		if slices.Contains(m.PeerURLs, rc.NewPeer) {
			existing = &Member{ID: m.ID, Name: m.Name, PeerURLs: m.PeerURLs, Learner: m.IsLearner}
			name = rc.NewName
		}
		if name == "" {
			continue // another member announced but not started
		}
		for _, p := range m.PeerURLs {
			initial = append(initial, name+"="+p)
		}
	}
	if existing != nil {
		say.say(EventStep, rc.NewName, "step 2: %s is a member already (%s); not adding it again", rc.NewName, map[bool]string{true: "learner", false: "voter"}[existing.Learner])
	} else {
		say.say(EventStep, rc.NewName, "step 2: adding %s (%s) as a learner", rc.NewName, rc.NewPeer)
		add, err := c.addAsLearner(ctx, rc.NewPeer)
		// etcd refuses membership changes ("unhealthy cluster") until
		// every member has been connected for 5 s, e.g. just after one
		// restarted; that passes.
		for deadline := time.Now().Add(unhealthyWait); errors.Is(err, rpctypes.ErrUnhealthy) && time.Now().Before(deadline); {
			say.say(EventUnhealthy, rc.NewName, "etcd reports an unhealthy cluster (a member connected only moments ago?); retrying")
			select {
			case <-ctx.Done():
				return Member{}, ctx.Err()
			case <-time.After(time.Second):
			}
			add, err = c.addAsLearner(ctx, rc.NewPeer)
		}
		if err != nil {
			return Member{}, fmt.Errorf("add %s as a learner: %w", rc.NewName, err)
		}
		existing = &Member{ID: add.Member.ID, Name: rc.NewName, PeerURLs: add.Member.PeerURLs, Learner: true}
		initial = append(initial, rc.NewName+"="+rc.NewPeer)
	}
	slices.Sort(initial)
	ic := strings.Join(initial, ",")
	if existing.Learner {
		if err := c.awaitKnown(ctx, existing.ID, rc.NewName, say); err != nil {
			return Member{}, err
		}
		say.say(EventStartEtcd, rc.NewName, "start etcd on the new node with: --name %s --initial-advertise-peer-urls %s --initial-cluster %s --initial-cluster-state existing", rc.NewName, rc.NewPeer, ic)
		if rc.OnAdded != nil {
			rc.OnAdded(ic)
		}
	}
	return *existing, nil
}

// awaitKnown waits until every member that answers lists the new member:
// its etcd asks one of them for the cluster when it starts and gives up
// when that one has not applied the addition yet. Applying takes
// milliseconds; a member still behind after knownWait is reported and
// left, since waiting on does not help a member that is stuck.
func (c *Cluster) awaitKnown(ctx context.Context, id uint64, name string, say Reporter) error {
	deadline := time.Now().Add(knownWait)
	for {
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		behind := c.cl.Unaware(actx, id)
		cancel()
		if len(behind) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			say.say(EventWaiting, name, "%v do not list %s yet; if its etcd refuses to start (\"member count is unequal\"), start it again", behind, name)
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// knownWait bounds awaitKnown: members apply an addition within
// milliseconds of its commit when they are healthy.
const knownWait = 5 * time.Second

// addAsLearner announces peer as a learner, through one member only: the
// same addition through two would add two members.
func (c *Cluster) addAsLearner(ctx context.Context, peer string) (*clientv3.MemberAddResponse, error) {
	return etcdcluster.OnLeader(ctx, c.cl, func(ctx context.Context, cli *clientv3.Client) (*clientv3.MemberAddResponse, error) {
		return cli.MemberAddAsLearner(ctx, []string{peer})
	})
}

// unhealthyWait bounds the retries of a change etcd refused as "unhealthy
// cluster": it holds changes back for 5 s after a member connects.
const unhealthyWait = 15 * time.Second

// promote waits until the learner has caught up and promotes it.
func (c *Cluster) promote(ctx context.Context, m Member, rc ReplaceConfig, say Reporter) error {
	if !m.Learner {
		say.say(EventStep, rc.NewName, "step 3: %s is a voter already", rc.NewName)
		return nil
	}
	say.say(EventStep, rc.NewName, "step 3: waiting for %s to start and catch up, then promoting it (up to %v)", rc.NewName, rc.Timeout)
	deadline := time.Now().Add(rc.Timeout)
	lastSaid := time.Now()
	for {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := etcdcluster.OnLeader(pctx, c.cl, func(ctx context.Context, cli *clientv3.Client) (*clientv3.MemberPromoteResponse, error) {
			return cli.MemberPromote(ctx, m.ID)
		})
		cancel()
		switch {
		case err == nil:
			say.say(EventPromoted, rc.NewName, "promoted %s to voter", rc.NewName)
			return nil
		case errors.Is(err, rpctypes.ErrMemberNotLearner):
			say.say(EventPromoted, rc.NewName, "%s is a voter already", rc.NewName)
			return nil
		case errors.Is(err, rpctypes.ErrMemberNotFound):
			return fmt.Errorf("%w: %s disappeared from the member list while waiting for it", ErrRefused, rc.NewName)
		case ctx.Err() != nil:
			return ctx.Err()
		case time.Now().After(deadline):
			return fmt.Errorf("%s did not catch up within %v (last answer: %w); it stays a learner, which does not affect quorum. Start its etcd, then run the same command again", rc.NewName, rc.Timeout, err)
		}
		if time.Since(lastSaid) > 10*time.Second {
			say.say(EventWaiting, rc.NewName, "still waiting for %s: %v", rc.NewName, err)
			lastSaid = time.Now()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}
