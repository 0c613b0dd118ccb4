// Package etcdcluster is a process's one connection to etcd: one gRPC
// connection per member; operations sent through every member at once (the
// first answer wins) or, when they recur, through the member that answered
// the last one, the others asked only when it fails or is late (Path); the
// member list read at most once per interval and shared by everyone in the
// process; the voter list, member status and raft leadership transfer.
//
// In a `vigil run` the election's lock and name claims, the handoff
// records, membership observation and changes and API server discovery all
// use one Cluster, each through the few methods it needs; `vigil members`
// and `vigil handoff` use one of their own. The worker agent does not: it
// reads the member list through etcd's JSON gateway (internal/agent,
// discover.go, says why). Before this package a `vigil run` held three etcd client
// stacks, read the member list three times every few seconds, and dialled a
// new connection for every member status it asked.
//
// The endpoints given are a seed: every member list read, the Cluster dials
// the client URLs the members advertise and closes the connections to URLs
// no member advertises any more, so members added or replaced later are
// reached without a restart or a flag change. With Config.KeepSeeds the seed
// endpoints stay as well (the agent's last resort).
package etcdcluster

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/vigil-ha/vigil/internal/etcdmember"
)

// DefaultListInterval is how old the shared member list may get before a
// caller that asks for it reads it again. Membership changes are rare and
// deliberate; two seconds makes a change visible "within seconds" at the
// cost of one read every two seconds per process.
const DefaultListInterval = 2 * time.Second

// DefaultKeepAlive is the gRPC keepalive ping interval of a member
// connection: a member that lost power is found within about
// DefaultKeepAlive + keepAliveTimeout, so requests stop waiting on it.
// vigil run keeps watches open on every connection, so etcd's
// --grpc-keepalive-min-time (5 s) does not refuse these pings.
const DefaultKeepAlive = 2 * time.Second

const (
	keepAliveTimeout = time.Second
	dialTimeout      = 2 * time.Second
)

// reconnectBackoff paces the reconnection to a member whose connection
// broke. gRPC's default waits up to 120 s between attempts, so after a
// minute-long fault (a filtered port, a partition) a member that is back
// went on looking unreachable for tens of seconds: its Status failed, the
// observers' "down since" kept counting, and the agent kept avoiding it.
// Two seconds at most between attempts costs a dead member one dial
// every two seconds per process.
var reconnectBackoff = backoff.Config{BaseDelay: 250 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 2 * time.Second}

// ErrNoEndpoints is returned by New when Config.Endpoints is empty.
var ErrNoEndpoints = errors.New("etcdcluster: no etcd endpoints")

// Config configures a Cluster.
type Config struct {
	Endpoints []string
	TLS       *tls.Config // nil for plain http endpoints
	// ListInterval is how old the shared member list may be
	// (DefaultListInterval when 0).
	ListInterval time.Duration
	// KeepAlive is the keepalive ping interval (DefaultKeepAlive when 0). A
	// process that keeps no stream open should use 30 s or more.
	KeepAlive time.Duration
	// KeepSeeds keeps connections to the seed endpoints even when no member
	// advertises them, as a last resort if every advertised URL fails.
	KeepSeeds bool
	// OnForeign is called the first time an endpoint answers for another
	// etcd cluster than the one this process follows (identity.go).
	OnForeign func(Foreign)
	// Provisional lets a one-shot command work with a cluster that lost
	// its majority: when no majority of the seeds agrees on a cluster ID,
	// the one most of the answers carried is taken until a majority agrees
	// (identity.go). vigil run and the agent leave it off.
	Provisional bool
}

// Cluster is one process's connection to etcd. Safe for concurrent use.
type Cluster struct {
	cfg   Config
	log   *slog.Logger
	seeds map[string]bool

	mu      sync.Mutex   // guards the fields below
	members []*Member    // open connections, one per wanted endpoint
	wanted  []string     // the endpoints to use: the seeds, then what the members advertise
	list    []*pb.Member // the last member list read
	listAt  time.Time
	voters  map[uint64]string // ID -> name, from list
	closed  bool
	http    *http.Client // for PeerLinks, made on first use

	readMu   sync.Mutex   // one member list read at a time; the others wait for it
	reads    atomic.Int64 // member list reads sent
	listPath Path         // the member list reads go through

	ident identity // the cluster ID followed (identity.go)
}

// Member is the connection to one client URL.
type Member struct {
	Endpoint string
	Client   *clientv3.Client
	maint    pb.MaintenanceClient
}

// New dials (lazily) each endpoint. It fails only on bad configuration; an
// unreachable etcd shows up as errors from the operations.
func New(cfg Config, log *slog.Logger) (*Cluster, error) {
	if len(cfg.Endpoints) == 0 {
		return nil, ErrNoEndpoints
	}
	if cfg.ListInterval == 0 {
		cfg.ListInterval = DefaultListInterval
	}
	if cfg.KeepAlive == 0 {
		cfg.KeepAlive = DefaultKeepAlive
	}
	c := &Cluster{cfg: cfg, log: log, seeds: map[string]bool{}}
	for _, ep := range cfg.Endpoints {
		c.seeds[ep] = true
	}
	c.ident = identity{learned: make(chan struct{}), need: len(c.seeds)/2 + 1, allowProv: cfg.Provisional, votes: map[uint64]map[string]bool{}, foreign: map[string]*Foreign{},
		onNew: cfg.OnForeign, log: log}
	dialled := map[string]bool{}
	for _, ep := range cfg.Endpoints {
		if dialled[ep] {
			continue
		}
		dialled[ep] = true
		c.wanted = append(c.wanted, ep)
		m, err := c.dial(ep)
		if err != nil {
			c.Close()
			return nil, err
		}
		c.members = append(c.members, m)
	}
	return c, nil
}

func (c *Cluster) dial(ep string) (*Member, error) {
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:            []string{ep},
		TLS:                  c.cfg.TLS,
		DialTimeout:          dialTimeout,
		DialKeepAliveTime:    c.cfg.KeepAlive,
		DialKeepAliveTimeout: keepAliveTimeout,
		Logger:               zap.NewNop(),
		DialOptions: []grpc.DialOption{
			grpc.WithChainUnaryInterceptor(c.checkIdentity(ep)),
			grpc.WithConnectParams(grpc.ConnectParams{Backoff: reconnectBackoff, MinConnectTimeout: dialTimeout}),
		},
	})
	if err != nil {
		return nil, fmt.Errorf("etcd client for %s: %w", ep, err)
	}
	return &Member{Endpoint: ep, Client: cli, maint: pb.NewMaintenanceClient(cli.ActiveConnection())}, nil
}

// Close closes every connection. It is safe to call twice.
func (c *Cluster) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	for _, m := range c.members {
		_ = m.Client.Close() // closing an already closed client returns an error we do not care about
	}
	c.members = nil
}

// Members returns the current member connections. The slice is not
// modified afterwards; a connection in it may be closed by a later list
// read, and an operation on it then fails like one on a dead member.
func (c *Cluster) Members() []*Member {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.members
}

// Endpoints returns the client URLs connected to, sorted.
func (c *Cluster) Endpoints() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Sorted(slices.Values(c.wanted))
}

// MemberList returns the member list, read (linearizably, through the
// member that answered the last read: Path) no longer than ListInterval
// ago. Everyone in the process
// shares the read: a caller that finds the list too old reads it, the ones
// that ask meanwhile wait for that read.
func (c *Cluster) MemberList(ctx context.Context) ([]*pb.Member, error) {
	return c.memberList(ctx, c.cfg.ListInterval)
}

// Serving is what the voters of the shared member list (MemberList) serve
// clients on: the backends discovery makes of them.
func (c *Cluster) Serving(ctx context.Context) (etcdmember.Serving, error) {
	list, err := c.MemberList(ctx)
	if err != nil {
		return etcdmember.Serving{}, err
	}
	return etcdmember.ServingOf(list), nil
}

// FreshMemberList reads the member list now, for decisions that must not
// rest on an older one (a removal's quorum check).
func (c *Cluster) FreshMemberList(ctx context.Context) ([]*pb.Member, error) {
	return c.memberList(ctx, 0)
}

func (c *Cluster) memberList(ctx context.Context, maxAge time.Duration) ([]*pb.Member, error) {
	asked := time.Now()
	if l, ok := c.cached(maxAge, asked); ok {
		return l, nil
	}
	c.readMu.Lock()
	defer c.readMu.Unlock()
	// A read that started after this call began is as good as our own.
	if l, ok := c.cachedSince(asked, maxAge); ok {
		return l, nil
	}
	c.reads.Add(1)
	list := func(ctx context.Context, m *Member) (*clientv3.MemberListResponse, error) {
		return m.Client.MemberList(ctx)
	}
	resp, err := Via(ctx, c, &c.listPath, list)
	if err != nil {
		return nil, fmt.Errorf("etcd member list: %w", err)
	}
	c.learn(resp.Members)
	return resp.Members, nil
}

func (c *Cluster) cached(maxAge time.Duration, now time.Time) ([]*pb.Member, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.list != nil && maxAge > 0 && now.Sub(c.listAt) < maxAge {
		return c.list, true
	}
	return nil, false
}

func (c *Cluster) cachedSince(asked time.Time, maxAge time.Duration) ([]*pb.Member, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.list != nil && (!c.listAt.Before(asked) || (maxAge > 0 && time.Since(c.listAt) < maxAge)) {
		return c.list, true
	}
	return nil, false
}

// ListReads counts the member list reads sent so far, cached answers not
// included.
func (c *Cluster) ListReads() int64 { return c.reads.Load() }

// LocalMemberList reads the member list as any one member knows it
// (serializable): it answers without a quorum, so a command can still say
// what is wrong with the cluster. Not cached, not followed.
func (c *Cluster) LocalMemberList(ctx context.Context) ([]*pb.Member, error) {
	resp, err := Do(ctx, c, func(ctx context.Context, m *Member) (*clientv3.MemberListResponse, error) {
		return m.Client.MemberList(ctx, clientv3.WithSerializable())
	})
	if err != nil {
		return nil, fmt.Errorf("etcd member list (serializable): %w", err)
	}
	return resp.Members, nil
}

// Voters returns the voting members (ID -> name; "" for one not started
// yet) of the last member list read, nil before the first.
func (c *Cluster) Voters() map[uint64]string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.voters
}

// learn records a member list and follows its client URLs.
func (c *Cluster) learn(list []*pb.Member) {
	voters := map[uint64]string{}
	var urls []string
	for _, mem := range list {
		if !mem.IsLearner {
			voters[mem.ID] = mem.Name
		}
		urls = append(urls, mem.ClientURLs...) // a member not started yet has none
	}
	c.mu.Lock()
	c.list, c.listAt, c.voters = list, time.Now(), voters
	c.mu.Unlock()
	if len(urls) > 0 {
		c.follow(urls)
	}
}

// follow makes the connections match the client URLs the cluster
// advertises (and the seeds, with KeepSeeds): new URLs are dialled,
// connections to URLs nobody advertises any more are closed.
func (c *Cluster) follow(urls []string) {
	want := map[string]bool{}
	for _, u := range urls {
		want[u] = true
	}
	if c.cfg.KeepSeeds {
		for s := range c.seeds {
			want[s] = true
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	c.wanted = slices.Sorted(maps.Keys(want))
	var keep []*Member
	have := map[string]bool{}
	for _, m := range c.members {
		if want[m.Endpoint] {
			keep = append(keep, m)
			have[m.Endpoint] = true
			continue
		}
		c.log.Info("etcd endpoint no longer advertised by any member; dropping it", "endpoint", m.Endpoint)
		_ = m.Client.Close() // an operation still using it fails like a dead member
	}
	added := slices.Sorted(func(yield func(string) bool) {
		for u := range want {
			if !have[u] && !yield(u) {
				return
			}
		}
	})
	for _, u := range added {
		m, err := c.dial(u)
		if err != nil {
			c.log.Warn("cannot use etcd endpoint advertised by a member", "endpoint", u, "err", err)
			continue
		}
		c.log.Info("new etcd endpoint advertised by a member", "endpoint", u)
		keep = append(keep, m)
	}
	if len(keep) > 0 {
		c.members = keep
	}
}

// Do runs op through every member at once and returns the first success.
// When every member fails it returns their errors joined.
func Do[T any](ctx context.Context, c *Cluster, op func(context.Context, *Member) (T, error)) (T, error) {
	return DoUntil(ctx, c, op, nil)
}

// DoUntil is Do where an error for which final returns true is an answer as
// good as a success (a compare-and-swap that lost), returned at once.
//
// When every member failed and the connections changed meanwhile (the
// member list dropped an endpoint, closing the connection the operation
// was using: "the client connection is closing"), the operation is tried
// once more over the connections as they are now.
func DoUntil[T any](ctx context.Context, c *Cluster, op func(context.Context, *Member) (T, error), final func(error) bool) (T, error) {
	members := c.Members()
	v, err := doUntil(ctx, c, members, op, final)
	var none memberErrors
	if errors.As(err, &none) && ctx.Err() == nil && !sameMembers(members, c.Members()) {
		return doUntil(ctx, c, c.Members(), op, final)
	}
	return v, err
}

// Hedged is DoUntil that asks the member at endpoint first alone, and the
// others as well only once it has failed or not answered within delay: one
// request per operation while that member is healthy, every member's help
// when it is not. With first empty it asks every member at once. It also
// returns the member that answered (nil when none did).
func Hedged[T any](ctx context.Context, c *Cluster, first string, delay time.Duration, op func(context.Context, *Member) (T, error), final func(error) bool) (T, *Member, error) {
	v, m, _, err := hedged(ctx, c, first, delay, op, final)
	return v, m, err
}

// hedged is Hedged that also returns the answering member's own round trip
// (from when it was asked, not from when the operation began).
func hedged[T any](ctx context.Context, c *Cluster, first string, delay time.Duration, op func(context.Context, *Member) (T, error), final func(error) bool) (T, *Member, time.Duration, error) {
	c.identify(ctx)
	members := c.Members()
	var zero T
	if len(members) == 0 {
		return zero, nil, 0, errors.New("etcdcluster: closed")
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // stops the slower members; their goroutines then finish
	type result struct {
		v    T
		m    *Member
		took time.Duration
		err  error
	}
	ch := make(chan result, len(members))
	started := map[*Member]bool{}
	start := func(m *Member) {
		if started[m] {
			return
		}
		started[m] = true
		go func() {
			asked := time.Now()
			v, err := op(ctx, m)
			ch <- result{v, m, time.Since(asked), err}
		}()
	}
	startAll := func() {
		for _, m := range members {
			start(m)
		}
	}
	for _, m := range members {
		if m.Endpoint == first {
			start(m)
		}
	}
	if len(started) == 0 {
		startAll()
	}
	t := time.NewTimer(delay)
	defer t.Stop()
	var errs []error
	for {
		select {
		case r := <-ch:
			if r.err == nil || (final != nil && final(r.err)) {
				return r.v, r.m, r.took, r.err
			}
			errs = append(errs, r.err)
			startAll()
			if len(errs) == len(started) {
				return zero, nil, 0, fmt.Errorf("no etcd member answered: %w", memberErrors(errs))
			}
		case <-t.C:
			startAll()
		}
	}
}

// sameMembers tells whether two snapshots hold the same connections.
func sameMembers(a, b []*Member) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func doUntil[T any](ctx context.Context, c *Cluster, members []*Member, op func(context.Context, *Member) (T, error), final func(error) bool) (T, error) {
	c.identify(ctx)
	var zero T
	if len(members) == 0 {
		return zero, errors.New("etcdcluster: closed")
	}
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
		if r.err == nil || (final != nil && final(r.err)) {
			return r.v, r.err
		}
		errs = append(errs, r.err)
	}
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
