package election

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/vigil-ha/vigil"
	"github.com/vigil-ha/vigil/internal/etcdcluster"
	"github.com/vigil-ha/vigil/internal/validate"
)

// DefaultEtcdKey is where the VIP lock record lives.
const DefaultEtcdKey = "/vigil/leader"

// EtcdConfig configures an EtcdLock with a connection of its own.
type EtcdConfig struct {
	Endpoints []string
	TLS       *tls.Config // nil for plain http endpoints
	Key       string      // DefaultEtcdKey when empty
}

// EtcdLock keeps the lock record in one etcd key. Every operation is sent
// through every member at once and the first answer wins
// (etcdcluster.Do): a dead or cut-off member never delays an operation,
// and a renewal reaches the raft leader through any member that can still
// reach it. The cluster connection follows the member list, so members
// added or replaced later are reached without a restart.
type EtcdLock struct {
	key string
	cl  *etcdcluster.Cluster
	own bool // cl was made by NewEtcdLock; Close closes it
	log *slog.Logger

	// Renewals and stand-by reads each go through the member that
	// answered the last one (etcdcluster.Path): one raft proposal per
	// renewal, one read per stand-by poll, not one per member.
	renewals, reads etcdcluster.Path
	// claims carries the name claim's keep-alive and rewrite.
	claims etcdcluster.Path

	// The member list is refreshed beside the operations, never in their
	// way: on a slow store a refresh is a round trip, and the renewals
	// answered meanwhile must reach the elector at once.
	refreshing atomic.Bool
	refreshWG  sync.WaitGroup
	stop       context.Context
	cancel     context.CancelFunc
}

var (
	_ Lock    = (*EtcdLock)(nil)
	_ Prober  = (*EtcdLock)(nil)
	_ Watcher = (*EtcdLock)(nil)
)

// NewEtcdLock connects (lazily) to each endpoint, with a connection of its
// own. It fails only on bad configuration; an unreachable etcd shows up as
// errors from Get and Write.
func NewEtcdLock(cfg EtcdConfig, log *slog.Logger) (*EtcdLock, error) {
	if len(cfg.Endpoints) == 0 {
		return nil, fmt.Errorf("%w: no etcd endpoints", validate.ErrInvalid)
	}
	cl, err := etcdcluster.New(etcdcluster.Config{Endpoints: cfg.Endpoints, TLS: cfg.TLS}, log)
	if err != nil {
		return nil, err
	}
	l := NewEtcdLockOn(cl, cfg.Key, log)
	l.own = true
	return l, nil
}

// NewEtcdLockOn keeps the lock under key (DefaultEtcdKey when empty) over
// the process's cluster connection, which the caller closes.
func NewEtcdLockOn(cl *etcdcluster.Cluster, key string, log *slog.Logger) *EtcdLock {
	if key == "" {
		key = DefaultEtcdKey
	}
	stop, cancel := context.WithCancel(context.Background())
	return &EtcdLock{key: key, cl: cl, log: log, stop: stop, cancel: cancel}
}

// Close closes the connection if the lock made it. Safe to call twice.
func (l *EtcdLock) Close() {
	l.cancel()
	l.refreshWG.Wait()
	if l.own {
		l.cl.Close()
	}
}

// Cluster is the connection the lock uses.
func (l *EtcdLock) Cluster() *etcdcluster.Cluster { return l.cl }

// Endpoints returns the endpoints the lock currently talks to.
func (l *EtcdLock) Endpoints() []string { return l.cl.Endpoints() }

// Describe implements Lock.
func (l *EtcdLock) Describe() string { return "etcd:" + l.key }

// Get implements Lock. A stand-by polls it every retry period, so it goes
// through one member while that member answers in time (etcdcluster.Path).
// Which member answers does not matter for safety: a read only starts the
// lease window, and the takeover is a compare-and-swap on the revision
// read.
func (l *EtcdLock) Get(ctx context.Context) (Observation, error) {
	obs, err := etcdcluster.Via(ctx, l.cl, &l.reads, func(ctx context.Context, m *etcdcluster.Member) (Observation, error) {
		resp, err := m.Client.Get(ctx, l.key)
		if err != nil {
			return Observation{}, fmt.Errorf("get %s via %s: %w", l.key, m.Endpoint, err)
		}
		obs, err := decode(resp.Kvs)
		obs.Term = resp.Header.RaftTerm
		return obs, err
	})
	if err == nil {
		l.refreshMembers()
	}
	return obs, err
}

// Write implements Lock.
func (l *EtcdLock) Write(ctx context.Context, rec Record, rev int64) (Observation, error) {
	rec.Format = vigil.RecordFormat
	val, err := json.Marshal(rec)
	if err != nil {
		return Observation{}, fmt.Errorf("encode lock record: %w", err)
	}
	cmp := clientv3.Compare(clientv3.ModRevision(l.key), "=", rev)
	if rev == 0 {
		cmp = clientv3.Compare(clientv3.CreateRevision(l.key), "=", 0)
	}
	return l.txn(ctx, rec, val, []clientv3.Cmp{cmp})
}

// txn stores val (rec encoded) if every compare holds, through every
// member at once.
func (l *EtcdLock) txn(ctx context.Context, rec Record, val []byte, cmps []clientv3.Cmp) (Observation, error) {
	obs, err := etcdcluster.DoUntil(ctx, l.cl, l.txnOp(rec, val, cmps), isConflict)
	if err == nil {
		l.refreshMembers()
	}
	return obs, err
}

// txnOp is the transaction through one member. A write that landed through
// another member is recognised by its nonce.
func (l *EtcdLock) txnOp(rec Record, val []byte, cmps []clientv3.Cmp) func(context.Context, *etcdcluster.Member) (Observation, error) {
	return func(ctx context.Context, m *etcdcluster.Member) (Observation, error) {
		resp, err := m.Client.Txn(ctx).If(cmps...).Then(clientv3.OpPut(l.key, string(val))).Else(clientv3.OpGet(l.key)).Commit()
		if err != nil {
			return Observation{}, fmt.Errorf("write %s via %s: %w", l.key, m.Endpoint, err)
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
	}
}

// Renew implements Renewer: the compare is that the stored value begins
// with rec's tenure (tenurePrefix), so the renewals of one tenure may land
// in any order, and none lands once another writer (a candidate after the
// lease, a release, Retire) has written.
func (l *EtcdLock) Renew(ctx context.Context, rec Record) (Observation, error) {
	if rec.Tenure == "" {
		return Observation{}, errors.New("election: a renewal needs the tenure of the lock it renews")
	}
	rec.Format = vigil.RecordFormat
	val, err := json.Marshal(rec)
	if err != nil {
		return Observation{}, fmt.Errorf("encode lock record: %w", err)
	}
	p := tenurePrefix(rec.Tenure)
	if !strings.HasPrefix(string(val), p) {
		return Observation{}, fmt.Errorf("election: encoded lock record does not begin with its tenure: %.60s", val)
	}
	// JSON is UTF-8, where the byte 0xff never occurs: the values with
	// prefix p are exactly those in (p, p+"\xff"). The third compare makes
	// the copies of this renewal sent through the other members (txn) fail
	// once one has landed, instead of writing the same value again: one
	// revision per renewal, not one per member.
	cmps := []clientv3.Cmp{
		clientv3.Compare(clientv3.Value(l.key), ">", p),
		clientv3.Compare(clientv3.Value(l.key), "<", p+"\xff"),
		clientv3.Compare(clientv3.Value(l.key), "!=", string(val)),
	}
	obs, err := etcdcluster.ViaUntil(ctx, l.cl, &l.renewals, l.txnOp(rec, val, cmps), isConflict)
	if err == nil {
		l.refreshMembers()
	}
	return obs, err
}

// tenurePrefix is how every encoded record of tenure t begins.
func tenurePrefix(t string) string { return `{"tenure":` + strconv.Quote(t) + "," }

func isConflict(err error) bool { return errors.Is(err, ErrConflict) }

// refreshMembers reads the shared member list when it has grown older than
// its interval (a no-op otherwise): the voters StoreLeaderless counts, and
// the members the connection follows. The election keeps it current
// because with the etcd election nothing else may read it (--discovery
// none, no pruning).
func (l *EtcdLock) refreshMembers() {
	if !l.refreshing.CompareAndSwap(false, true) {
		return
	}
	l.refreshWG.Add(1)
	go func() {
		defer l.refreshWG.Done()
		defer l.refreshing.Store(false)
		ctx, cancel := context.WithTimeout(l.stop, memberRefreshTimeout)
		defer cancel()
		_, _ = l.cl.MemberList(ctx) // a failure keeps the old list; a later operation tries again
	}()
}

// memberRefreshTimeout bounds one refresh of the member list.
const memberRefreshTimeout = 5 * time.Second

// Watch implements Watcher with one watch per member, so a dead member does
// not hide changes. Events from members that lost their raft leader are
// refused by the member (WithRequireLeader), and the watch restarted.
func (l *EtcdLock) Watch(ctx context.Context, out chan<- Observation) {
	var wg sync.WaitGroup
	for _, m := range l.cl.Members() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l.watchMember(ctx, m, out)
		}()
	}
	wg.Wait()
}

func (l *EtcdLock) watchMember(ctx context.Context, m *etcdcluster.Member, out chan<- Observation) {
	for ctx.Err() == nil {
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		for resp := range m.Client.Watch(wctx, l.key) {
			if resp.Err() != nil {
				break
			}
			if l.cl.Accept(m.Endpoint, resp.Header.ClusterId) != nil {
				break // another cluster's key (etcdcluster/identity.go)
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

// EtcdHolder reads the lock record at key (DefaultEtcdKey when empty) once
// and returns the node it names as holder: "" when there is no record or
// it was released. For tools that only look (vigil members), over the
// caller's connection.
func EtcdHolder(ctx context.Context, cl *etcdcluster.Cluster, key string) (string, error) {
	if key == "" {
		key = DefaultEtcdKey
	}
	resp, err := etcdcluster.Do(ctx, cl, func(ctx context.Context, m *etcdcluster.Member) (*clientv3.GetResponse, error) {
		return m.Client.Get(ctx, key)
	})
	if err != nil {
		return "", fmt.Errorf("read the lock record %s: %w", key, err)
	}
	obs, err := decode(resp.Kvs)
	return obs.Holder(), err
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
	return l.cl.StoreLeaderless(ctx)
}

// ErrShedDeferred: see etcdcluster.ErrShedDeferred.
var ErrShedDeferred = etcdcluster.ErrShedDeferred

// ShedRaftLeadership moves etcd raft leadership away from the member called
// name, if it leads (etcdcluster.Cluster.ShedLeadership). The VIP holder
// calls it so that losing the holder's machine does not also cost an etcd
// leader election.
func (l *EtcdLock) ShedRaftLeadership(ctx context.Context, name string) (string, error) {
	return l.cl.ShedLeadership(ctx, name)
}

// MemberList returns the shared member list (etcdcluster), read
// linearizably no longer than its interval ago.
func (l *EtcdLock) MemberList(ctx context.Context) ([]*pb.Member, error) {
	return l.cl.MemberList(ctx)
}
