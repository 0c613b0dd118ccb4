// Package membership changes etcd membership safely: it lists members with
// their health, removes a member only when the cluster keeps a healthy
// quorum, prunes members that have been down for long, and replaces a node
// in the order the etcd documentation prescribes.
//
// Health: a member is reachable when its client URL answers Status within
// StatusTimeout. "Last seen healthy" is recorded in etcd itself (under
// RecordPrefix) by the VIP holder every few seconds, so any node, and the
// CLI, can tell how long a member has been down. A member never recorded as
// healthy is never pruned: nothing proves how long it has been down (it may
// just have been added and not started yet).
package membership

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// DefaultRecordPrefix is where last-seen-healthy records live.
const DefaultRecordPrefix = "/vigil/members/"

// DefaultStatusTimeout bounds one member's Status call. A live member on a
// LAN answers in milliseconds; a second tells a dead one apart without
// making `members list` slow.
const DefaultStatusTimeout = time.Second

// Config configures a Cluster.
type Config struct {
	Endpoints     []string
	TLS           *tls.Config
	RecordPrefix  string
	StatusTimeout time.Duration
}

// Cluster talks to etcd about its membership.
type Cluster struct {
	cfg Config
	cli *clientv3.Client
	log *slog.Logger
}

// New connects (lazily) to the endpoints.
func New(cfg Config, log *slog.Logger) (*Cluster, error) {
	if len(cfg.Endpoints) == 0 {
		return nil, fmt.Errorf("%w: no etcd endpoints", ErrInvalid)
	}
	for _, ep := range cfg.Endpoints {
		if u, err := url.Parse(ep); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("%w: etcd endpoint %q must look like https://HOST:PORT", ErrInvalid, ep)
		}
	}
	if cfg.RecordPrefix == "" {
		cfg.RecordPrefix = DefaultRecordPrefix
	}
	if cfg.StatusTimeout == 0 {
		cfg.StatusTimeout = DefaultStatusTimeout
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:        cfg.Endpoints,
		TLS:              cfg.TLS,
		DialTimeout:      2 * time.Second,
		AutoSyncInterval: 30 * time.Second, // follow the member list
		Logger:           zap.NewNop(),
	})
	if err != nil {
		return nil, fmt.Errorf("etcd client: %w", err)
	}
	return &Cluster{cfg: cfg, cli: cli, log: log}, nil
}

// Close closes the client.
func (c *Cluster) Close() error { return c.cli.Close() }

// View reads the member list (linearizable), asks every member for its
// status and reads the health records.
func (c *Cluster) View(ctx context.Context) (View, error) {
	lctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	resp, err := c.cli.MemberList(lctx)
	cancel()
	if err != nil && ctx.Err() == nil {
		// No quorum, perhaps: a member's own (serializable) list still
		// shows what is wrong, and CheckRemove then refuses with reason.
		sctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		resp, err = c.cli.MemberList(sctx, clientv3.WithSerializable())
		cancel()
	}
	if err != nil {
		return View{}, fmt.Errorf("read the etcd member list (is etcd reachable at %s?): %w", strings.Join(c.cfg.Endpoints, ","), err)
	}
	v := View{}
	for _, m := range resp.Members {
		v.Members = append(v.Members, Member{ID: m.ID, Name: m.Name, PeerURLs: m.PeerURLs, ClientURLs: m.ClientURLs, Learner: m.IsLearner})
	}
	var wg sync.WaitGroup
	for i := range v.Members {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.status(ctx, &v.Members[i])
		}()
	}
	wg.Wait()
	c.useReachable(v)
	var leaderIndex uint64
	for _, m := range v.Members {
		if m.Leader {
			v.LeaderID, leaderIndex = m.ID, m.RaftIndex
		}
	}
	for i := range v.Members {
		if m := &v.Members[i]; m.Reachable && leaderIndex > m.RaftIndex {
			m.Lag = leaderIndex - m.RaftIndex
		}
	}
	rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	recs, err := c.records(rctx)
	cancel()
	if err != nil {
		// Without quorum the records cannot be read; the view is still
		// good for refusing with a reason.
		c.log.Debug("cannot read health records", "err", err)
	}
	for i := range v.Members {
		v.Members[i].LastHealthy = recs[v.Members[i].ID]
	}
	slices.SortFunc(v.Members, func(a, b Member) int { return strings.Compare(a.Name+a.IDString(), b.Name+b.IDString()) })
	return v, nil
}

// useReachable points the client at the members that just answered. A
// member that lost power leaves a connection that looks open until TCP
// gives up; requests balanced onto it would hang until their deadline, so
// the health records, removals and additions go only where an answer came
// from.
func (c *Cluster) useReachable(v View) {
	var eps []string
	for _, m := range v.Members {
		if m.Reachable {
			eps = append(eps, m.ClientURLs...)
		}
	}
	if len(eps) == 0 {
		return
	}
	slices.Sort(eps)
	cur := slices.Clone(c.cli.Endpoints())
	slices.Sort(cur)
	if !slices.Equal(eps, cur) {
		c.cli.SetEndpoints(eps...)
	}
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
		st, err := c.cli.Status(sctx, ep)
		cancel()
		if err != nil {
			errs = append(errs, err.Error())
			continue
		}
		m.Reachable = true
		m.Leader = st.Leader == m.ID
		m.RaftIndex = st.RaftAppliedIndex
		m.DBSize = st.DbSize
		m.Error = ""
		return
	}
	m.Error = strings.Join(errs, "; ")
}

// record is what the health records hold.
type record struct {
	Name        string    `json:"name"`
	LastHealthy time.Time `json:"lastHealthy"`
}

func (c *Cluster) records(ctx context.Context) (map[uint64]time.Time, error) {
	resp, err := c.cli.Get(ctx, c.cfg.RecordPrefix, clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("read health records: %w", err)
	}
	out := map[uint64]time.Time{}
	for _, kv := range resp.Kvs {
		id, err := strconv.ParseUint(strings.TrimPrefix(string(kv.Key), c.cfg.RecordPrefix), 16, 64)
		if err != nil {
			continue
		}
		var r record
		if json.Unmarshal(kv.Value, &r) == nil {
			out[id] = r.LastHealthy
		}
	}
	return out, nil
}

// RecordHealth writes now as the last-seen-healthy time of every reachable
// member of v, and drops the records of members that are gone.
func (c *Cluster) RecordHealth(ctx context.Context, v View, now time.Time) error {
	var ops []clientv3.Op
	ids := map[uint64]bool{}
	for _, m := range v.Members {
		ids[m.ID] = true
		if !m.Reachable {
			continue
		}
		b, _ := json.Marshal(record{Name: m.Name, LastHealthy: now.UTC()})
		ops = append(ops, clientv3.OpPut(c.key(m.ID), string(b)))
	}
	recs, err := c.records(ctx)
	if err != nil {
		return err
	}
	for id := range recs {
		if !ids[id] {
			ops = append(ops, clientv3.OpDelete(c.key(id)))
		}
	}
	if len(ops) == 0 {
		return nil
	}
	if _, err := c.cli.Txn(ctx).Then(ops...).Commit(); err != nil {
		return fmt.Errorf("record member health: %w", err)
	}
	return nil
}

func (c *Cluster) key(id uint64) string { return c.cfg.RecordPrefix + strconv.FormatUint(id, 16) }

// Remove removes the member named or numbered nameOrID if CheckRemove allows
// it, moving raft leadership away first when it leads. A member that is
// already gone is not an error when it was found by ID.
func (c *Cluster) Remove(ctx context.Context, nameOrID string, force bool, say func(string, ...any)) error {
	v, err := c.View(ctx)
	if err != nil {
		return err
	}
	m, err := v.Find(nameOrID)
	if err != nil {
		return err
	}
	return c.remove(ctx, v, m, force, say)
}

func (c *Cluster) remove(ctx context.Context, v View, m Member, force bool, say func(string, ...any)) error {
	if err := v.CheckRemove(m, force); err != nil {
		return err
	}
	if m.Leader {
		to, ok := v.transferTarget(m)
		if !ok {
			return fmt.Errorf("%w: %s leads raft and no other healthy voter can take over", ErrRefused, m.Label())
		}
		say("%s leads raft; moving leadership to %s first", m.Label(), to.Label())
		if err := c.moveLeader(ctx, m, to); err != nil {
			return fmt.Errorf("move raft leadership off %s: %w", m.Label(), err)
		}
		// Check again with the new leader in place.
		var err error
		if v, err = c.View(ctx); err != nil {
			return err
		}
		if m, err = v.Find(m.IDString()); err != nil {
			return err
		}
		if err := v.CheckRemove(m, force); err != nil {
			return err
		}
	}
	say("removing %s", m.Label())
	var err error
	for deadline := time.Now().Add(unhealthyWait); ; {
		rctx, cancel := context.WithTimeout(ctx, removeTimeout)
		_, err = c.cli.MemberRemove(rctx, m.ID)
		cancel()
		// "Unhealthy cluster": etcd holds changes back for 5 s after a
		// member connects, and a new raft leader (just after moving
		// leadership) counts from its own election. That passes.
		if !errors.Is(err, rpctypes.ErrUnhealthy) || time.Now().After(deadline) {
			break
		}
		say("etcd reports an unhealthy cluster (a member or leader changed moments ago); retrying")
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
	if err != nil {
		// The answer can be lost while the removal went through: the
		// request may have reached the very member being removed, which
		// shuts down. Or somebody else (a concurrent prune, the previous
		// VIP holder) removed it first; etcd then answers "not found",
		// or, when both proposals race, not at all. The list tells.
		if gone, lerr := c.gone(ctx, m.ID); lerr == nil && gone {
			say("removed %s (confirmed by the member list; etcd's answer was: %v)", m.Label(), err)
			return nil
		}
		return fmt.Errorf("remove %s: %w", m.Label(), err)
	}
	if _, err := c.cli.Delete(ctx, c.key(m.ID)); err != nil {
		c.log.Warn("cannot delete the health record of a removed member", "member", m.Label(), "err", err)
	}
	say("removed %s", m.Label())
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
	resp, err := c.cli.MemberList(lctx)
	if err != nil {
		return false, err
	}
	for _, m := range resp.Members {
		if m.ID == id {
			return false, nil
		}
	}
	return true, nil
}

// moveLeader asks the leader m to hand raft leadership to to; the request
// must reach the leader itself.
func (c *Cluster) moveLeader(ctx context.Context, m, to Member) error {
	cli, err := clientv3.New(clientv3.Config{Endpoints: m.ClientURLs, TLS: c.cfg.TLS, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer cli.Close()
	_, err = cli.MoveLeader(ctx, to.ID)
	return err
}
