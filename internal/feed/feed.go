// Package feed is how the control plane tells the worker agents what it
// sees, so that 5,000 agents need not each probe every API server and every
// etcd member (docs/agent.md, "At fleet scale").
//
// Every vigil run serves the feed (--agent-feed-listen). A GET of Path
// answers with a stream of JSON lines:
//
//   - the first line carries the node's current View: the API servers and
//     the etcd members it balances, each with its health as its own checks
//     see it;
//   - a line with a new View follows each change, at once;
//   - otherwise a heartbeat line ({"seq":N}) every Heartbeat, so that a
//     follower can tell a quiet feed from a dead one.
//
// A follower (the agent) reads one node's feed at a time. A feed that says
// nothing for Stale is stale: the follower tries the next node, and until a
// feed is fresh again the agent checks its backends itself, as it did before
// the feed existed. So the feed saves load, and losing it costs nothing but
// the load it saved.
package feed

import (
	"encoding/json"
	"slices"
	"time"

	"github.com/vigil-ha/vigil/internal/health"
)

// Path is the feed's HTTP path.
const Path = "/v1/agent-feed"

// DefaultPort is the feed's port: vigil run's --agent-feed-listen in the
// manifests, and the agent's --feed-port.
const DefaultPort = 9557

// Default timing. A follower hears from a live feed at least every
// Heartbeat; after Stale of silence it gives up on it. Stale is three
// heartbeats, so that one late or lost heartbeat (a busy node) is not taken
// for a dead feed.
const (
	DefaultHeartbeat = time.Second
	DefaultStale     = 3 * time.Second
)

// Backend is one API server or etcd member, as the publishing node sees it.
type Backend struct {
	// Addr is host:port, where traffic goes.
	Addr string `json:"addr"`
	// URL is an etcd member's client URL; empty for API servers.
	URL string `json:"url,omitempty"`
	// Up: the node's checks pass.
	Up bool `json:"up"`
	// Cause says why a backend is down: dead (refused), unreachable
	// (silent) or draining (answering, not ready).
	Cause string `json:"cause,omitempty"`
}

// View is what one node publishes.
type View struct {
	// Node is the publishing node's name.
	Node string `json:"node"`
	// APIServers are the API servers the node balances, sorted by Addr.
	APIServers []Backend `json:"apiservers"`
	// Etcd are the voting etcd members, sorted by Addr; nil when the node
	// does not observe etcd (the Lease election without etcd endpoints).
	Etcd []Backend `json:"etcd,omitempty"`
}

// Equal reports whether two views say the same.
func (v View) Equal(o View) bool {
	return v.Node == o.Node && slices.Equal(v.APIServers, o.APIServers) && slices.Equal(v.Etcd, o.Etcd) &&
		(v.Etcd == nil) == (o.Etcd == nil)
}

// APIServersOf is the API servers' part of a view, from a health
// checker's statuses (sorted by backend, as Checker.Statuses returns them).
// A backend not checked yet is not up: agents keep it out until the node
// has seen it pass.
func APIServersOf(sts []health.Status) []Backend {
	out := make([]Backend, 0, len(sts))
	for _, st := range sts {
		b := Backend{Addr: st.Backend, Up: st.State == health.Up}
		switch {
		case st.State == health.Down:
			b.Cause = st.Cause.String()
		case !b.Up:
			b.Cause = "unknown"
		}
		out = append(out, b)
	}
	return out
}

// HasUp reports whether bs has a backend that is up.
func HasUp(bs []Backend) bool {
	return slices.ContainsFunc(bs, func(b Backend) bool { return b.Up })
}

// line is one line of the stream: a View with its sequence number, or a
// heartbeat (Seq alone).
type line struct {
	Seq  uint64 `json:"seq"`
	View *View  `json:"view,omitempty"`
}

func encode(l line) []byte {
	b, err := json.Marshal(l)
	if err != nil {
		panic("feed: cannot encode a line: " + err.Error()) // plain structs of strings and bools
	}
	return append(b, '\n')
}
