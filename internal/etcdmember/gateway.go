package etcdmember

import (
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
)

// ErrNoEndpoints is returned by NewLister without an endpoint.
var ErrNoEndpoints = errors.New("etcdmember: no etcd endpoints")

// DefaultTry bounds each member's turn in a read: a member that lost power
// leaves a connection that looks open, and a read on it hangs until its
// deadline.
const DefaultTry = time.Second

// memberListPath is etcd's JSON gateway for Cluster.MemberList. It is
// served on every client URL unless etcd runs with
// --enable-grpc-gateway=false (kubeadm leaves it on).
const memberListPath = "/v3/cluster/member/list"

// ListerConfig configures a Lister.
type ListerConfig struct {
	// Endpoints are the client URLs to start from (seeds). They stay in
	// the rotation when no member advertises them: the last resort.
	Endpoints []string
	TLS       *tls.Config // nil for plain http endpoints
	// Try bounds each member's turn (DefaultTry when 0).
	Try time.Duration
	// OnForeign is called the first time an endpoint answers for another
	// etcd cluster than the one the Lister follows.
	OnForeign func(endpoint string, clusterID, want uint64)
}

// ErrForeignCluster is the error of a member list from another etcd
// cluster than the one the Lister follows (an impostor at a member's
// address): it is neither returned nor followed.
var ErrForeignCluster = errors.New("etcdmember: the endpoint answers for another etcd cluster")

// Lister reads the member list over etcd's JSON gateway: plain HTTPS, one
// connection to one member at a time. It is the worker agent's etcd
// client. Run on every machine, N agents then cost etcd N connections and
// N reads per interval, not N per member; and the agent's binary links no
// gRPC, which is most of the memory an etcd client costs it
// (bench/agent/README.md).
//
// A read goes to the member that answered last; when that one fails, the
// next in turn, and the next read starts after the one that failed. After
// each read the rotation is what the members advertise, plus the seeds.
// Safe for concurrent use.
type Lister struct {
	cfg   ListerConfig
	seeds []string
	hc    *http.Client
	tr    *http.Transport

	readMu    sync.Mutex // one read at a time; guards lastGood and connected
	lastGood  string     // the member to try first
	connected string     // the member the kept-alive connection may go to

	mu     sync.Mutex // guards wanted, clusterID, votes and foreign
	wanted []string
	// clusterID is the cluster followed, learned once a majority of the
	// seeds answered with it (one seed: its first answer); votes are the
	// answers before that, by cluster ID; foreign the endpoints that
	// answered for another since.
	clusterID uint64
	votes     map[uint64]map[string]bool
	foreign   map[string]uint64
}

// NewLister validates cfg; nothing is dialled before the first read.
func NewLister(cfg ListerConfig) (*Lister, error) {
	if len(cfg.Endpoints) == 0 {
		return nil, ErrNoEndpoints
	}
	if cfg.Try == 0 {
		cfg.Try = DefaultTry
	}
	seeds := slices.Clone(cfg.Endpoints)
	for _, s := range seeds {
		if !strings.HasPrefix(s, "http://") && !strings.HasPrefix(s, "https://") {
			return nil, fmt.Errorf("etcdmember: endpoint %q: want an http:// or https:// URL", s)
		}
	}
	slices.Sort(seeds)
	seeds = slices.Compact(seeds)
	tr := &http.Transport{
		TLSClientConfig:     cfg.TLS,
		MaxIdleConnsPerHost: 1,
		IdleConnTimeout:     time.Minute,
		TLSHandshakeTimeout: cfg.Try,
	}
	return &Lister{
		cfg:     cfg,
		seeds:   seeds,
		tr:      tr,
		hc:      &http.Client{Transport: tr},
		wanted:  seeds,
		votes:   map[uint64]map[string]bool{},
		foreign: map[string]uint64{},
	}, nil
}

// ClusterID is the ID of the etcd cluster followed (0 until learned).
func (l *Lister) ClusterID() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.clusterID
}

// Foreign returns the endpoints that answered for another cluster, with
// the ID they answered with.
func (l *Lister) Foreign() map[string]uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.foreign)
}

// accept judges an answer from ep for cluster cid: nil when it is the
// cluster followed, or completes the majority that makes it so; errUnknown
// while no majority agrees yet (the answer counts as a vote).
func (l *Lister) accept(ep string, cid uint64) error {
	if cid == 0 {
		return nil
	}
	l.mu.Lock()
	if l.clusterID == 0 {
		if l.votes[cid] == nil {
			l.votes[cid] = map[string]bool{}
		}
		l.votes[cid][ep] = true
		if len(l.votes[cid]) < len(l.seeds)/2+1 {
			l.mu.Unlock()
			return errIDUnknown
		}
		l.clusterID, l.votes = cid, nil
		l.mu.Unlock()
		return nil
	}
	want := l.clusterID
	if cid == want {
		l.mu.Unlock()
		return nil
	}
	first := l.foreign[ep] != cid
	l.foreign[ep] = cid
	l.mu.Unlock()
	if first && l.cfg.OnForeign != nil {
		l.cfg.OnForeign(ep, cid, want)
	}
	return fmt.Errorf("%w: %s answers for cluster %x, not %x", ErrForeignCluster, ep, cid, want)
}

// errIDUnknown: an answer before a majority of the seeds agreed on the
// cluster ID (it counted as a vote).
var errIDUnknown = errors.New("etcdmember: the etcd cluster ID is not known yet (waiting for a majority of the seeds to agree on it)")

// Endpoints returns the rotation: the seeds and what the members advertised
// in the last read, sorted.
func (l *Lister) Endpoints() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.wanted)
}

// Close closes the idle connection.
func (l *Lister) Close() { l.tr.CloseIdleConnections() }

// GatewayMember is one member as the JSON gateway describes it.
type GatewayMember struct {
	Name       string   `json:"name"`
	PeerURLs   []string `json:"peerURLs"`
	ClientURLs []string `json:"clientURLs"`
	IsLearner  bool     `json:"isLearner"`
}

// GetClientURLs implements Member.
func (m GatewayMember) GetClientURLs() []string { return m.ClientURLs }

// GetIsLearner implements Member.
func (m GatewayMember) GetIsLearner() bool { return m.IsLearner }

// MemberList reads the member list now (linearizable: a member cut off from
// the quorum does not answer with a stale list).
func (l *Lister) MemberList(ctx context.Context) ([]GatewayMember, error) {
	l.readMu.Lock()
	defer l.readMu.Unlock()
	eps := l.Endpoints()
	if i := slices.Index(eps, l.lastGood); i > 0 {
		eps = append(eps[i:], eps[:i]...) // a rotation: every member gets its turn
	}
	var errs []error
	for i, ep := range eps {
		if l.connected != ep {
			// One connection at a time: the one to the member that
			// stopped answering goes.
			l.tr.CloseIdleConnections()
			l.connected = ep
		}
		tctx, cancel := context.WithTimeout(ctx, l.cfg.Try)
		members, err := l.read(tctx, ep)
		cancel()
		if err == nil {
			l.lastGood = ep
			l.follow(members)
			return members, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", ep, err))
		// The next read starts with the next member, even if this one
		// runs out of time first: a dead member is not tried first again.
		l.lastGood = eps[(i+1)%len(eps)]
		if ctx.Err() != nil {
			break
		}
	}
	return nil, fmt.Errorf("etcd member list: no member answered: %w", errors.Join(errs...))
}

// Serving reads the member list now and returns what its voters serve.
func (l *Lister) Serving(ctx context.Context) (Serving, error) {
	members, err := l.MemberList(ctx)
	if err != nil {
		return Serving{}, err
	}
	return ServingOf(members), nil
}

func (l *Lister) read(ctx context.Context, ep string) ([]GatewayMember, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(ep, "/")+memberListPath,
		bytes.NewReader([]byte(`{"linearizable":true}`)))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := l.hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Message string `json:"message"`
			Error   string `json:"error"`
		}
		_ = json.Unmarshal(body, &e)
		msg := cmp.Or(e.Message, e.Error, strings.TrimSpace(string(body)))
		if resp.StatusCode == http.StatusNotFound {
			return nil, fmt.Errorf("HTTP 404 for %s: is etcd's JSON gateway off (--enable-grpc-gateway=false)?", memberListPath)
		}
		return nil, fmt.Errorf("HTTP %d: %s", resp.StatusCode, msg)
	}
	var out struct {
		Header struct {
			ClusterID uint64 `json:"cluster_id,string"`
		} `json:"header"`
		Members []GatewayMember `json:"members"`
	}
	if err := json.Unmarshal(body, &out); err != nil {
		return nil, fmt.Errorf("member list: %w", err)
	}
	if len(out.Members) == 0 {
		return nil, errors.New("member list: no member in the answer")
	}
	if err := l.accept(ep, out.Header.ClusterID); err != nil {
		return nil, err
	}
	return out.Members, nil
}

// follow makes the rotation the client URLs the members advertise (by the
// rule of ClientURLs: not a loopback URL beside a routable one, which on a
// worker would be the agent's own listener), plus the seeds.
func (l *Lister) follow(members []GatewayMember) {
	want := slices.Clone(l.seeds)
	for _, m := range members {
		for _, u := range ClientURLs(m) { // a member not started yet has none
			want = append(want, u.String())
		}
	}
	slices.Sort(want)
	want = slices.Compact(want)
	l.mu.Lock()
	l.wanted = want
	l.mu.Unlock()
}
