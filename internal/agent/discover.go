package agent

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/vigil-ha/vigil/internal/discovery"
	"github.com/vigil-ha/vigil/internal/etcdmember"
	"github.com/vigil-ha/vigil/internal/kubelite"
)

// The agent learns its backends through discovery, as vigil run does: the
// etcd member list and the kubernetes EndpointSlices, one union, a source
// that fails or goes empty keeping its last answer, failures logged once
// per outage. What is the agent's own: the seeds (a last-resort tier of
// the balancers, not a discovery source), the etcd upstream and the list of
// client URLs made from each member list (OnMembers), and the cache.

// memberSource is the agent's etcd client, an etcdmember.Lister (etcd's
// JSON gateway, one connection to one member at a time), counted and
// remembered for /metrics and /status. Not etcdcluster: the gRPC client it
// is built on cost the agent 7 MiB of resident memory (bench/agent/README.md).
type memberSource struct {
	l *etcdmember.Lister
	m *agentMetrics
	// fed says what the agent feed says the members serve, when it is
	// fresh: then no read reaches etcd.
	fed func() (etcdmember.Serving, bool)

	mu       sync.Mutex
	lastRead time.Time
	lastErr  string
}

func newMemberSource(a *Agent) (*memberSource, error) {
	l, err := etcdmember.NewLister(etcdmember.ListerConfig{
		Endpoints: a.memberListEndpoints(),
		TLS:       a.cfg.EtcdTLS,
		OnForeign: func(ep string, id, want uint64) {
			a.m.foreign.Inc()
			a.log.Warn("refusing an etcd endpoint that answers for another cluster (an impostor at a member's address?); its member lists are ignored",
				"endpoint", ep, "cluster_id", fmt.Sprintf("%x", id), "expected", fmt.Sprintf("%x", want))
		},
	})
	if err != nil {
		return nil, err
	}
	return &memberSource{l: l, m: a.m, fed: a.fedMembers}, nil
}

// Serving implements discovery.MemberLister.
func (s *memberSource) Serving(ctx context.Context) (etcdmember.Serving, error) {
	if sv, ok := s.fed(); ok {
		s.m.reads.WithLabelValues("feed").Inc()
		return sv, nil
	}
	sv, err := s.l.Serving(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.m.reads.WithLabelValues("error").Inc()
		s.lastErr = err.Error()
		return sv, err
	}
	s.m.reads.WithLabelValues("ok").Inc()
	s.lastRead, s.lastErr = time.Now(), ""
	return sv, nil
}

func (s *memberSource) state() (time.Time, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastRead, s.lastErr
}

// newDiscovery wires the sources the configuration names; nil when it names
// none (the seeds are then the only backends).
func (a *Agent) newDiscovery() (*discovery.Discovery, *memberSource, error) {
	cfg := discovery.Config{
		Port:      a.cfg.BackendPort,
		Interval:  a.cfg.DiscoveryInterval,
		OnChange:  a.learnAPIServers,
		OnMembers: a.learnEtcd,
	}
	var ms *memberSource
	if len(a.cfg.EtcdSeeds) > 0 {
		var err error
		if ms, err = newMemberSource(a); err != nil {
			return nil, nil, err
		}
		cfg.Members = ms
	}
	if a.follower != nil {
		cfg.Fed = fedAPIServers{a}
	}
	var d *discovery.Discovery
	if a.cfg.Kube != nil {
		// d is set before Run starts the follower, the only caller.
		cfg.Published = kubelite.NewAPIServers(a.cfg.Kube, func([]string) { d.PublishedChanged() }, a.log)
	}
	if cfg.Members == nil && cfg.Published == nil && cfg.Fed == nil {
		return nil, nil, nil
	}
	d, err := discovery.New(cfg, a.log)
	if err != nil {
		if ms != nil {
			ms.l.Close()
		}
		return nil, nil, err
	}
	return d, ms, nil
}

// learnAPIServers applies the API server set discovery publishes (the union
// of the member list's and the EndpointSlices') and caches it.
func (a *Agent) learnAPIServers(api []string) {
	if a.api.setLearned(api) {
		a.api.apply()
		a.log.Info("API servers learned from the cluster", "apiservers", api)
		a.saveCache()
	}
}

// learnEtcd applies what a member list read says of etcd: the etcd
// backends, and the client URLs the next start reads the list from.
func (a *Agent) learnEtcd(s etcdmember.Serving) {
	if len(s.Hosts) == 0 {
		return // nothing started serves yet: keep what there is
	}
	a.mu.Lock()
	urlsChanged := !slices.Equal(a.etcdURLs, s.URLs)
	a.etcdURLs = slices.Clone(s.URLs)
	a.mu.Unlock()
	changed := false
	if a.etcd != nil && a.etcd.setLearned(s.HostPorts) {
		a.etcd.apply()
		changed = true
		a.log.Info("etcd members learned from the member list", "etcd", s.HostPorts)
	}
	if changed || urlsChanged {
		a.saveCache()
	}
}
