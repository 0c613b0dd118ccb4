package membership

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
)

// Prune removes members that have been unreachable for at least minDown,
// one at a time, reading the cluster again before each removal and applying
// CheckRemove every time, so it never removes below a healthy quorum and
// two prunes at once (or two VIP holders in a row) never remove more than
// the rules allow. With dryRun it only says what it would do.
func (c *Cluster) Prune(ctx context.Context, minDown time.Duration, dryRun bool, say func(string, ...any)) ([]Member, error) {
	var removed []Member
	toldUnknown := map[uint64]bool{}
	for {
		v, err := c.View(ctx)
		if err != nil {
			return removed, err
		}
		dead, unknown := v.Dead(minDown, time.Now())
		for _, m := range unknown {
			if !toldUnknown[m.ID] {
				toldUnknown[m.ID] = true
				say("%s is unreachable but was never recorded healthy, so how long it has been down is unknown; not pruning it (vigil members remove %s removes it by hand)", m.Label(), m.IDString())
			}
		}
		if len(dead) == 0 {
			if len(removed) == 0 {
				say("nothing to prune: no member has been down for %v", minDown)
			}
			return removed, nil
		}
		if dryRun {
			for _, m := range dead {
				if err := v.CheckRemove(m, false); err != nil {
					say("would not remove %s, down since %s: %v", m.Label(), m.LastHealthy.Format(time.RFC3339), err)
					continue
				}
				say("would remove %s, down since %s", m.Label(), m.LastHealthy.Format(time.RFC3339))
				v = v.without(m.ID)
			}
			return nil, nil
		}
		m := dead[0]
		say("%s has been down since %s (%v)", m.Label(), m.LastHealthy.Format(time.RFC3339), time.Since(m.LastHealthy).Round(time.Second))
		if err := c.remove(ctx, v, m, false, say); err != nil {
			return removed, err
		}
		removed = append(removed, m)
	}
}

func (v View) without(id uint64) View {
	out := View{LeaderID: v.LeaderID}
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
		return "", "", fmt.Errorf("%w: --with %q must be NAME=PEER_URL, e.g. cp4=https://10.0.0.14:2380", ErrInvalid, s)
	}
	u, err := url.Parse(peerURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" || u.Port() == "" || (u.Path != "" && u.Path != "/") {
		return "", "", fmt.Errorf("%w: peer URL %q must look like https://HOST:2380", ErrInvalid, peerURL)
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
func (c *Cluster) Replace(ctx context.Context, rc ReplaceConfig, say func(string, ...any)) error {
	if _, _, err := ParseNewMember(rc.NewName + "=" + rc.NewPeer); err != nil {
		return err
	}
	v, err := c.View(ctx)
	if err != nil {
		return err
	}
	old, oldErr := v.Find(rc.Old)
	if oldErr == nil && slices.Contains(old.PeerURLs, rc.NewPeer) {
		return fmt.Errorf("%w: %s already has peer URL %s", ErrInvalid, old.Label(), rc.NewPeer)
	}
	for _, m := range v.Members {
		if m.Name == rc.NewName && !slices.Contains(m.PeerURLs, rc.NewPeer) {
			return fmt.Errorf("%w: a member named %s with other peer URLs %v exists already", ErrInvalid, rc.NewName, m.PeerURLs)
		}
	}
	if oldErr != nil {
		say("step 1: %s is not a member (removed earlier); going on with %s", rc.Old, rc.NewName)
	} else if !old.Reachable {
		say("step 1: %s is down: removing it before adding %s", old.Label(), rc.NewName)
		if err := c.remove(ctx, v, old, false, say); err != nil {
			return err
		}
	} else {
		say("step 1: %s is healthy: it stays until %s has joined as a voter", old.Label(), rc.NewName)
	}
	newM, err := c.addLearner(ctx, rc, say)
	if err != nil {
		return err
	}
	if err := c.promote(ctx, newM, rc, say); err != nil {
		return err
	}
	if oldErr == nil && old.Reachable {
		say("step 4: removing %s", old.Label())
		v, err := c.View(ctx)
		if err != nil {
			return err
		}
		cur, err := v.Find(old.IDString())
		if err != nil {
			say("%s was already removed", old.Label())
		} else if err := c.remove(ctx, v, cur, true, say); err != nil {
			return err
		}
	}
	say("done: %s replaced %s", rc.NewName, rc.Old)
	return nil
}

// addLearner announces the new member as a learner unless a member with its
// peer URL exists already, and calls OnAdded with its initial cluster.
func (c *Cluster) addLearner(ctx context.Context, rc ReplaceConfig, say func(string, ...any)) (Member, error) {
	resp, err := c.cli.MemberList(ctx)
	if err != nil {
		return Member{}, fmt.Errorf("read the etcd member list: %w", err)
	}
	var existing *Member
	initial := []string{}
	for _, m := range resp.Members {
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
		say("step 2: %s is a member already (%s); not adding it again", rc.NewName, map[bool]string{true: "learner", false: "voter"}[existing.Learner])
	} else {
		say("step 2: adding %s (%s) as a learner", rc.NewName, rc.NewPeer)
		add, err := c.cli.MemberAddAsLearner(ctx, []string{rc.NewPeer})
		// etcd refuses membership changes ("unhealthy cluster") until
		// every member has been connected for 5 s, e.g. just after one
		// restarted; that passes.
		for deadline := time.Now().Add(unhealthyWait); errors.Is(err, rpctypes.ErrUnhealthy) && time.Now().Before(deadline); {
			say("etcd reports an unhealthy cluster (a member connected only moments ago?); retrying")
			select {
			case <-ctx.Done():
				return Member{}, ctx.Err()
			case <-time.After(time.Second):
			}
			add, err = c.cli.MemberAddAsLearner(ctx, []string{rc.NewPeer})
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
		say("start etcd on the new node with: --name %s --initial-advertise-peer-urls %s --initial-cluster %s --initial-cluster-state existing", rc.NewName, rc.NewPeer, ic)
		if rc.OnAdded != nil {
			rc.OnAdded(ic)
		}
	}
	return *existing, nil
}

// unhealthyWait bounds the retries of a change etcd refused as "unhealthy
// cluster": it holds changes back for 5 s after a member connects.
const unhealthyWait = 15 * time.Second

// promote waits until the learner has caught up and promotes it.
func (c *Cluster) promote(ctx context.Context, m Member, rc ReplaceConfig, say func(string, ...any)) error {
	if !m.Learner {
		say("step 3: %s is a voter already", rc.NewName)
		return nil
	}
	say("step 3: waiting for %s to start and catch up, then promoting it (up to %v)", rc.NewName, rc.Timeout)
	deadline := time.Now().Add(rc.Timeout)
	lastSaid := time.Now()
	for {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := c.cli.MemberPromote(pctx, m.ID)
		cancel()
		switch {
		case err == nil:
			say("promoted %s to voter", rc.NewName)
			return nil
		case errors.Is(err, rpctypes.ErrMemberNotLearner):
			say("%s is a voter already", rc.NewName)
			return nil
		case errors.Is(err, rpctypes.ErrMemberNotFound):
			return fmt.Errorf("%w: %s disappeared from the member list while waiting for it", ErrRefused, rc.NewName)
		case ctx.Err() != nil:
			return ctx.Err()
		case time.Now().After(deadline):
			return fmt.Errorf("%s did not catch up within %v (last answer: %w); it stays a learner, which does not affect quorum. Start its etcd, then run the same command again", rc.NewName, rc.Timeout, err)
		}
		if time.Since(lastSaid) > 10*time.Second {
			say("still waiting for %s: %v", rc.NewName, err)
			lastSaid = time.Now()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}
