package daemon

import (
	"context"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/vigil-ha/vigil/internal/etcdmember"
	"github.com/vigil-ha/vigil/internal/feed"
	"github.com/vigil-ha/vigil/internal/health"
	"github.com/vigil-ha/vigil/internal/membership"
	"github.com/vigil-ha/vigil/internal/observe"
	"github.com/vigil-ha/vigil/internal/validate"
)

// feedPart serves the agent feed (--agent-feed-listen): what this node's
// own checks see of the API servers (its health checker) and of the etcd
// members (its membership observer), for the worker agents, so that they
// need not each check every backend every second (docs/agent.md, "At fleet
// scale"). Every node serves it, holder or not: an agent that cannot reach
// the VIP reads another node's.
type feedPart struct {
	srv     *feed.Server
	ln      net.Listener
	node    string
	log     *slog.Logger
	checker *health.Checker
	poke    chan struct{}

	mu   sync.Mutex
	etcd []feed.Backend // the last observation's voters; nil before one (or without etcd)
}

// newFeedPart opens the feed's listener; nil without --agent-feed-listen.
func (n *node) newFeedPart() error {
	if n.cfg.AgentFeedListen == "" {
		return nil
	}
	ln, err := observe.Listen(n.cfg.AgentFeedListen, "`agentFeedListen`")
	if err != nil {
		return validate.Invalid(err)
	}
	srv, err := feed.NewServer(feed.ServerConfig{Metrics: n.m.reg}, n.log.With("component", "feed"))
	if err != nil {
		_ = ln.Close()
		return err
	}
	n.feed = &feedPart{srv: srv, ln: ln, node: n.cfg.NodeName, log: n.log, poke: make(chan struct{}, 1)}
	n.onClose(func() { _ = ln.Close() })
	return nil
}

// changed says the view may have changed: a backend's health, the backend
// set, or the etcd members. Safe on a nil part.
func (p *feedPart) changed() {
	if p == nil {
		return
	}
	select {
	case p.poke <- struct{}{}:
	default:
	}
}

// observed takes the etcd voters of an observation of the members.
func (p *feedPart) observed(v membership.View) {
	if p == nil {
		return
	}
	etcd := []feed.Backend{}
	for _, m := range v.Members {
		if m.Learner {
			continue // no backend: see etcdmember.Serving
		}
		for _, u := range etcdmember.ClientURLs(memberURLs(m.ClientURLs)) {
			b := feed.Backend{Addr: u.Host, URL: u.String(), Up: m.Reachable}
			if !b.Up {
				b.Cause = health.Unreachable.String()
			}
			etcd = append(etcd, b)
		}
	}
	slices.SortFunc(etcd, func(a, b feed.Backend) int { return strings.Compare(a.Addr, b.Addr) })
	p.mu.Lock()
	p.etcd = etcd
	p.mu.Unlock()
	p.changed()
}

// memberURLs is a voter's client URLs as an etcdmember.Member.
type memberURLs []string

func (m memberURLs) GetClientURLs() []string { return m }
func (memberURLs) GetIsLearner() bool        { return false }

// view is what this node sees now.
func (p *feedPart) view() feed.View {
	v := feed.View{Node: p.node, APIServers: feed.APIServersOf(p.checker.Statuses())}
	p.mu.Lock()
	v.Etcd = slices.Clone(p.etcd)
	p.mu.Unlock()
	return v
}

// Run serves the feed and publishes the view on every change (and once a
// second, in case a change came between a read and its poke) until ctx
// ends.
func (p *feedPart) Run(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() {
		if err := p.srv.Serve(ctx, p.ln); err != nil {
			p.log.Warn("the agent feed stopped serving; agents read another node's", "err", err)
		}
	})
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		p.srv.Publish(p.view())
		select {
		case <-ctx.Done():
			return
		case <-p.poke:
		case <-t.C:
		}
	}
}
