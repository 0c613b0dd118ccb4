// Package membership changes etcd membership safely: it lists members with
// their health, removes a member only when the cluster keeps a healthy
// quorum, prunes members that have been down for long, and replaces a node
// in the order the etcd documentation prescribes.
//
// Health: a member is reachable when its client URL answers Status within
// StatusTimeout. Every vigil run observes every member and publishes its
// own view in etcd (under ReportPrefix): how long it has seen each member
// unreachable without a break, on its own monotonic clock. A member is
// pruned only when a majority of the voters' views agree that it has been
// unreachable for the whole period (evidence.go). A member that never
// started (no name yet) is never pruned automatically.
package membership

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/vigil-ha/vigil"
	"github.com/vigil-ha/vigil/internal/etcdcluster"
	"github.com/vigil-ha/vigil/internal/validate"
)

// DefaultReportPrefix is where each vigil publishes its view of the
// members, one key per node.
const DefaultReportPrefix = "/vigil/member-views/"

// reportTTL is the lease of a published report: the report of a vigil that
// stopped without withdrawing it vanishes after this. Readers do not rely
// on it for freshness (etcd extends leases when its leader changes); they
// watch the sequence number move.
const reportTTL = 10 * time.Second

// memberListTimeout bounds one try at the member list, memberListTries
// the tries. A linearizable read answers in a raft round trip; a second
// also covers the election of a new raft leader.
const (
	memberListTimeout = time.Second
	memberListTries   = 3
)

// publishTimeout bounds the publication of a report (a lease renewal and
// a put, two raft round trips).
const publishTimeout = time.Second

// DefaultStatusTimeout bounds one member's Status call. A live member on a
// LAN answers in milliseconds; a second tells a dead one apart without
// making `members list` slow.
const DefaultStatusTimeout = time.Second

// Config configures a Cluster.
type Config struct {
	Endpoints []string
	TLS       *tls.Config
	// Etcd, when set, is the process's etcd connection, shared (Endpoints
	// and TLS are then unused, and Close leaves it open). Views then use
	// the shared member list, read no longer than its interval ago;
	// without it (one-shot commands) every view reads the list afresh.
	Etcd          *etcdcluster.Cluster
	ReportPrefix  string
	StatusTimeout time.Duration
	// VIPHolder, when set, names the node that holds the VIP (the lock
	// record's holder; "" when none does). Remove then keeps raft
	// leadership off that node's etcd member when it moves leadership off
	// the member it removes (View.transferTarget). Optional.
	VIPHolder func(context.Context) (string, error)
}

// Cluster talks to etcd about its membership.
type Cluster struct {
	cfg Config
	cl  *etcdcluster.Cluster
	own bool // cl was made by New: Close closes it, and every view is fresh
	log *slog.Logger

	mu    sync.Mutex       // guards lease and traffic
	lease clientv3.LeaseID // of this process's published report; 0 before the first
	// traffic is the last read of each answering member's raft counts
	// (raft.go), by member ID.
	traffic map[uint64]traffic
	// publish and reports carry the observer's rounds (Publish, Reports)
	// through one member while it answers: see etcdcluster.Path.
	publish, reports etcdcluster.Path
}

// New connects (lazily) to the endpoints, or uses cfg.Etcd.
func New(cfg Config, log *slog.Logger) (*Cluster, error) {
	if cfg.ReportPrefix == "" {
		cfg.ReportPrefix = DefaultReportPrefix
	}
	if cfg.StatusTimeout == 0 {
		cfg.StatusTimeout = DefaultStatusTimeout
	}
	if cfg.Etcd != nil {
		return &Cluster{cfg: cfg, cl: cfg.Etcd, log: log}, nil
	}
	if err := validate.EtcdEndpoints(cfg.Endpoints); err != nil {
		return nil, fmt.Errorf("%w: %w", validate.ErrInvalid, err)
	}
	// A one-shot command keeps no stream open: keepalive pings more often
	// than etcd's --grpc-keepalive-min-time would be refused.
	// It must also diagnose a cluster that lost its majority: the cluster
	// ID is taken from a minority when no majority answers.
	cl, err := etcdcluster.New(etcdcluster.Config{Endpoints: cfg.Endpoints, TLS: cfg.TLS, KeepAlive: 30 * time.Second, Provisional: true}, log)
	if err != nil {
		return nil, fmt.Errorf("etcd client: %w", err)
	}
	return &Cluster{cfg: cfg, cl: cl, own: true, log: log}, nil
}

// Etcd is the connection the Cluster works through.
func (c *Cluster) Etcd() *etcdcluster.Cluster { return c.cl }

// Close closes the connection if New made it.
func (c *Cluster) Close() error {
	if c.own {
		c.cl.Close()
	}
	return nil
}

// View reads the member list (linearizable), asks every member for its
// status and reads the published reports. With a shared connection the
// member list may be as old as its interval; see Config.Etcd.
func (c *Cluster) View(ctx context.Context) (View, error) { return c.view(ctx, c.own) }

func (c *Cluster) view(ctx context.Context, fresh bool) (View, error) {
	var members []*pb.Member
	var err error
	lctx, cancel := context.WithTimeout(ctx, memberListTimeout*memberListTries)
	if fresh {
		members, err = c.cl.FreshMemberList(lctx)
	} else {
		members, err = c.cl.MemberList(lctx)
	}
	cancel()
	if err != nil && ctx.Err() == nil {
		// No quorum, perhaps: a member's own (serializable) list still
		// shows what is wrong, and CheckRemove then refuses with reason.
		sctx, cancel := context.WithTimeout(ctx, memberListTimeout)
		members, err = c.cl.LocalMemberList(sctx)
		cancel()
	}
	if err != nil {
		return View{}, fmt.Errorf("read the etcd member list (is etcd reachable at %s?): %w", strings.Join(c.cl.Endpoints(), ","), err)
	}
	v := View{}
	for _, m := range members {
		v.Members = append(v.Members, Member{ID: m.ID, Name: m.Name, PeerURLs: m.PeerURLs, ClientURLs: m.ClientURLs, Learner: m.IsLearner})
	}
	var wg sync.WaitGroup
	v.AskedAt = time.Now()
	for i := range v.Members {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.status(ctx, &v.Members[i])
		}()
	}
	wg.Wait()
	v.AnsweredAt = time.Now()
	var leaderIndex uint64
	seen := map[uint64]int{}
	for _, m := range v.Members {
		if m.Leader {
			v.LeaderID, leaderIndex = m.ID, m.RaftIndex
		}
		if m.leaderSeen != 0 {
			seen[m.leaderSeen]++
		}
	}
	// The leader the answering members follow, even when it does not
	// answer itself: most of them name it.
	for id, n := range seen {
		if n > seen[v.RaftLeader] {
			v.RaftLeader = id
		}
	}
	for i := range v.Members {
		if m := &v.Members[i]; m.Reachable && leaderIndex > m.RaftIndex {
			m.Lag = leaderIndex - m.RaftIndex
		}
	}
	rctx, cancel := context.WithTimeout(ctx, memberListTimeout)
	v.Reports, err = c.Reports(rctx)
	cancel()
	if err != nil {
		// Without quorum the reports cannot be read; the view is still
		// good for refusing with a reason.
		c.log.Debug("cannot read member reports", "err", err)
	}
	for i := range v.Members {
		m := &v.Members[i]
		for _, r := range v.Reports {
			if s, ok := r.Members[m.IDString()]; ok {
				if m.SeenBy == nil {
					m.SeenBy = map[string]Sighting{}
				}
				m.SeenBy[r.Observer] = s
			}
		}
	}
	slices.SortFunc(v.Members, func(a, b Member) int { return strings.Compare(a.Name+a.IDString(), b.Name+b.IDString()) })
	return v, nil
}

// status fills in what m's own client URLs say.
func (c *Cluster) status(ctx context.Context, m *Member) {
	if len(m.ClientURLs) == 0 {
		m.Error = "not started (no client URL yet)"
		return
	}
	var errs []string
	for _, ep := range m.ClientURLs {
		sctx, cancel := context.WithTimeout(ctx, c.cfg.StatusTimeout)
		st, err := c.cl.StatusOf(sctx, ep)
		cancel()
		if err != nil {
			errs = append(errs, err.Error())
			continue
		}
		m.Reachable = true
		m.endpoint = ep
		m.leaderSeen = st.Leader
		m.Leader = st.Leader == m.ID
		m.RaftIndex = st.RaftIndex
		m.DBSize = st.DBSize
		m.Error = ""
		return
	}
	m.Error = strings.Join(errs, "; ")
}

// Reports reads every published report.
func (c *Cluster) Reports(ctx context.Context) ([]Report, error) {
	resp, err := etcdcluster.Via(ctx, c.cl, &c.reports, func(ctx context.Context, m *etcdcluster.Member) (*clientv3.GetResponse, error) {
		return m.Client.Get(ctx, c.cfg.ReportPrefix, clientv3.WithPrefix())
	})
	if err != nil {
		return nil, fmt.Errorf("read member reports: %w", err)
	}
	var out []Report
	for _, kv := range resp.Kvs {
		var r Report
		if err := json.Unmarshal(kv.Value, &r); err != nil || r.Observer == "" {
			c.log.Debug("ignoring a malformed member report", "key", string(kv.Key), "err", err)
			continue
		}
		out = append(out, r)
	}
	return out, nil
}

// Publish writes r as this process's report, on a lease it keeps alive
// with every write, so the report of a vigil that died goes away.
func (c *Cluster) Publish(ctx context.Context, r Report) error {
	r.Format = vigil.RecordFormat
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	// Each call is short: one hung on a member that just died must not
	// stall the observer's rounds, or its counts restart.
	ctx, cancel := context.WithTimeout(ctx, publishTimeout)
	defer cancel()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lease != 0 {
		if _, err := etcdcluster.ViaUntil(ctx, c.cl, &c.publish, func(ctx context.Context, m *etcdcluster.Member) (*clientv3.LeaseKeepAliveResponse, error) {
			return m.Client.KeepAliveOnce(ctx, c.lease)
		}, leaseNotFound); err != nil {
			if !errors.Is(err, rpctypes.ErrLeaseNotFound) {
				return fmt.Errorf("renew the member report's lease: %w", err)
			}
			c.lease = 0 // expired while etcd was out of reach
		}
	}
	if c.lease == 0 {
		// Through one member: a grant through each would leave extra leases.
		g, err := etcdcluster.OnLeader(ctx, c.cl, func(ctx context.Context, cli *clientv3.Client) (*clientv3.LeaseGrantResponse, error) {
			return cli.Grant(ctx, int64(reportTTL/time.Second))
		})
		if err != nil {
			return fmt.Errorf("grant the member report's lease: %w", err)
		}
		c.lease = g.ID
	}
	// Through one member while it answers (etcdcluster.Path): one raft
	// proposal per report, every observer round.
	if _, err := etcdcluster.Via(ctx, c.cl, &c.publish, func(ctx context.Context, m *etcdcluster.Member) (*clientv3.PutResponse, error) {
		return m.Client.Put(ctx, c.cfg.ReportPrefix+r.Observer, string(b), clientv3.WithLease(c.lease))
	}); err != nil {
		return fmt.Errorf("publish the member report: %w", err)
	}
	return nil
}

// Withdraw deletes this process's report (at shutdown): a stopped vigil
// testifies to nothing.
func (c *Cluster) Withdraw(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lease == 0 {
		return nil
	}
	_, err := etcdcluster.Do(ctx, c.cl, func(ctx context.Context, m *etcdcluster.Member) (*clientv3.LeaseRevokeResponse, error) {
		return m.Client.Revoke(ctx, c.lease)
	})
	c.lease = 0
	return err
}

// Remove removes the member named or numbered nameOrID if CheckRemove allows
// it, moving raft leadership away first when it leads. A member that is
// already gone is not an error when it was found by ID.
func (c *Cluster) Remove(ctx context.Context, nameOrID string, force bool, say Reporter) error {
	v, err := c.view(ctx, true)
	if err != nil {
		return err
	}
	m, err := v.Find(nameOrID)
	if err != nil {
		return err
	}
	return c.remove(ctx, v, m, force, say)
}

// remove removes m (see Remove). When it moves raft leadership off m, it
// keeps it off the members in avoid and off the VIP holder's member where
// it can (View.transferTarget).
func (c *Cluster) remove(ctx context.Context, v View, m Member, force bool, say Reporter, avoid ...uint64) error {
	if err := v.CheckRemove(m, force); err != nil {
		return err
	}
	// keepOff: avoid, and the VIP holder's member once known (looked up
	// only when leadership has to move).
	keepOff := slices.Clone(avoid)
	holderKnown := false
	lookHolder := func() {
		if !holderKnown {
			holderKnown = true
			if h := c.holderMember(ctx, v); h != 0 {
				keepOff = append(keepOff, h)
			}
		}
	}
	if m.Leader {
		lookHolder()
	}
	for moves, round := 0, 1; ; round++ {
		var err error
		if v, m, err = c.moveLeaderOff(ctx, v, m, keepOff, &moves, say); err != nil {
			return err
		}
		if err := v.CheckRemove(m, force); err != nil {
			return err
		}
		say.say(EventRemoving, m.Label(), "removing %s", m.Label())
		err = c.memberRemove(ctx, m, say)
		if !errors.Is(err, etcdcluster.ErrLeads) {
			return err
		}
		// Leadership came back to m after it was moved off: a VIP
		// holder shed its own leadership onto it. Removing the raft
		// leader would cost an etcd election; move it off again.
		if round >= moveLeaderAttempts || moves >= moveLeaderAttempts {
			return fmt.Errorf("%w: %s leads raft again after leadership was moved off it %d times; not removing the raft leader (an etcd election would pause every write). Try again", ErrRefused, m.Label(), moves)
		}
		lookHolder()
		if v, err = c.view(ctx, true); err != nil {
			return err
		}
		if m, err = v.Find(m.IDString()); err != nil {
			return err
		}
		say.say(EventMoveRetry, m.Label(), "%s leads raft again (leadership moved back to it meanwhile); moving it off again", m.Label())
	}
}

// holderMember returns the ID of the etcd member on the node that holds
// the VIP (Config.VIPHolder): the member its vigil reports as its own, or
// else the member named like the node. 0 when that is not known.
func (c *Cluster) holderMember(ctx context.Context, v View) uint64 {
	if c.cfg.VIPHolder == nil {
		return 0
	}
	hctx, cancel := context.WithTimeout(ctx, memberListTimeout)
	node, err := c.cfg.VIPHolder(hctx)
	cancel()
	if err != nil {
		c.log.Debug("cannot tell which node holds the VIP; moving raft leadership without regard to it", "err", err)
		return 0
	}
	if node == "" {
		return 0
	}
	name := node
	for _, r := range v.Reports {
		if r.Observer == node && r.Member != "" {
			name = r.Member
		}
	}
	for _, m := range v.Members {
		if m.Name == name {
			return m.ID
		}
	}
	return 0
}

// moveLeaderOff moves raft leadership off m while it leads, to
// v.transferTarget(m, avoid...), counting the moves in *moves, and returns
// the view and member as they are afterwards.
func (c *Cluster) moveLeaderOff(ctx context.Context, v View, m Member, avoid []uint64, moves *int, say Reporter) (View, Member, error) {
	for m.Leader {
		to, ok := v.transferTarget(m, avoid...)
		if !ok {
			return v, m, fmt.Errorf("%w: %s leads raft and no other healthy voter can take over", ErrRefused, m.Label())
		}
		say.say(EventMovingLeader, m.Label(), "%s leads raft; moving leadership to %s first", m.Label(), to.Label())
		*moves++
		merr := c.moveLeader(ctx, m, to)
		// Check again with the new leader in place. The move may also
		// have failed because leadership went elsewhere at the same time
		// (a VIP holder shedding it): what counts is that m no longer
		// leads.
		var err error
		if v, err = c.view(ctx, true); err != nil {
			return v, m, err
		}
		if m, err = v.Find(m.IDString()); err != nil {
			return v, m, err
		}
		if merr == nil || !m.Leader {
			break
		}
		// raft gives up a transfer when the transferee does not catch up
		// within an election timeout: a member that joined moments ago,
		// on a busy machine. A second later it, or the member now
		// furthest along, usually can.
		if *moves >= moveLeaderAttempts {
			return v, m, fmt.Errorf("move raft leadership off %s (%d attempts): %w", m.Label(), *moves, merr)
		}
		say.say(EventMoveRetry, m.Label(), "moving leadership failed (%v); trying again in %v", merr, moveLeaderRetry)
		select {
		case <-ctx.Done():
			return v, m, ctx.Err()
		case <-time.After(moveLeaderRetry):
		}
		if v, err = c.view(ctx, true); err != nil {
			return v, m, err
		}
		if m, err = v.Find(m.IDString()); err != nil {
			return v, m, err
		}
	}
	return v, m, nil
}

// memberRemove removes m through the raft leader, unless m leads
// (etcdcluster.ErrLeads), retrying while etcd calls the cluster unhealthy.
func (c *Cluster) memberRemove(ctx context.Context, m Member, say Reporter) error {
	var err error
	for deadline := time.Now().Add(unhealthyWait); ; {
		rctx, cancel := context.WithTimeout(ctx, removeTimeout)
		_, err = etcdcluster.OnLeaderExcept(rctx, c.cl, m.ID, func(ctx context.Context, cli *clientv3.Client) (*clientv3.MemberRemoveResponse, error) {
			return cli.MemberRemove(ctx, m.ID)
		})
		cancel()
		// "Unhealthy cluster": etcd holds changes back for 5 s after a
		// member connects, and a new raft leader (just after moving
		// leadership) counts from its own election. That passes.
		if !errors.Is(err, rpctypes.ErrUnhealthy) || time.Now().After(deadline) {
			break
		}
		say.say(EventUnhealthy, m.Label(), "etcd reports an unhealthy cluster (a member or leader changed moments ago); retrying")
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
	if errors.Is(err, etcdcluster.ErrLeads) {
		return err
	}
	if err != nil {
		// The answer can be lost while the removal went through: the
		// request may have reached the very member being removed, which
		// shuts down. Or somebody else (a concurrent prune, the previous
		// VIP holder) removed it first; etcd then answers "not found",
		// or, when both proposals race, not at all. The list tells.
		if gone, lerr := c.gone(ctx, m.ID); lerr == nil && gone {
			say.say(EventRemoved, m.Label(), "removed %s (confirmed by the member list; etcd's answer was: %v)", m.Label(), err)
			return nil
		}
		return fmt.Errorf("remove %s: %w", m.Label(), err)
	}
	say.say(EventRemoved, m.Label(), "removed %s", m.Label())
	return nil
}

// removeTimeout bounds one MemberRemove. A removal commits in one raft
// round; when two removals of the same member race, etcd may never answer
// the second, and the member list is read instead.
const removeTimeout = 5 * time.Second

// gone tells whether the member id has left the member list.
func (c *Cluster) gone(ctx context.Context, id uint64) (bool, error) {
	lctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	members, err := c.cl.FreshMemberList(lctx)
	if err != nil {
		return false, err
	}
	for _, m := range members {
		if m.ID == id {
			return false, nil
		}
	}
	return true, nil
}

// moveLeader asks the leader m to hand raft leadership to to, over the
// leader's own connection, bounded (etcdcluster.Cluster.MoveLeader).
func (c *Cluster) moveLeader(ctx context.Context, _ Member, to Member) error {
	return c.cl.MoveLeader(ctx, to.ID)
}

// moveLeaderAttempts and moveLeaderRetry: how often, and how far apart, a
// removal tries to move raft leadership off the member it removes. Each
// attempt re-reads the members and picks the voter furthest along.
const (
	moveLeaderAttempts = 3
	moveLeaderRetry    = time.Second
)

// FreshReports watches the published reports for up to wait (a one-shot
// command has no history to judge them by) and returns which observers'
// reports changed meanwhile. It returns early once every report has.
func (c *Cluster) FreshReports(ctx context.Context, wait time.Duration) (func(observer string) bool, error) {
	book := NewBook(wait)
	deadline := time.Now().Add(wait)
	for {
		rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		reports, err := c.Reports(rctx)
		cancel()
		if err != nil {
			return nil, err
		}
		now := time.Now()
		book.Note(reports, now)
		all := true
		for _, r := range reports {
			all = all && book.Fresh(r.Observer, now)
		}
		if (all && len(reports) > 0) || now.After(deadline) {
			return func(o string) bool { return book.Fresh(o, now) }, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func leaseNotFound(err error) bool { return errors.Is(err, rpctypes.ErrLeaseNotFound) }
