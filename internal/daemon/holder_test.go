package daemon

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/vigil-ha/vigil/internal/election"
	"github.com/vigil-ha/vigil/internal/testkit"
)

// calls records what the holder asked of its parts, in order.
type calls struct{ testkit.Record[string] }

func (c *calls) add(s string)   { c.Add(s) }
func (c *calls) take() []string { return c.Take() }

type fakeVIP struct {
	c   *calls
	err error
}

func (f *fakeVIP) Hold(time.Time)       { f.c.add("vip.hold") }
func (f *fakeVIP) Release(string) error { f.c.add("vip.release"); return nil }
func (f *fakeVIP) Eligible() error      { return f.err }

type fakeFence struct {
	c           *calls
	err         error
	campaignErr error // EligibleToCampaign's own, beside err
}

func (f *fakeFence) Arm(time.Time, time.Duration) bool { f.c.add("fence.arm"); return true }
func (f *fakeFence) Eligible() error                   { return f.err }
func (f *fakeFence) EligibleToCampaign() error         { return cmp.Or(f.campaignErr, f.err) }
func (f *fakeFence) Lease(d time.Time) {
	if d.IsZero() {
		f.c.add("fence.end")
	} else {
		f.c.add("fence.lease")
	}
}

type fakeServe struct{ c *calls }

func (f fakeServe) SetServing(on bool) { f.c.add(fmt.Sprintf("serve.%v", on)) }

type fakeRedirect struct{ c *calls }

func (f fakeRedirect) Install() error { f.c.add("redirect.install"); return nil }
func (f fakeRedirect) Remove() error  { f.c.add("redirect.remove"); return nil }

type fakeAnnouncer struct {
	c   *calls
	err error
	ctx context.Context // the last tenure's
}

func (f *fakeAnnouncer) Eligible() error { return f.err }
func (f *fakeAnnouncer) Withdraw()       { f.c.add("withdraw") }
func (f *fakeAnnouncer) Announce(ctx context.Context, term int) {
	f.ctx = ctx
	f.c.add(fmt.Sprintf("announce(term %d)", term))
}

type fakeElector struct{ transitions int }

func (f fakeElector) Status() election.Status { return election.Status{Transitions: f.transitions} }

type fakeParts struct {
	calls    *calls
	vip      *fakeVIP
	fence    *fakeFence
	announce *fakeAnnouncer
}

func newFakeHolder() (*holder, *fakeParts) {
	c := &calls{}
	p := &fakeParts{calls: c, vip: &fakeVIP{c: c}, fence: &fakeFence{c: c}, announce: &fakeAnnouncer{c: c}}
	h := &holder{
		vip: p.vip, lockVIP: true, fence: p.fence, ann: p.announce,
		serve: fakeServe{c}, redirect: fakeRedirect{c},
		el: fakeElector{transitions: 7},
		m:  newNodeMetrics(), log: slog.New(slog.DiscardHandler),
	}
	return h, p
}

func wantCalls(t *testing.T, step string, got []string, want ...string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Errorf("%s: the holder asked\n  %q\nwant\n  %q", step, got, want)
	}
}

// A tenure's first lease: the balancer serves and the port is redirected
// before the VIP can draw a packet, and the guard knows the deadline
// before the VIP is added. Later leases only move the deadline, guard
// first. Announcements start once the VIP is up, with the election's
// transition count.
func TestHolderTakesOverInOrder(t *testing.T) {
	h, p := newFakeHolder()
	if h.leading() {
		t.Fatal("leading before any lease")
	}
	h.lease(time.Now().Add(time.Second))
	wantCalls(t, "first lease", p.calls.take(), "serve.true", "redirect.install", "fence.arm", "vip.hold")
	if !h.leading() {
		t.Error("not leading after the first lease")
	}
	h.start(context.Background())
	wantCalls(t, "start", p.calls.take(), "announce(term 7)")
	if held, since := h.holding(); !held || since.IsZero() {
		t.Errorf("holding() = %v, %v after start", held, since)
	}
	if v := testutil.ToFloat64(h.m.vipHeld); v != 1 {
		t.Errorf("vigil_vip_held = %v after start, want 1", v)
	}
	h.lease(time.Now().Add(2 * time.Second))
	wantCalls(t, "renewal", p.calls.take(), "fence.lease", "vip.hold")
}

// Giving up: when the lease ran out or was lost, another node may hold the
// VIP already, so it goes before anything else. Then, every time, the
// announcements end before the lock can be taken, the balancer stops
// serving while the VIP is still here (its resets reach the clients), the
// guard learns the tenure ended, the VIP goes, and the redirection after
// it. A second stop (Run's, after the elector's) does nothing the first
// did not, and nothing twice that is not idempotent.
func TestHolderGivesUpInOrder(t *testing.T) {
	for _, c := range []struct {
		name  string
		cause election.Cause
		first []string // what goes before the common order
	}{
		{"expired", election.CauseExpired, []string{"vip.release"}},
		{"lost", election.CauseLost, []string{"vip.release"}},
		{"shutdown", election.CauseShutdown, nil},
		{"yield", election.CauseYield, nil},
		{"ineligible", election.CauseIneligible, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			h, p := newFakeHolder()
			h.lease(time.Now().Add(time.Second))
			h.start(context.Background())
			p.calls.take()
			h.stop(election.StepDown{Cause: c.cause, Detail: "test"})
			wantCalls(t, "stop", p.calls.take(), append(c.first,
				"withdraw", "serve.false", "fence.end", "vip.release", "redirect.remove")...)
			if p.announce.ctx.Err() == nil {
				t.Error("the tenure's context is not cancelled after stop")
			}
			if h.leading() {
				t.Error("leading after stop")
			}
			if held, _ := h.holding(); held {
				t.Error("holding after stop")
			}
			if v := testutil.ToFloat64(h.m.vipHeld); v != 0 {
				t.Errorf("vigil_vip_held = %v after stop, want 0", v)
			}
			h.stop(election.StepDown{Cause: election.CauseShutdown, Detail: "shutting down"})
			wantCalls(t, "second stop", p.calls.take(), "fence.end", "vip.release")
		})
	}
}

// A lease that never became a tenure (the elector stepped down between its
// first lease and start) still leaves nothing behind.
func TestHolderStopsBeforeStart(t *testing.T) {
	h, p := newFakeHolder()
	h.lease(time.Now().Add(time.Second))
	p.calls.take()
	h.stop(election.StepDown{Cause: election.CauseExpired, Detail: "test"})
	wantCalls(t, "stop", p.calls.take(), "vip.release", "serve.false", "fence.end", "vip.release", "redirect.remove")
}

// Each part can keep this node from campaigning, the VIP's reasons first.
func TestHolderEligible(t *testing.T) {
	h, p := newFakeHolder()
	if err := h.eligible(); err != nil {
		t.Fatalf("eligible with every part willing: %v", err)
	}
	errVIP, errFence, errAnn := errors.New("interface down"), errors.New("no guard"), errors.New("no BGP session")
	p.announce.err = errAnn
	if err := h.eligible(); !errors.Is(err, errAnn) {
		t.Errorf("eligible = %v, want %v", err, errAnn)
	}
	p.fence.err = errFence
	if err := h.eligible(); !errors.Is(err, errFence) {
		t.Errorf("eligible = %v, want %v", err, errFence)
	}
	p.vip.err = errVIP
	if err := h.eligible(); !errors.Is(err, errVIP) {
		t.Errorf("eligible = %v, want %v", err, errVIP)
	}
}

// A guard a little slow to answer keeps a candidate out, not the holder:
// the candidate is asked EligibleToCampaign, the holder Eligible.
func TestHolderAsksTheGuardsCampaignBoundOnlyWhileACandidate(t *testing.T) {
	h, p := newFakeHolder()
	errSlow := errors.New("guard silent for 300ms")
	p.fence.campaignErr = errSlow
	if err := h.eligible(); !errors.Is(err, errSlow) {
		t.Fatalf("a candidate's eligible = %v, want %v", err, errSlow)
	}
	h.lease(time.Now().Add(time.Second))
	if err := h.eligible(); err != nil {
		t.Fatalf("the holder's eligible = %v, want nil: its guard is within the holder's bound", err)
	}
	h.stop(election.StepDown{Cause: election.CauseExpired, Detail: "test"})
	if err := h.eligible(); !errors.Is(err, errSlow) {
		t.Fatalf("eligible after stepping down = %v, want %v", err, errSlow)
	}
}

// With --bgp-mode ecmp the VIP is not the lock's: the holder's no-op parts
// do nothing, and it does not claim the VIP in its metrics.
func TestHolderWithoutTheVIP(t *testing.T) {
	h := &holder{
		vip: noVIP{}, fence: noFence{}, ann: noAnnounce{}, serve: balancers(nil), redirect: noRedirect{},
		el: fakeElector{}, m: newNodeMetrics(), log: slog.New(slog.DiscardHandler),
	}
	if err := h.eligible(); err != nil {
		t.Fatalf("eligible: %v", err)
	}
	h.lease(time.Now().Add(time.Second))
	h.start(context.Background())
	if v := testutil.ToFloat64(h.m.vipHeld); v != 0 {
		t.Errorf("vigil_vip_held = %v, want 0: the lock does not hold the VIP", v)
	}
	if v := testutil.ToFloat64(h.m.leader); v != 1 {
		t.Errorf("vigil_leader = %v, want 1", v)
	}
	h.stop(election.StepDown{Cause: election.CauseShutdown})
	if v := testutil.ToFloat64(h.m.leader); v != 0 {
		t.Errorf("vigil_leader = %v after stop, want 0", v)
	}
}
