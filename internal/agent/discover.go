package agent

import (
	"context"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/vigil-ha/vigil/internal/discovery"
)

// discoverer follows the etcd member list through the agent's own etcd
// client, whose endpoints are the learned client URLs and the seeds.
type discoverer struct {
	a   *Agent
	cli *clientv3.Client

	mu       sync.Mutex
	lastRead time.Time
	lastErr  string
}

func newDiscoverer(a *Agent) (*discoverer, error) {
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   a.memberListEndpoints(),
		DialTimeout: 2 * time.Second,
		TLS:         a.cfg.EtcdTLS,
		Logger:      zap.NewNop(),
		// Keepalive finds a silent endpoint; the balancer moves to another.
		// Well above etcd's --grpc-keepalive-min-time (5 s), which answers
		// more frequent pings with GOAWAY too_many_pings.
		DialKeepAliveTime:    30 * time.Second,
		DialKeepAliveTimeout: 3 * time.Second,
	})
	if err != nil {
		return nil, err
	}
	return &discoverer{a: a, cli: cli}, nil
}

func (d *discoverer) close() { d.cli.Close() }

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
		resp, err := d.cli.MemberList(rctx)
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
			api, etcd, urls := fromMembers(resp.Members, d.a.cfg.BackendPort)
			if len(api) > 0 {
				d.a.learn(api, etcd, urls)
				d.cli.SetEndpoints(d.a.memberListEndpoints()...)
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

// fromMembers turns the voting, started members into API server backends
// (client URL host with apiPort), etcd backends (client URL host:port) and
// the client URLs themselves. Learners are left out: they serve no client
// requests, and their node's API server is not ready before they are
// promoted.
func fromMembers(members []*pb.Member, apiPort int) (api, etcd, urls []string) {
	for _, m := range members {
		if m.IsLearner {
			continue
		}
		for _, u := range discovery.ClientURLs(m) {
			api = append(api, net.JoinHostPort(u.Hostname(), strconv.Itoa(apiPort)))
			etcd = append(etcd, u.Host)
			urls = append(urls, u.String())
		}
	}
	for _, s := range []*[]string{&api, &etcd, &urls} {
		slices.Sort(*s)
		*s = slices.Compact(*s)
	}
	return api, etcd, urls
}
