package agent

import (
	"fmt"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vigil-ha/vigil/internal/discovery"
	"github.com/vigil-ha/vigil/internal/health"
)

// Status is what /status serves.
type Status struct {
	Server    string          `json:"server"`
	StartedAt time.Time       `json:"startedAt"`
	Upstreams []UpstreamState `json:"upstreams"`
	// LastMemberList is when the etcd member list was last read; empty
	// without etcd seeds.
	LastMemberList *time.Time `json:"lastMemberList,omitempty"`
	MemberListErr  string     `json:"memberListError,omitempty"`
	// EtcdClusterID is the etcd cluster followed (hex; empty until a
	// majority of the seeds agreed on it); EtcdForeign the endpoints that
	// answered for another (endpoint -> cluster ID), whose answers are
	// refused.
	EtcdClusterID string            `json:"etcdClusterID,omitempty"`
	EtcdForeign   map[string]string `json:"etcdForeign,omitempty"`
	// PublishedAPIServers are the API servers the kubernetes Service's
	// EndpointSlices listed last; empty without a kubeconfig or before the
	// first answer.
	PublishedAPIServers []string `json:"publishedAPIServers,omitempty"`
	// Feed is the agent feed read (docs/agent.md, "At fleet scale"); nil
	// with --feed-port 0.
	Feed *FeedState `json:"feed,omitempty"`
}

// FeedState is the agent feed as the agent reads it.
type FeedState struct {
	// Fresh: a feed spoke within the last few seconds, and the agent's
	// own checks of what it vouches for run every FeedCheckInterval.
	Fresh bool `json:"fresh"`
	// Source is the feed read last (host:port), Node its vigil's node.
	Source string `json:"source,omitempty"`
	Node   string `json:"node,omitempty"`
}

// UpstreamState is one local endpoint and its backends.
type UpstreamState struct {
	Name     string         `json:"name"`
	Listen   string         `json:"listen"`
	Backends []BackendState `json:"backends"`
}

// BackendState is one backend as the agent sees it.
type BackendState struct {
	Address string `json:"address"`
	// Source is "cluster" (learned, or cached from an earlier run) or
	// "seed".
	Source string `json:"source"`
	State  string `json:"state"`
	// Since is when State last changed, by this agent's checks or by the
	// agent feed, whichever decided it.
	Since         *time.Time `json:"since,omitempty"`
	Cause         string     `json:"cause,omitempty"`
	LastError     string     `json:"lastError,omitempty"`
	Tier          int        `json:"tier"`
	LatencyMillis float64    `json:"latencyMillis,omitempty"`
	Connections   int        `json:"connections"`
}

// Ready reports whether every local endpoint has a backend whose checks
// pass: until then a client of that endpoint is served, if at all, by a
// backend nobody has seen healthy.
func (a *Agent) Ready(time.Time) error {
	for _, u := range a.upstreams() {
		up := false
		for _, b := range u.bal.Backends() {
			if st, ok := u.checker.Status(b.Address); ok && u.effective(st).State == health.Up {
				up = true
				break
			}
		}
		if !up {
			return fmt.Errorf("no %s backend passes its health checks yet", u.name)
		}
	}
	return nil
}

// Status reports the agent's state.
func (a *Agent) Status() Status {
	s := Status{Server: a.cfg.Server, StartedAt: a.startedAt}
	for _, u := range a.upstreams() {
		us := UpstreamState{Name: u.name, Listen: u.bal.Addr().String()}
		for _, b := range u.bal.Backends() {
			bs := BackendState{Address: b.Address, Source: "seed", Tier: u.picker.tier(b.Address), Connections: b.Connections, State: health.Unknown.String()}
			if u.isLearned(b.Address) {
				bs.Source = "cluster"
			}
			if st, ok := u.checker.Status(b.Address); ok {
				st = u.effective(st)
				bs.State = st.State.String()
				if !st.Since.IsZero() {
					bs.Since = &st.Since
				}
				if st.State == health.Down {
					bs.Cause, bs.LastError = st.Cause.String(), st.LastError
				}
			}
			if d, ok := u.checker.Latency(b.Address); ok {
				bs.LatencyMillis = float64(d.Microseconds()) / 1000
			}
			us.Backends = append(us.Backends, bs)
		}
		s.Upstreams = append(s.Upstreams, us)
	}
	a.mu.Lock()
	disc, ms := a.disc, a.members
	a.mu.Unlock()
	if ms != nil {
		t, err := ms.state()
		if !t.IsZero() {
			s.LastMemberList = &t
		}
		s.MemberListErr = err
		if id := ms.l.ClusterID(); id != 0 {
			s.EtcdClusterID = fmt.Sprintf("%x", id)
		}
		for ep, id := range ms.l.Foreign() {
			if s.EtcdForeign == nil {
				s.EtcdForeign = map[string]string{}
			}
			s.EtcdForeign[ep] = fmt.Sprintf("%x", id)
		}
	}
	if a.follower != nil {
		fresh, v, src := a.follower.State()
		s.Feed = &FeedState{Fresh: fresh, Source: src, Node: v.Node}
	}
	if disc != nil {
		for _, src := range disc.Sources() {
			if src.Name == discovery.SourceKubernetes {
				s.PublishedAPIServers = src.Backends
			}
		}
	}
	return s
}

type agentMetrics struct {
	reads       *prometheus.CounterVec
	cacheErrors prometheus.Counter
	foreign     prometheus.Counter
}

func newAgentMetrics(reg prometheus.Registerer) *agentMetrics {
	m := &agentMetrics{
		reads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vigil_agent_member_list_reads_total", Help: "Reads of the etcd member list, by result (ok, error; feed: answered from the agent feed, nothing sent to etcd).",
		}, []string{"result"}),
		cacheErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vigil_agent_cache_write_errors_total", Help: "Failed writes of the backend cache.",
		}),
	}
	m.foreign = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "vigil_agent_etcd_foreign_endpoints_total", Help: "Times an etcd endpoint was found answering for another etcd cluster than the one the agent follows (an impostor at a member's address); its member lists are refused.",
	})
	reg.MustRegister(m.reads, m.cacheErrors, m.foreign)
	return m
}

func (u *upstream) learnedList() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.Clone(u.learned)
}

func (a *Agent) upstreams() []*upstream {
	if a.etcd == nil {
		return []*upstream{a.api}
	}
	return []*upstream{a.api, a.etcd}
}

// memberListEndpoints are the etcd client URLs the member list is read
// from: the learned ones, then the seeds.
func (a *Agent) memberListEndpoints() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := slices.Clone(a.etcdURLs)
	for _, s := range a.cfg.EtcdSeeds {
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}
