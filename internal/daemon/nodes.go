package daemon

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/vigil-ha/vigil/internal/kube"
	"github.com/vigil-ha/vigil/internal/membership"
)

// nodeReaper deletes the Node of a pruned member (--prune-delete-node)
// once its kubelet has not renewed its node Lease for --prune-after. A
// partitioned node is NotReady too, and deleting its Node would make the
// pod garbage collector delete its pods; a stopped kubelet is what this
// looks for.
//
// Proof of "not renewed" never compares two nodes' clocks: while a member
// is unreachable, its node's Lease is read every few seconds, and a renewal
// time that has stayed the same for the whole period, on this process's
// monotonic clock, proves the kubelet did not renew. Only the observer's
// goroutine calls it.
type nodeReaper struct {
	kube  kubernetes.Interface
	after time.Duration
	log   *slog.Logger

	leases  map[string]*leaseSeen // by node name: members unreachable now, and pending Nodes
	pending map[string]time.Time  // pruned members whose Node waits, with when they were pruned
}

// leaseSeen is one node Lease as this process has been reading it.
type leaseSeen struct {
	found bool
	renew time.Time // the kubelet's renewTime, by its clock
	since time.Time // when this value (found, renew) was first read, monotonic
	read  time.Time // the last read
}

// leaseReadInterval spaces the reads of one node Lease: kubelets renew
// every 10 s by default, and --prune-after is at least 10 s.
const leaseReadInterval = 2 * time.Second

func newNodeReaper(cs kubernetes.Interface, after time.Duration, log *slog.Logger) *nodeReaper {
	return &nodeReaper{kube: cs, after: after, log: log, leases: map[string]*leaseSeen{}, pending: map[string]time.Time{}}
}

// observe follows the Leases of the nodes whose members are unreachable in
// v, and deletes the pending Nodes that qualify.
func (r *nodeReaper) observe(ctx context.Context, v membership.View, deleted func(string)) {
	watch := map[string]bool{}
	for _, m := range v.Members {
		if !m.Reachable && m.Name != "" {
			watch[m.Name] = true
		}
	}
	for name := range r.pending {
		watch[name] = true
	}
	for name := range r.leases {
		if !watch[name] {
			delete(r.leases, name) // reachable again: start over next time
		}
	}
	for name := range watch {
		r.read(ctx, name)
	}
	for name := range r.pending {
		r.try(ctx, name, deleted)
	}
}

func (r *nodeReaper) read(ctx context.Context, name string) {
	e := r.leases[name]
	now := time.Now()
	if e != nil && now.Sub(e.read) < leaseReadInterval {
		return
	}
	renew, found, err := kube.NodeLeaseRenewal(ctx, r.kube, name)
	if err != nil {
		r.log.Debug("cannot read a node Lease", "node", name, "err", err)
		return
	}
	if e == nil || e.found != found || !e.renew.Equal(renew) {
		e = &leaseSeen{found: found, renew: renew, since: now}
		r.leases[name] = e
	}
	e.read = now
}

// pruned queues the Node of a pruned member.
func (r *nodeReaper) pruned(ctx context.Context, name string, deleted func(string)) {
	if name == "" {
		return
	}
	r.pending[name] = time.Now()
	r.read(ctx, name)
	r.try(ctx, name, deleted)
}

func (r *nodeReaper) try(ctx context.Context, name string, deleted func(string)) {
	e := r.leases[name]
	prunedAt := r.pending[name]
	switch {
	case e == nil:
		return // not read yet (the API is out of reach): next round
	case e.found && e.since.After(prunedAt):
		r.log.Warn("the Node of a pruned member stays: its kubelet renewed its Lease after the prune", "node", name)
		delete(r.pending, name)
		return
	case time.Since(e.since) < r.after:
		return // not yet unchanged for the whole period
	}
	got, err := kube.DeleteDeadNode(ctx, r.kube, name)
	switch {
	case errors.Is(err, kube.ErrNodeReady):
		r.log.Warn("the Node of a pruned member stays: it reports Ready", "node", name)
	case err != nil:
		r.log.Warn("cannot delete the Node of a pruned member; trying again", "node", name, "err", err)
		return
	case got == kube.NodeAbsent:
		r.log.Info("a pruned member has no Node of its name", "node", name)
	default:
		r.log.Info("deleted the Node of a pruned member: its kubelet had not renewed its Lease for the whole period", "node", name, "period", r.after)
		deleted(name)
	}
	delete(r.pending, name)
}
