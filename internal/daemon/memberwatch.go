package daemon

import (
	"context"
	"log/slog"

	"github.com/vigil-ha/vigil/internal/discovery"
	"github.com/vigil-ha/vigil/internal/kube"
	"github.com/vigil-ha/vigil/internal/membership"
)

// memberWatch is what this node does with each observation of the etcd
// members (membership.Observer runs the observation and, on the VIP holder,
// the pruning): the per-member metrics, deleting the Node of a pruned
// member, and taking a pruned member's API server out of discovery at once.
type memberWatch struct {
	m      *nodeMetrics
	nodes  *nodeReaper          // nil without --prune-delete-node
	disc   *discovery.Discovery // nil without any backend source
	events *kube.Events         // nil without --kubeconfig
	feed   *feedPart            // nil without --agent-feed-listen
	cfg    Config
	log    *slog.Logger
	// series are the members with a vigil_member_unreachable_seconds
	// series; used by observed only (the observer's goroutine).
	series map[string]bool
}

// observed runs after every observation of the members, with this
// node's view of them.
func (w *memberWatch) observed(ctx context.Context, v membership.View, own membership.Report) {
	seen := map[string]bool{}
	for _, s := range own.Members {
		seen[s.Name] = true
		w.m.memberDown.WithLabelValues(s.Name).Set(s.Down().Seconds())
	}
	for name := range w.series {
		if !seen[name] {
			w.m.memberDown.DeleteLabelValues(name) // removed from etcd
		}
	}
	w.series = seen
	w.feed.observed(v)
	if w.nodes != nil {
		w.nodes.observe(ctx, v, w.nodeDeleted)
	}
}

// pruned runs for every member this node pruned.
func (w *memberWatch) pruned(ctx context.Context, m membership.Member) {
	w.m.prunes.Inc()
	w.log.Info("pruned a dead etcd member", "member", m.Label())
	if w.disc != nil {
		w.disc.Refresh() // its API server leaves the load balancer now
	}
	if w.nodes != nil {
		w.nodes.pruned(ctx, m.Name, w.nodeDeleted)
	}
}

func (w *memberWatch) nodeDeleted(name string) {
	w.m.nodesDeleted.Inc()
	if w.events != nil {
		w.events.Emit(false, kube.ReasonNodeDeleted, "%s deleted Node %s: its etcd member was pruned and its kubelet had not renewed its Lease for %v", w.cfg.NodeName, name, w.cfg.PruneAfter)
	}
}
