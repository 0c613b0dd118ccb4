package etcdcluster

import (
	"context"
	"errors"
	"sync/atomic"
	"time"
)

// MinHedge is the least a Path waits for its member before asking the
// others as well: on a store that is slow everywhere, asking the others
// too would only add load.
const MinHedge = 50 * time.Millisecond

// A Path sends a kind of operation that recurs (a renewal, a stand-by's
// read of the lock, a report) through the member that answered it last,
// alone, and through the others as well only when that member fails or is
// late ("late": twice its last round trip, and at least MinHedge). A
// healthy cluster then sees one request per operation, not one per member:
// every linearizable read through a member costs a round of raft heartbeats
// on the leader, and every write through a member a raft proposal. A dead,
// partitioned or slow member costs one hedge delay, once: the next
// operation goes through the member that answered.
//
// The zero Path asks every member at once, as Do does. A Path is safe for
// concurrent use.
type Path struct {
	last atomic.Pointer[answer]
}

// answer is the member that answered last through a Path, and how fast.
type answer struct {
	endpoint string
	took     time.Duration
}

// Via runs op through p: see Path.
func Via[T any](ctx context.Context, c *Cluster, p *Path, op func(context.Context, *Member) (T, error)) (T, error) {
	return ViaUntil(ctx, c, p, op, nil)
}

// ViaUntil is Via where an error for which final returns true is an answer
// as good as a success (a compare-and-swap that lost), as in DoUntil; and
// as in DoUntil, when every member failed while the connections changed
// (the member list dropped the one in use), it tries once more over the
// connections as they are now.
func ViaUntil[T any](ctx context.Context, c *Cluster, p *Path, op func(context.Context, *Member) (T, error), final func(error) bool) (T, error) {
	members := c.Members()
	v, err := via(ctx, c, p, op, final)
	var none memberErrors
	if errors.As(err, &none) && ctx.Err() == nil && !sameMembers(members, c.Members()) {
		return via(ctx, c, p, op, final)
	}
	return v, err
}

// via is one try of ViaUntil.
func via[T any](ctx context.Context, c *Cluster, p *Path, op func(context.Context, *Member) (T, error), final func(error) bool) (T, error) {
	first, delay := p.next()
	start := time.Now()
	v, m, err := Hedged(ctx, c, first, delay, op, final)
	p.answered(m, time.Since(start), err == nil || (final != nil && final(err)))
	return v, err
}

// First is the member p asks first ("" when it asks every member at once).
func (p *Path) First() string {
	if a := p.last.Load(); a != nil {
		return a.endpoint
	}
	return ""
}

func (p *Path) next() (string, time.Duration) {
	if a := p.last.Load(); a != nil {
		return a.endpoint, max(MinHedge, 2*a.took)
	}
	return "", MinHedge
}

// answered remembers who answered (nobody: ask everyone next time).
func (p *Path) answered(m *Member, took time.Duration, ok bool) {
	if m == nil || !ok {
		p.last.Store(nil)
		return
	}
	p.last.Store(&answer{endpoint: m.Endpoint, took: took})
}
