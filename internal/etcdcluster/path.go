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
// late ("late": twice its smoothed round trip, and at least MinHedge). A
// healthy cluster then sees one request per operation, not one per member:
// every linearizable read through a member costs a round of raft heartbeats
// on the leader, and every write through a member a raft proposal. A dead,
// partitioned or slow member costs one hedge delay, once: the next
// operation goes through the member that answered.
//
// The round trip is the member's own (from when it was asked, so a hedge
// delay is not counted in it), smoothed as TCP smooths its round-trip
// time: each answer moves it an eighth of the way. One answer that was
// slow because a packet was lost and resent then barely moves the next
// hedge delay, and losses in a row do not double it each time; a store
// that is slow everywhere raises it within a few operations.
//
// The zero Path asks every member at once, as Do does. A Path is safe for
// concurrent use.
type Path struct {
	last atomic.Pointer[answer]
}

// answer is the member that answered last through a Path, and its
// smoothed round trip.
type answer struct {
	endpoint string
	rtt      time.Duration
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
	v, m, took, err := hedged(ctx, c, first, delay, op, final)
	p.answered(m, took, err == nil || (final != nil && final(err)))
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
		return a.endpoint, max(MinHedge, 2*a.rtt)
	}
	return "", MinHedge
}

// answered remembers who answered and how fast (nobody: ask everyone next
// time). A member new to the path starts from its one round trip.
func (p *Path) answered(m *Member, took time.Duration, ok bool) {
	if m == nil || !ok {
		p.last.Store(nil)
		return
	}
	rtt := took
	if a := p.last.Load(); a != nil && a.endpoint == m.Endpoint {
		rtt = a.rtt + (took-a.rtt)/8
	}
	p.last.Store(&answer{endpoint: m.Endpoint, rtt: rtt})
}
