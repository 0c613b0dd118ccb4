package agent

import (
	"math/rand/v2"
	"net"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/vigil-ha/vigil/internal/etcdmember"
	"github.com/vigil-ha/vigil/internal/feed"
	"github.com/vigil-ha/vigil/internal/health"
)

// At fleet scale the agent learns its backends' health from the control
// plane instead of probing each one every second (docs/agent.md, "At fleet
// scale"). Every vigil run serves a feed (internal/feed) of what its own
// checks see; the agent reads one node's feed at a time: the VIP's first,
// then any control-plane node's. While a feed is fresh:
//
//   - its API servers are a discovery source, and its etcd members replace
//     the member list reads (no read reaches etcd);
//   - a backend it says is down takes no new connections, at once;
//   - the agent's own checks of what it vouches for slow to one per
//     FeedCheckInterval (they keep the latencies the tiers are ranked by);
//   - the agent's own evidence still wins: a backend whose connection
//     failed here is down here, and checked every --health-interval until
//     it passes, whatever the feed says. A feed that says every backend is
//     down is not believed (its node is the one cut off).
//
// When no feed is fresh, the agent does what it did before the feed: checks
// every backend every --health-interval and reads the member list every
// --discovery-interval. The feed only saves load; losing it costs that.

// FeedCheckInterval is how often the agent checks a backend the feed
// vouches for: at 5,000 agents, 8 requests per second per API server and
// per etcd member. These checks only refresh the latencies the tiers are
// ranked by; a backend this host cannot reach shows in its connections.
const FeedCheckInterval = 10 * time.Minute

// FeedFirstCheck spreads the agents' first checks of a backend the feed
// announced: at 5,000 agents, 167 connections per second for 30 s. Until
// its first check, the backend is used (the feed vouches for it) in the
// tier of backends not measured yet.
const FeedFirstCheck = 30 * time.Second

// fedState is one upstream's share of the current feed view.
type fedState struct {
	mu    sync.Mutex
	node  string                  // the view's node, for messages
	by    map[string]feed.Backend // by address; nil when no feed is fresh or the view does not cover this upstream
	since map[string]time.Time    // when each backend's verdict in the feed last changed
}

func (f *fedState) set(node string, bs []feed.Backend) {
	var by map[string]feed.Backend
	if feed.HasUp(bs) { // a view with every backend down is its node's problem
		by = make(map[string]feed.Backend, len(bs))
		for _, b := range bs {
			by[b.Addr] = b
		}
	}
	now := time.Now()
	f.mu.Lock()
	defer f.mu.Unlock()
	since := make(map[string]time.Time, len(by))
	for addr, b := range by {
		if old, ok := f.by[addr]; ok && old.Up == b.Up && old.Cause == b.Cause {
			since[addr] = f.since[addr]
		} else {
			since[addr] = now
		}
	}
	f.node, f.by, f.since = node, by, since
}

// get is what the feed says of addr, the node that says it and since when.
func (f *fedState) get(addr string) (b feed.Backend, node string, since time.Time, ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, ok = f.by[addr]
	return b, f.node, f.since[addr], ok
}

// effective is a backend's health as the balancer uses it: the checker's
// status st, overruled by the feed where the feed knows better.
func (u *upstream) effective(st health.Status) health.Status {
	fb, node, since, ok := u.fed.get(st.Backend)
	switch {
	case !ok, st.State == health.Down:
		return st // the feed is silent on it, or this host saw it fail
	case !fb.Up:
		return health.Status{Backend: st.Backend, State: health.Down, Cause: feedCause(fb.Cause),
			LastError: "the agent feed from " + node + " says it is " + fb.Cause, Since: since}
	default:
		if st.State != health.Up || since.After(st.Since) {
			st.State, st.Since = health.Up, since
		}
		return st
	}
}

func feedCause(c string) health.Cause {
	switch c {
	case health.Dead.String():
		return health.Dead
	case health.Draining.String():
		return health.Draining
	default:
		return health.Unreachable
	}
}

// pace is the checker's interval for a backend (health.Checker.SetPace):
// slow while the feed covers it, unless this host saw it fail. A new
// backend the feed vouches for is first checked within FeedFirstCheck
// (the checker picks the moment at random): 5,000 agents told of a new API
// server at once would otherwise all open a connection to it in the same
// second, and under that herd their checks time out and keep it out.
func (u *upstream) pace(st health.Status) time.Duration {
	if _, _, _, ok := u.fed.get(st.Backend); !ok || st.State == health.Down {
		return 0
	}
	if st.State == health.Unknown {
		return u.feedFirst
	}
	return FeedCheckInterval
}

// onHealth is the checker's OnChange.
func (u *upstream) onHealth(st health.Status) { u.bal.Update(u.effective(st)) }

// refeed applies the feed's view to every backend of u.
func (u *upstream) refeed() {
	for _, b := range u.backends() {
		st, ok := u.checker.Status(b)
		if !ok {
			continue
		}
		u.bal.Update(u.effective(st))
		if st.State == health.Down {
			u.checker.Wake(b) // the feed may have it paced slow until now
		}
	}
}

// unfeed forgets the feed: every backend is checked at --health-interval
// again, the first checks spread over one interval, so that a fleet whose
// feeds all went at once does not check in step.
func (u *upstream) unfeed(interval time.Duration) {
	u.fed.set("", nil)
	for _, b := range u.backends() {
		st, ok := u.checker.Status(b)
		if ok {
			u.bal.Update(u.effective(st))
		}
		time.AfterFunc(rand.N(interval+1), func() { u.checker.Wake(b) })
	}
}

// newFollower wires the feed: nil when --feed-port is 0.
func (a *Agent) newFollower() *feed.Follower {
	if a.cfg.FeedPort == 0 {
		return nil
	}
	for _, u := range a.upstreams() {
		u.checker.SetPace(u.pace)
	}
	return feed.NewFollower(feed.FollowerConfig{
		Endpoints: a.feedEndpoints,
		OnView:    a.gotView,
		OnFresh: func(fresh bool) {
			if !fresh {
				for _, u := range a.upstreams() {
					u.unfeed(a.cfg.HealthInterval)
				}
			}
		},
	}, a.log.With("component", "feed"))
}

// feedEndpoints: the VIP's feed first, then every learned API server's host.
func (a *Agent) feedEndpoints() []string {
	port := strconv.Itoa(a.cfg.FeedPort)
	server, _ := url.Parse(a.cfg.Server) // validated
	out := []string{net.JoinHostPort(server.Hostname(), port)}
	for _, b := range a.api.learnedList() {
		if host, _, err := net.SplitHostPort(b); err == nil {
			if ep := net.JoinHostPort(host, port); !slices.Contains(out, ep) {
				out = append(out, ep)
			}
		}
	}
	return out
}

// gotView applies a view read from the feed.
func (a *Agent) gotView(v feed.View) {
	a.api.fed.set(v.Node, v.APIServers)
	if a.etcd != nil {
		a.etcd.fed.set(v.Node, v.Etcd)
	}
	a.mu.Lock()
	disc := a.disc
	a.mu.Unlock()
	if disc != nil {
		disc.PublishedChanged() // the feed's API servers
		if v.Etcd != nil && a.members != nil {
			disc.Refresh() // its etcd members, through memberSource
		}
	}
	for _, u := range a.upstreams() {
		u.refeed()
	}
}

// fedAPIServers is discovery's Fed source: the API servers of the last
// view read, while its feed is fresh (a stale feed keeps its last answer,
// as every discovery source does).
type fedAPIServers struct{ a *Agent }

func (s fedAPIServers) Backends() ([]string, bool) {
	v, ok := s.a.follower.LastView()
	if !ok {
		return nil, false
	}
	out := make([]string, 0, len(v.APIServers))
	for _, b := range v.APIServers {
		out = append(out, b.Addr)
	}
	return out, true
}

// fedMembers is what the last view says the etcd voters serve; ok is false
// when no feed is fresh or its node does not observe etcd.
func (a *Agent) fedMembers() (etcdmember.Serving, bool) {
	if a.follower == nil {
		return etcdmember.Serving{}, false
	}
	fresh, v, _ := a.follower.State()
	if !fresh || len(v.Etcd) == 0 {
		return etcdmember.Serving{}, false
	}
	var s etcdmember.Serving
	for _, b := range v.Etcd {
		host, _, err := net.SplitHostPort(b.Addr)
		if err != nil || b.URL == "" {
			continue
		}
		s.URLs = append(s.URLs, b.URL)
		s.HostPorts = append(s.HostPorts, b.Addr)
		s.Hosts = append(s.Hosts, host)
	}
	for _, l := range [][]string{s.URLs, s.HostPorts, s.Hosts} {
		slices.Sort(l)
	}
	s.Hosts = slices.Compact(s.Hosts)
	return s, len(s.URLs) > 0
}
