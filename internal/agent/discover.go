package agent

import (
	"context"
	"sync"
	"time"

	"github.com/vigil-ha/vigil/internal/discovery"
	"github.com/vigil-ha/vigil/internal/etcdmember"
)

// discoverer follows the etcd member list through the agent's one etcd
// client, an etcdmember.Lister: etcd's JSON gateway, one connection to one
// member at a time. It starts from the learned client URLs and the seeds,
// follows the URLs the members advertise and keeps the seeds as a last
// resort. (Not etcdcluster: the gRPC client it is built on would cost the
// agent 7 MiB of its 20 MiB, bench/agent/README.md.)
type discoverer struct {
	a  *Agent
	cl *etcdmember.Lister

	mu       sync.Mutex
	lastRead time.Time
	lastErr  string
}

func newDiscoverer(a *Agent) (*discoverer, error) {
	cl, err := etcdmember.NewLister(etcdmember.ListerConfig{
		Endpoints: a.memberListEndpoints(),
		TLS:       a.cfg.EtcdTLS,
	})
	if err != nil {
		return nil, err
	}
	return &discoverer{a: a, cl: cl}, nil
}

func (d *discoverer) close() { d.cl.Close() }

// run reads the member list every DiscoveryInterval. A failed read keeps
// the backends as they are: an etcd outage must not empty the agent.
func (d *discoverer) run(ctx context.Context) {
	t := time.NewTimer(0)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rctx, cancel := context.WithTimeout(ctx, min(d.a.cfg.DiscoveryInterval, 3*time.Second))
		s, err := d.cl.Serving(rctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			d.a.m.reads.WithLabelValues("error").Inc()
			d.mu.Lock()
			d.lastErr = err.Error()
			d.mu.Unlock()
			if !failing {
				d.a.log.Warn("cannot read the etcd member list; keeping the current backends", "err", err)
				failing = true
			}
		default:
			d.a.m.reads.WithLabelValues("ok").Inc()
			if failing {
				d.a.log.Info("etcd member list readable again")
				failing = false
			}
			d.mu.Lock()
			d.lastRead, d.lastErr = time.Now(), ""
			d.mu.Unlock()
			if len(s.Hosts) > 0 {
				d.a.learn(etcdmember.WithPort(s.Hosts, d.a.cfg.BackendPort), s.HostPorts, s.URLs)
			}
		}
		t.Reset(discovery.Jitter(d.a.cfg.DiscoveryInterval))
	}
}

func (d *discoverer) state() (time.Time, string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.lastRead, d.lastErr
}
