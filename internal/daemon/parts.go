package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	"github.com/vigil-ha/vigil/internal/announce"
	"github.com/vigil-ha/vigil/internal/bgp"
	"github.com/vigil-ha/vigil/internal/dnat"
)

// The holder's parts, each seen through the interface the holder needs of
// it. None is optional: a part a configuration leaves out is a no-op value,
// so that the holder's order (holder.go) reads without a nil check, and a
// unit test can run that order with fakes of every part (holder_test.go).

// vipPart is the lock's VIP on this node's interface (vip.Keeper): added
// and kept with each lease, removed when the lease ends.
type vipPart interface {
	Hold(deadline time.Time)
	Release(reason string) error
	Eligible() error
}

// fencePart is the guard: a second process that removes the VIP when the
// last lease deadline it was told passes, whatever vigil does meanwhile.
type fencePart interface {
	// Arm tells a new tenure's first deadline, and waits up to wait for
	// the guard to take it; false if it did not.
	Arm(deadline time.Time, wait time.Duration) bool
	// Lease tells a later deadline; the zero time ends the tenure.
	Lease(deadline time.Time)
	// Eligible is why a holder cannot keep the VIP, EligibleToCampaign why
	// a candidate should not take it (a stricter bound on a silent guard).
	Eligible() error
	EligibleToCampaign() error
}

// servePart is the load balancers: they take connections on the VIP only
// while this node holds it.
type servePart interface{ SetServing(on bool) }

// redirectPart is the nftables rules that send the VIP's port to the load
// balancer's own port (--lb-listen-port).
type redirectPart interface {
	Install() error
	Remove() error
}

// announcer tells the network where the VIP is: gratuitous ARP and
// unsolicited NA (arpAnnouncer), or a BGP route (bgpAnnouncer).
type announcer interface {
	Eligible() error
	// Announce starts a tenure's announcements; term is the election's
	// transition count, which orders BGP routes of successive holders.
	Announce(ctx context.Context, term int)
	// Withdraw ends them, bounded in time: the holder calls it before the
	// lock can go to another node.
	Withdraw()
}

// The no-op parts.
type (
	noVIP      struct{}
	noFence    struct{}
	noRedirect struct{}
	noAnnounce struct{}
)

func (noVIP) Hold(time.Time)       {}
func (noVIP) Release(string) error { return nil }
func (noVIP) Eligible() error      { return nil }

func (noFence) Arm(time.Time, time.Duration) bool { return true }
func (noFence) Lease(time.Time)                   {}
func (noFence) Eligible() error                   { return nil }
func (noFence) EligibleToCampaign() error         { return nil }

func (noRedirect) Install() error { return nil }
func (noRedirect) Remove() error  { return nil }

func (noAnnounce) Eligible() error               { return nil }
func (noAnnounce) Announce(context.Context, int) {}
func (noAnnounce) Withdraw()                     {}

// dnatRules is redirectPart over internal/dnat.
type dnatRules []dnat.Rule

func (r dnatRules) Install() error { return dnat.Install(r) }
func (r dnatRules) Remove() error  { return dnat.Remove() }
func (r dnatRules) String() string { return fmt.Sprint([]dnat.Rule(r)) }

// arpAnnouncer announces the VIP on its segment for as long as valid says
// the VIP is this node's, and asks the conflict probe to look at once.
type arpAnnouncer struct {
	ann       *announce.Announcer
	keeper    interface{ Valid() bool }
	conflicts interface{ Kick() }
	group     *announce.Group // the current tenure's; used by the holder's goroutine only
	log       *slog.Logger
}

// again announces once more, while the VIP is this node's: the keeper put
// it back after something removed it.
func (a *arpAnnouncer) again() {
	if !a.keeper.Valid() {
		return
	}
	if err := a.ann.Once(); err != nil {
		a.log.Warn("announcement failed", "err", err)
	}
}

func (a *arpAnnouncer) Eligible() error { return nil }

func (a *arpAnnouncer) Announce(ctx context.Context, _ int) {
	a.group = announce.Start(ctx, a.ann, a.keeper.Valid)
	a.conflicts.Kick()
}

func (a *arpAnnouncer) Withdraw() {
	a.group.Stop()
	a.group = nil
}

// bgpAnnouncer advertises the VIP's host routes through the speaker's
// sessions.
type bgpAnnouncer struct {
	speaker *bgp.Speaker
	addrs   []netip.Addr
	log     *slog.Logger
}

func (b *bgpAnnouncer) Eligible() error { return b.speaker.Eligible(context.Background()) }

func (b *bgpAnnouncer) Announce(ctx context.Context, term int) {
	actx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if err := b.speaker.Advertise(actx, b.addrs, bgp.MED(term)); err != nil {
		b.log.Error("cannot advertise the VIP over BGP", "err", err)
	}
}

// Withdraw is bounded: a speaker that does not answer must not hold up the
// step-down. The withdrawal is queued on every session when it returns.
func (b *bgpAnnouncer) Withdraw() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := b.speaker.Withdraw(ctx); err != nil {
		b.log.Error("cannot withdraw the VIP's route; routers drop it when the session ends", "err", err)
	}
}
