// Package discovery finds the API servers to balance across, from the
// cluster itself rather than from a list typed on every node.
//
// Two sources, either or both:
//
//   - the etcd member list. On a kubeadm control plane every member runs
//     next to a kube-apiserver, so each member's advertised client URL host
//     plus the API server port is a backend. The list is re-read every
//     Interval (etcd has no watch on membership). It works before any API
//     server exists, which is what bootstrap needs.
//   - the API servers published in the kubernetes Service's EndpointSlices
//     (kubelite.APIServers, a watch): each kube-apiserver adds itself there, so
//     this also finds API servers that run apart from etcd (external etcd).
//
// The backends are the union of what the sources said last: a source that
// fails keeps its last answer, so an outage of one never empties the load
// balancer, and health checks take dead backends out in the meantime. A
// member added, removed or replaced is reflected within one interval (at
// once through the watch), on every node, with no flag changed. Static
// backends (--backend) serve only until a source has answered: they are for
// bootstrap, not another source of truth.
package discovery

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vigil-ha/vigil/internal/etcdmember"
	"github.com/vigil-ha/vigil/internal/validate"
)

// validate.ErrInvalid wraps every configuration error of this package.

// DefaultInterval is how often the member list is read. Membership changes
// are rare and deliberate; two seconds makes a change visible "within
// seconds" at the cost of one linearizable read per node every two seconds.
const DefaultInterval = 2 * time.Second

// MemberLister reads the etcd member list and says what its voters serve
// (etcdcluster.Cluster does through gRPC, etcdmember.Lister through etcd's
// JSON gateway).
type MemberLister interface {
	Serving(ctx context.Context) (etcdmember.Serving, error)
}

// Follower is a source that follows its backends by itself and says when
// they change (kubelite.APIServers does).
type Follower interface {
	// Run follows until ctx is cancelled.
	Run(ctx context.Context) error
	// Backends returns the current host:port set, and whether it was read
	// at least once.
	Backends() ([]string, bool)
}

// Source is a source that someone else runs: its last answer, and whether
// it answered at least once.
type Source interface {
	Backends() ([]string, bool)
}

// Config configures a Discovery.
type Config struct {
	Members MemberLister
	// Published, when set, is run by Run; the caller wires its change
	// notification to PublishedChanged.
	Published Follower
	// Fed, when set, is the worker agent's feed (internal/feed): the API
	// servers a control-plane node's vigil balances. Its owner runs it and
	// calls PublishedChanged when it changes.
	Fed Source
	// Port is the API server port added to each member's host.
	Port int
	// Static backends (host:port) are used until the member list was read.
	Static   []string
	Interval time.Duration
	// OnChange gets the new backend set, sorted, each time it changes. It is
	// called from Run's goroutine.
	OnChange func([]string)
	// OnMembers, when set, gets everything the member list's voters serve
	// after each successful read, before the backends are published: the
	// worker agent makes its etcd backends and its cache of client URLs
	// from it. Called from Run's goroutine.
	OnMembers func(etcdmember.Serving)
}

// Discovery keeps the backend set current.
type Discovery struct {
	cfg     Config
	log     *slog.Logger
	poke    chan struct{} // read every source now
	pokePub chan struct{} // the Published source changed
	mu      sync.Mutex    // guards cur, found and sources
	cur     []string
	found   bool // a set was published at least once
	sources map[string]*SourceState
}

// Source names, as SourceState.Name and in logs.
const (
	SourceEtcd       = "etcd member list"
	SourceKubernetes = "kubernetes EndpointSlices"
	SourceFeed       = "vigil agent feed"
)

// SourceState is what one source said last, for status reports.
type SourceState struct {
	Name string `json:"name"`
	// Backends is the source's last answer; it counts even while the
	// source fails.
	Backends []string `json:"backends"`
	// Answered is false until the source has answered once.
	Answered bool `json:"answered"`
	// Error is the last read's failure, "" when it succeeded.
	Error string `json:"error,omitempty"`
}

// New validates cfg.
func New(cfg Config, log *slog.Logger) (*Discovery, error) {
	if cfg.Interval == 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.Port < 1 || cfg.Port > 65535 {
		return nil, fmt.Errorf("%w: backend port %d is out of range 1-65535", validate.ErrInvalid, cfg.Port)
	}
	for _, s := range cfg.Static {
		if _, err := netip.ParseAddrPort(s); err != nil {
			if host, port, err := net.SplitHostPort(s); err != nil || host == "" || !validPort(port) {
				return nil, fmt.Errorf("%w: backend %q must be HOST:PORT", validate.ErrInvalid, s)
			}
		}
	}
	if cfg.Members == nil && cfg.Published == nil && cfg.Fed == nil && len(cfg.Static) == 0 {
		return nil, fmt.Errorf("%w: no source of backends (neither etcd, nor Kubernetes, nor `backend`)", validate.ErrInvalid)
	}
	d := &Discovery{cfg: cfg, log: log.With("component", "discovery"), poke: make(chan struct{}, 1), pokePub: make(chan struct{}, 1), sources: map[string]*SourceState{}}
	if cfg.Members != nil {
		d.sources[SourceEtcd] = &SourceState{Name: SourceEtcd}
	}
	if cfg.Published != nil {
		d.sources[SourceKubernetes] = &SourceState{Name: SourceKubernetes}
	}
	if cfg.Fed != nil {
		d.sources[SourceFeed] = &SourceState{Name: SourceFeed}
	}
	return d, nil
}

// Sources reports each source's last answer, sorted by name.
func (d *Discovery) Sources() []SourceState {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []SourceState
	for _, st := range d.sources {
		c := *st
		c.Backends = slices.Clone(st.Backends)
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b SourceState) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// record notes a source's read: its backends (kept when empty or failed)
// and error.
func (d *Discovery) record(name string, b []string, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	st := d.sources[name]
	if err != nil {
		st.Error = err.Error()
		return
	}
	st.Error = ""
	if len(b) > 0 {
		st.Backends, st.Answered = slices.Clone(b), true
	}
}

// Backends returns the current set.
func (d *Discovery) Backends() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.cur)
}

// Refresh asks Run to read the sources now: for callers that just changed
// the member list (a member removal must take its backend away at once).
func (d *Discovery) Refresh() {
	select {
	case d.poke <- struct{}{}:
	default:
	}
}

// PublishedChanged tells Run that the Published or the Fed source has a
// new set: it is taken at once, without a member list read (N agents would
// otherwise all read the member list when one EndpointSlice changes).
func (d *Discovery) PublishedChanged() {
	select {
	case d.pokePub <- struct{}{}:
	default:
	}
}

// Run publishes the static set, then follows the sources until ctx is
// cancelled. Read failures keep the last set and are logged once per outage.
func (d *Discovery) Run(ctx context.Context) error {
	if len(d.cfg.Static) > 0 {
		st := slices.Clone(d.cfg.Static)
		slices.Sort(st)
		d.publish(slices.Compact(st), "static bootstrap backends")
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	if d.cfg.Published != nil {
		wg.Go(func() { _ = d.cfg.Published.Run(ctx) })
	}
	t := time.NewTimer(0)
	defer t.Stop()
	failing := false
	for {
		readMembers := true
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-d.poke:
		case <-d.pokePub:
			readMembers = false
		}
		if d.cfg.Members != nil && readMembers {
			rctx, cancel := context.WithTimeout(ctx, d.cfg.Interval)
			serving, err := d.cfg.Members.Serving(rctx)
			cancel()
			switch {
			case ctx.Err() != nil:
				return nil
			case err != nil:
				d.record(SourceEtcd, nil, err)
				if !failing {
					d.log.Warn("cannot read the etcd member list; keeping the last backends", "err", err)
					failing = true
				}
			default:
				if failing {
					d.log.Info("etcd member list readable again")
					failing = false
				}
				if d.cfg.OnMembers != nil {
					d.cfg.OnMembers(serving)
				}
				d.record(SourceEtcd, etcdmember.WithPort(serving.Hosts, d.cfg.Port), nil)
			}
		}
		if d.cfg.Published != nil {
			if b, ok := d.cfg.Published.Backends(); ok {
				d.record(SourceKubernetes, b, nil)
			}
		}
		if d.cfg.Fed != nil {
			if b, ok := d.cfg.Fed.Backends(); ok {
				d.record(SourceFeed, b, nil)
			}
		}
		if b, names := d.union(); len(b) > 0 {
			d.publish(b, names)
		}
		if readMembers {
			t.Reset(Jitter(d.cfg.Interval))
		}
	}
}

// Jitter returns d shortened by a random part of up to a fifth. Periodic
// work that many processes do against the same servers (every agent reads
// the etcd member list) uses it, so that processes started together, by a
// rollout or a power cut, drift apart within a few rounds instead of
// hitting the servers in the same instant forever. Only shortened, so every
// documented interval stays an upper bound.
func Jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return d
	}
	return d - rand.N(d/5+1)
}

// union is the union of every source's last answer, and the names of the
// sources that gave one.
func (d *Discovery) union() ([]string, string) {
	var b, names []string
	for _, st := range d.Sources() {
		if st.Answered {
			b = append(b, st.Backends...)
			names = append(names, st.Name)
		}
	}
	slices.Sort(b)
	return slices.Compact(b), strings.Join(names, " and ")
}

func (d *Discovery) publish(b []string, source string) {
	d.mu.Lock()
	if d.found && slices.Equal(b, d.cur) {
		d.mu.Unlock()
		return
	}
	d.found = true
	d.cur = b
	d.mu.Unlock()
	d.log.Info("backends", "source", source, "backends", b)
	if d.cfg.OnChange != nil {
		d.cfg.OnChange(slices.Clone(b))
	}
}

func validPort(p string) bool {
	n, err := strconv.Atoi(p)
	return err == nil && n >= 1 && n <= 65535
}
