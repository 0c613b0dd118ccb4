package election

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// DefaultEtcdKey is where the VIP lock record lives.
const DefaultEtcdKey = "/vigil/leader"

// votersRefresh is how old the cached voter list may get before an operation
// that succeeded refreshes it. Membership changes are rare and deliberate; the
// list only sizes the majority in StoreLeaderless.
const votersRefresh = 5 * time.Second

// EtcdConfig configures an EtcdLock.
type EtcdConfig struct {
	Endpoints []string
	TLS       *tls.Config // nil for plain http endpoints
	Key       string      // DefaultEtcdKey when empty
}

// EtcdLock keeps the lock record in one etcd key. It holds one client per
// member so that every operation is sent through every member at once and the
// first answer wins: a dead or cut-off member never delays an operation, and a
// renewal reaches the raft leader through any member that can still reach it.
//
// The endpoints given are only a seed: every votersRefresh the lock reads the
// member list and from then on talks to the client URLs the members
// advertise, so members added or replaced later are reached without a
// restart or a flag change.
type EtcdLock struct {
	key string
	tls *tls.Config
	log *slog.Logger

	mu       sync.Mutex // guards the fields below
	members  []*memberClient
	voters   map[uint64]string
	votersAt time.Time
	closed   bool
}

type memberClient struct {
	endpoint string
	cli      *clientv3.Client
	maint    pb.MaintenanceClient
}

var (
	_ Lock    = (*EtcdLock)(nil)
	_ Prober  = (*EtcdLock)(nil)
	_ Watcher = (*EtcdLock)(nil)
)

// NewEtcdLock connects (lazily) to each endpoint. It fails only on bad
// configuration; an unreachable etcd shows up as errors from Get and Write.
func NewEtcdLock(cfg EtcdConfig, log *slog.Logger) (*EtcdLock, error) {
	if len(cfg.Endpoints) == 0 {
		return nil, fmt.Errorf("%w: no etcd endpoints", ErrInvalidConfig)
	}
	key := cfg.Key
	if key == "" {
		key = DefaultEtcdKey
	}
	l := &EtcdLock{key: key, tls: cfg.TLS, log: log}
	for _, ep := range cfg.Endpoints {
		m, err := l.dial(ep)
		if err != nil {
			l.Close()
			return nil, err
		}
		l.members = append(l.members, m)
	}
	return l, nil
}

func (l *EtcdLock) dial(ep string) (*memberClient, error) {
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:            []string{ep},
		TLS:                  l.tls,
		DialTimeout:          2 * time.Second,
		DialKeepAliveTime:    2 * time.Second,
		DialKeepAliveTimeout: time.Second,
		Logger:               zap.NewNop(),
	})
	if err != nil {
		return nil, fmt.Errorf("etcd client for %s: %w", ep, err)
	}
	return &memberClient{endpoint: ep, cli: cli, maint: pb.NewMaintenanceClient(cli.ActiveConnection())}, nil
}

// Close closes every client. It is safe to call twice.
func (l *EtcdLock) Close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	for _, m := range l.members {
		_ = m.cli.Close() // closing an already closed client returns an error we do not care about
	}
	l.members = nil
}

// snapshot returns the current member clients.
func (l *EtcdLock) snapshot() []*memberClient {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.members
}

// Endpoints returns the endpoints the lock currently talks to.
func (l *EtcdLock) Endpoints() []string {
	var eps []string
	for _, m := range l.snapshot() {
		eps = append(eps, m.endpoint)
	}
	sort.Strings(eps)
	return eps
}

// Describe implements Lock.
func (l *EtcdLock) Describe() string { return "etcd:" + l.key }

// Get implements Lock.
func (l *EtcdLock) Get(ctx context.Context) (Observation, error) {
	obs, err := fanOut(ctx, l.snapshot(), func(ctx context.Context, m *memberClient) (Observation, error) {
		resp, err := m.cli.Get(ctx, l.key)
		if err != nil {
			return Observation{}, fmt.Errorf("get %s via %s: %w", l.key, m.endpoint, err)
		}
		obs, err := decode(resp.Kvs)
		obs.Term = resp.Header.RaftTerm
		return obs, err
	})
	if err == nil {
		l.maybeRefreshVoters(ctx)
	}
	return obs, err
}

// Write implements Lock.
func (l *EtcdLock) Write(ctx context.Context, rec Record, rev int64) (Observation, error) {
	val, err := json.Marshal(rec)
	if err != nil {
		return Observation{}, fmt.Errorf("encode lock record: %w", err)
	}
	cmp := clientv3.Compare(clientv3.ModRevision(l.key), "=", rev)
	if rev == 0 {
		cmp = clientv3.Compare(clientv3.CreateRevision(l.key), "=", 0)
	}
	obs, err := fanOut(ctx, l.snapshot(), func(ctx context.Context, m *memberClient) (Observation, error) {
		resp, err := m.cli.Txn(ctx).If(cmp).Then(clientv3.OpPut(l.key, string(val))).Else(clientv3.OpGet(l.key)).Commit()
		if err != nil {
			return Observation{}, fmt.Errorf("write %s via %s: %w", l.key, m.endpoint, err)
		}
		if resp.Succeeded {
			r := rec
			return Observation{Record: &r, Revision: resp.Header.Revision, Term: resp.Header.RaftTerm}, nil
		}
		obs, err := decode(resp.Responses[0].GetResponseRange().Kvs)
		obs.Term = resp.Header.RaftTerm
		if err != nil {
			return obs, err
		}
		if obs.Record != nil && obs.Record.Nonce == rec.Nonce {
			return obs, nil // the same write, landed through another member
		}
		return obs, ErrConflict
	})
	if err == nil {
		l.maybeRefreshVoters(ctx)
	}
	return obs, err
}

// Watch implements Watcher with one watch per member, so a dead member does
// not hide changes. Events from members that lost their raft leader are
// refused by the member (WithRequireLeader), and the watch restarted.
func (l *EtcdLock) Watch(ctx context.Context, out chan<- Observation) {
	var wg sync.WaitGroup
	for _, m := range l.snapshot() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l.watchMember(ctx, m, out)
		}()
	}
	wg.Wait()
}

func (l *EtcdLock) watchMember(ctx context.Context, m *memberClient, out chan<- Observation) {
	for ctx.Err() == nil {
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		for resp := range m.cli.Watch(wctx, l.key) {
			if resp.Err() != nil {
				break
			}
			for _, ev := range resp.Events {
				obs, err := decode([]*mvccpb.KeyValue{ev.Kv})
				if err != nil || ev.Type == clientv3.EventTypeDelete {
					obs = Observation{}
				}
				obs.Revision = ev.Kv.ModRevision
				obs.Term = resp.Header.RaftTerm
				select {
				case out <- obs:
				case <-ctx.Done():
				}
			}
		}
		cancel()
		select { // a member that cannot serve watches is retried, not hammered
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

func decode(kvs []*mvccpb.KeyValue) (Observation, error) {
	if len(kvs) == 0 {
		return Observation{}, nil
	}
	var r Record
	if err := json.Unmarshal(kvs[0].Value, &r); err != nil {
		return Observation{}, fmt.Errorf("decode lock record at %s: %w", kvs[0].Key, err)
	}
	return Observation{Record: &r, Revision: kvs[0].ModRevision}, nil
}

// StoreLeaderless implements Prober: it asks every member for its status and
// reports true when a majority of the voters answered and none of them
// follows a leader that also answered.
func (l *EtcdLock) StoreLeaderless(ctx context.Context) (bool, error) {
	l.mu.Lock()
	voters := l.voters
	l.mu.Unlock()
	if len(voters) == 0 {
		return false, errors.New("election: voter list not known yet")
	}
	answers := l.statusAll(ctx)
	leaders := map[uint64]uint64{} // answering voter -> leader it follows
	for _, a := range answers {
		if _, ok := voters[a.id]; ok {
			leaders[a.id] = a.leader
		}
	}
	if len(leaders) <= len(voters)/2 {
		return false, nil
	}
	for _, lead := range leaders {
		if _, ok := leaders[lead]; ok {
			return false, nil // a leader that answered us is working
		}
	}
	return true, nil
}

type memberStatus struct {
	endpoint  string
	id        uint64
	leader    uint64
	raftIndex uint64
	learner   bool
	m         *memberClient
}

// statusAll asks every member for its status in parallel and returns the
// answers that arrived before ctx ended.
func (l *EtcdLock) statusAll(ctx context.Context) []memberStatus {
	members := l.snapshot()
	ch := make(chan memberStatus, len(members))
	var wg sync.WaitGroup
	for _, m := range members {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := m.maint.Status(ctx, &pb.StatusRequest{})
			if err != nil {
				return
			}
			ch <- memberStatus{endpoint: m.endpoint, id: resp.Header.MemberId, leader: resp.Leader, raftIndex: resp.RaftIndex, learner: resp.IsLearner, m: m}
		}()
	}
	wg.Wait()
	close(ch)
	var out []memberStatus
	for s := range ch {
		out = append(out, s)
	}
	return out
}

func (l *EtcdLock) maybeRefreshVoters(ctx context.Context) {
	l.mu.Lock()
	fresh := time.Since(l.votersAt) < votersRefresh
	l.mu.Unlock()
	if fresh {
		return
	}
	resp, err := fanOut(ctx, l.snapshot(), func(ctx context.Context, m *memberClient) (*clientv3.MemberListResponse, error) {
		return m.cli.MemberList(ctx, clientv3.WithSerializable())
	})
	if err != nil {
		return // keep the old list; a later operation tries again
	}
	voters := map[uint64]string{}
	var urls []string
	for _, mem := range resp.Members {
		if !mem.IsLearner {
			voters[mem.ID] = mem.Name
		}
		urls = append(urls, mem.ClientURLs...) // a member not started yet has none
	}
	l.mu.Lock()
	l.voters, l.votersAt = voters, time.Now()
	l.mu.Unlock()
	if len(urls) > 0 {
		l.follow(urls)
	}
}

// follow makes the member clients match the client URLs the cluster
// advertises: clients for new URLs are dialled, clients for URLs no member
// advertises any more are closed.
func (l *EtcdLock) follow(urls []string) {
	want := map[string]bool{}
	for _, u := range urls {
		want[u] = true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	var keep []*memberClient
	have := map[string]bool{}
	for _, m := range l.members {
		if want[m.endpoint] {
			keep = append(keep, m)
			have[m.endpoint] = true
			continue
		}
		l.log.Info("etcd endpoint no longer advertised by any member; dropping it", "endpoint", m.endpoint)
		_ = m.cli.Close() // an operation still using it fails like a dead member
	}
	for u := range want {
		if have[u] {
			continue
		}
		m, err := l.dial(u)
		if err != nil {
			l.log.Warn("cannot use etcd endpoint advertised by a member", "endpoint", u, "err", err)
			continue
		}
		l.log.Info("new etcd endpoint advertised by a member", "endpoint", u)
		keep = append(keep, m)
	}
	if len(keep) > 0 {
		l.members = keep
	}
}

// Moving raft leadership is a disruption of its own: until the transferee
// has taken over, the leader drops proposals (the VIP holder's renewals
// among them), for up to an etcd election timeout if the transfer fails.
// So it is done only when it is safe and worth it.
const (
	// shedStatusTimeout bounds each member's Status answer, so that a
	// powered-off member, whose connection hangs, cannot use up the time
	// the move itself needs.
	shedStatusTimeout = 500 * time.Millisecond
	// shedMaxLag is how many raft entries behind the leader a transferee
	// may be. One that is further behind has to catch up first, and the
	// transfer may time out meanwhile.
	shedMaxLag = 16
)

// ErrShedDeferred wraps the reason ShedRaftLeadership left leadership where
// it is although this node's member leads: a voter does not answer or
// follows another leader (a cluster with a fault: a transfer adds risk and
// leaves no spare member to fail over to), or no voter is caught up.
var ErrShedDeferred = errors.New("etcd raft leadership stays on this member for now")

// ShedRaftLeadership moves etcd raft leadership away from the member called
// name, if it leads, to the most caught-up other voter. The VIP holder calls
// it so that losing the holder's machine does not also cost an etcd leader
// election. It reports the member leadership moved to, or "" when name does
// not lead. It moves nothing, and returns an error wrapping ErrShedDeferred,
// unless every voter answers and follows the leader, and one of them is
// within shedMaxLag entries of it.
func (l *EtcdLock) ShedRaftLeadership(ctx context.Context, name string) (string, error) {
	// With the Kubernetes election this lock does nothing else that would
	// keep its voter list current.
	l.maybeRefreshVoters(ctx)
	l.mu.Lock()
	voters := l.voters
	l.mu.Unlock()
	sctx, cancel := context.WithTimeout(ctx, shedStatusTimeout)
	answers := l.statusAll(sctx)
	cancel()
	var leader *memberStatus
	byID := map[uint64]memberStatus{}
	for i, a := range answers {
		byID[a.id] = a
		if a.id == a.leader {
			leader = &answers[i]
		}
	}
	if leader == nil || voters[leader.id] != name {
		return "", nil
	}
	var cands []memberStatus
	for id, vname := range voters {
		a, ok := byID[id]
		switch {
		case !ok:
			return "", fmt.Errorf("%w: voter %s does not answer", ErrShedDeferred, voterLabel(vname, id))
		case a.leader != leader.id:
			return "", fmt.Errorf("%w: voter %s follows another leader (%x)", ErrShedDeferred, voterLabel(vname, id), a.leader)
		case id != leader.id && !a.learner && a.raftIndex+shedMaxLag >= leader.raftIndex:
			cands = append(cands, a)
		}
	}
	if len(cands) == 0 {
		if len(voters) < 2 {
			return "", nil // a single member: nowhere to move it
		}
		return "", fmt.Errorf("%w: no other voter is within %d entries of the leader's raft index %d", ErrShedDeferred, shedMaxLag, leader.raftIndex)
	}
	sort.Slice(cands, func(i, j int) bool {
		if cands[i].raftIndex != cands[j].raftIndex {
			return cands[i].raftIndex > cands[j].raftIndex
		}
		return cands[i].id < cands[j].id
	})
	to := cands[0]
	if _, err := leader.m.cli.MoveLeader(ctx, to.id); err != nil {
		return "", fmt.Errorf("move etcd leadership from %s to %s: %w", name, voterLabel(voters[to.id], to.id), err)
	}
	return voterLabel(voters[to.id], to.id), nil
}

// voterLabel names a voter; one that has not started yet has no name.
func voterLabel(name string, id uint64) string {
	if name == "" {
		return fmt.Sprintf("%x", id)
	}
	return name
}

// fanOut runs op through every member at once and returns the first success.
// ErrConflict is as final as a success. When every member fails it returns
// their errors joined.
func fanOut[T any](ctx context.Context, members []*memberClient, op func(context.Context, *memberClient) (T, error)) (T, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // stops the slower members; their goroutines then finish
	type result struct {
		v   T
		err error
	}
	ch := make(chan result, len(members))
	for _, m := range members {
		go func() {
			v, err := op(ctx, m)
			ch <- result{v, err}
		}()
	}
	var errs []error
	for range members {
		r := <-ch
		if r.err == nil || errors.Is(r.err, ErrConflict) {
			return r.v, r.err
		}
		errs = append(errs, r.err)
	}
	var zero T
	return zero, fmt.Errorf("no etcd member answered: %w", memberErrors(errs))
}

// memberErrors is the failure of every member, printed on one line.
type memberErrors []error

func (m memberErrors) Error() string {
	s := make([]string, len(m))
	for i, e := range m {
		s[i] = e.Error()
	}
	return strings.Join(s, "; ")
}

func (m memberErrors) Unwrap() []error { return m }

// MemberList reads the member list through every member at once; the first
// linearizable answer wins, so a member cut off from the raft leader cannot
// serve a stale list.
func (l *EtcdLock) MemberList(ctx context.Context) ([]*pb.Member, error) {
	resp, err := fanOut(ctx, l.snapshot(), func(ctx context.Context, m *memberClient) (*clientv3.MemberListResponse, error) {
		return m.cli.MemberList(ctx)
	})
	if err != nil {
		return nil, fmt.Errorf("etcd member list: %w", err)
	}
	return resp.Members, nil
}
