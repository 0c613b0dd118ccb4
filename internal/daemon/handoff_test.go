package daemon

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/vigil-ha/vigil/internal/election"
	"github.com/vigil-ha/vigil/internal/etcdcluster"
	"github.com/vigil-ha/vigil/internal/etcdtest"
	"github.com/vigil-ha/vigil/internal/handoff"
	"github.com/vigil-ha/vigil/internal/membership"
	"github.com/vigil-ha/vigil/internal/testkit"
)

// handoffNode is one candidate as vigil run wires it: an elector whose
// HandOff and eligibility come from handoffs.
type handoffNode struct {
	name    string
	leading atomic.Bool
	h       *handoffs
	el      *election.Elector
	stop    func() // stops its elector
}

// startHandoffNodes runs candidates on one etcd, each with its own
// connection, and returns them with a store for the test's requests.
func startHandoffNodes(t *testing.T, names ...string) ([]*handoffNode, *handoff.Store, *election.EtcdLock) {
	t.Helper()
	e := etcdtest.Start(t, 1)
	log := failureLog(t)
	var nodes []*handoffNode
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	for _, name := range names {
		cl, err := etcdcluster.New(etcdcluster.Config{Endpoints: e.Endpoints}, log)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cl.Close)
		n := &handoffNode{name: name}
		n.h = newHandoffs(handoff.NewStore(cl, ""), name, nil, n.leading.Load, log)
		lock := election.NewEtcdLockOn(cl, "", log)
		n.el, err = election.New(election.Config{
			Identity: name, Lock: lock, Eligible: n.h.eligible, HandOff: n.h.handOff,
			LeaseDuration: 800 * time.Millisecond, RenewDeadline: 500 * time.Millisecond, RetryPeriod: 100 * time.Millisecond,
			YieldFor: yieldFor(800 * time.Millisecond), ReleaseOnCancel: true,
			Callbacks: election.Callbacks{
				OnLease:          func(time.Time) { n.leading.Store(true) },
				OnStoppedLeading: func(election.StepDown) { n.leading.Store(false) },
			},
		}, log)
		if err != nil {
			t.Fatal(err)
		}
		ectx, stop := context.WithCancel(ctx)
		n.stop = stop
		wg.Go(func() { n.h.Run(ctx) })
		wg.Go(func() { _ = n.el.Run(ectx) })
		nodes = append(nodes, n)
	}
	cl, err := etcdcluster.New(etcdcluster.Config{Endpoints: e.Endpoints}, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return nodes, handoff.NewStore(cl, ""), election.NewEtcdLockOn(cl, "", log)
}

// failureLog is a logger whose lines (info and up, with their time) the
// test prints if it fails: what the nodes did is then on record.
func failureLog(t *testing.T) *slog.Logger {
	var mu sync.Mutex
	var buf bytes.Buffer
	t.Cleanup(func() {
		if t.Failed() {
			mu.Lock()
			defer mu.Unlock()
			t.Logf("the nodes' log:\n%s", buf.String())
		}
	})
	return slog.New(slog.NewTextHandler(lockedWriter{&mu, &buf}, nil))
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func holderOf(t *testing.T, lock *election.EtcdLock) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	o, err := lock.Get(ctx)
	if err != nil {
		return "?"
	}
	return o.Holder()
}

func waitHolder(t *testing.T, lock *election.EtcdLock, d time.Duration, ok func(string) bool, what string) string {
	t.Helper()
	var h string
	testkit.WaitNil(t, d, "the holder "+what, func() error {
		if h = holderOf(t, lock); !ok(h) {
			return fmt.Errorf("the holder is %q", h)
		}
		return nil
	})
	return h
}

// A request moves the lock off its holder to the named peer, not to the
// third; the old holder does not take it back while the request stands;
// a hold keeps a node out until released.
func TestHandoffMovesTheLock(t *testing.T) {
	nodes, store, lock := startHandoffNodes(t, "a", "b", "c")
	first := waitHolder(t, lock, 20*time.Second, func(h string) bool { return h != "" && h != "?" }, "a holder")
	to := map[string]string{"a": "c", "b": "a", "c": "b"}[first]
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := store.Begin(ctx, handoff.Request{ID: "t1", From: first, To: to, By: "test", At: time.Now()}, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := store.Begin(ctx, handoff.Request{ID: "t2", From: first, By: "test"}, 30*time.Second); err == nil {
		t.Fatal("a second request was accepted while the first stands")
	}
	start := time.Now()
	waitHolder(t, lock, 10*time.Second, func(h string) bool { return h == to }, to)
	t.Logf("%s -> %s in %v", first, to, time.Since(start).Round(time.Millisecond))
	// The status is written by the old holder's poll loop, which may
	// come round a moment after the new holder took the lock.
	testkit.WaitNil(t, 10*time.Second, "t1's status released", func() error {
		st, err := store.StatusOf(ctx, "t1")
		if err == nil && (st == nil || st.Phase != handoff.Released) {
			err = fmt.Errorf("status %+v", st)
		}
		return err
	})
	// Well past a lease: nobody takes it back.
	testkit.Always(t, 2*time.Second, to+" holding after the handoff settled", func() bool { return holderOf(t, lock) == to })
	if err := store.End(ctx, "t1"); err != nil {
		t.Fatal(err)
	}

	// Hold the holder: it steps down (ineligible) and a peer takes over;
	// it does not come back while held, and campaigns again once released.
	if err := store.PutHold(ctx, handoff.Hold{Node: to, By: "test", Until: time.Now().Add(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	next := waitHolder(t, lock, 10*time.Second, func(h string) bool { return h != to && h != "" && h != "?" }, "a node other than the held "+to)
	// Only the held node left: the lock goes free, and it stays out.
	for _, n := range nodes {
		if n.name != to {
			n.stop()
		}
	}
	waitHolder(t, lock, 10*time.Second, func(h string) bool { return h == "" }, "the lock released by the stopped nodes")
	testkit.Always(t, 2*time.Second, "the lock free while every node is held out", func() bool { return holderOf(t, lock) == "" })
	if had, err := store.Release(ctx, to); err != nil || !had {
		t.Fatalf("Release = %v, %v", had, err)
	}
	waitHolder(t, lock, 10*time.Second, func(h string) bool { return h == to }, to+" campaigning again once released")
	t.Logf("held %s: the VIP went to %s, and back once released", to, next)
}

type fakeBusy struct{ busy, total, closed int }

func (f *fakeBusy) Busy(time.Duration) (int, int) { return f.busy, f.total }
func (f *fakeBusy) CloseAll(string)               { f.closed++ }

// The holder named in a request waits for a quiet moment, reporting
// "draining", and gives up waiting after handoffDrainMax; a candidate
// named as From stands by at once; others stand by only for a named To.
func TestHandOffDrains(t *testing.T) {
	leading := true
	fb := &fakeBusy{busy: 2, total: 5}
	h := &handoffs{self: "a", bal: fb, leading: func() bool { return leading }, log: slog.New(slog.DiscardHandler), reported: map[string]handoff.Phase{}}
	h.set(handoff.State{Request: &handoff.Request{ID: "r1", From: "a", To: "b"}})
	if _, y := h.handOff(); y {
		t.Fatal("yielded with 2 connections busy")
	}
	if h.status == nil || h.status.Phase != handoff.Draining || h.status.Busy != 2 {
		t.Fatalf("status %+v, want draining with 2 busy", h.status)
	}
	h.status = nil
	fb.busy = 0
	if why, y := h.handOff(); !y || why == "" {
		t.Fatal("did not yield once quiet")
	}
	if h.status == nil || h.status.Phase != handoff.Released || h.status.ForcedAfter != 0 {
		t.Fatalf("status %+v, want released", h.status)
	}
	if fb.closed != 1 {
		t.Fatalf("connections closed %d times at the release, want once", fb.closed)
	}
	// A new request, never quiet: released after handoffDrainMax.
	h.set(handoff.State{Request: &handoff.Request{ID: "r2", From: "a"}})
	fb.busy = 1
	if _, y := h.handOff(); y {
		t.Fatal("yielded at once while busy")
	}
	h.since = time.Now().Add(-handoffDrainMax)
	if _, y := h.handOff(); !y || h.status.ForcedAfter < handoffDrainMax {
		t.Fatalf("not forced after the drain wait: %+v", h.status)
	}
	// As a candidate, From stands by at once, whatever is busy.
	leading = false
	if _, y := h.handOff(); !y {
		t.Fatal("From as a candidate does not stand by")
	}
	// Leading again under the same request (nobody else took the lock):
	// it keeps it, or the VIP would flap until the request expires.
	leading = true
	fb.busy = 0
	if _, y := h.handOff(); y {
		t.Fatal("From gave the lock up twice for one request")
	}
	// A leader that is not From keeps the lock, even when it is not --to.
	p := &handoffs{self: "c", leading: func() bool { return true }, log: slog.New(slog.DiscardHandler), reported: map[string]handoff.Phase{}}
	p.set(handoff.State{Request: &handoff.Request{ID: "r5", From: "a", To: "b"}})
	if _, y := p.handOff(); y {
		t.Fatal("a leader other than From gave the lock up")
	}
	// Others: only a named To makes them stand by.
	o := &handoffs{self: "c", leading: func() bool { return false }, log: slog.New(slog.DiscardHandler), reported: map[string]handoff.Phase{}}
	o.set(handoff.State{Request: &handoff.Request{ID: "r3", From: "a"}})
	if _, y := o.handOff(); y {
		t.Fatal("a peer stands by for a request without --to")
	}
	o.set(handoff.State{Request: &handoff.Request{ID: "r4", From: "a", To: "b"}})
	if _, y := o.handOff(); !y {
		t.Fatal("a peer other than --to does not stand by")
	}
	o.set(handoff.State{Holds: map[string]handoff.Hold{"c": {Node: "c", Until: time.Now().Add(time.Minute)}}})
	if o.eligible() == nil {
		t.Fatal("a held node is eligible")
	}
}

// A held holder gives the VIP up only while a live, unheld peer may take
// it, unless the hold was forced; a held candidate never campaigns.
func TestHeldHolderKeepsTheVIPWithoutAPeer(t *testing.T) {
	leading := true
	h := newHandoffs(nil, "a", nil, func() bool { return leading }, slog.New(slog.DiscardHandler))
	until := time.Now().Add(time.Minute)
	held := func(force bool) handoff.State {
		return handoff.State{Holds: map[string]handoff.Hold{"a": {Node: "a", Until: until, Force: force}, "c": {Node: "c", Until: until}}}
	}
	h.set(held(false))
	for _, tc := range []struct {
		name     string
		live     []string
		force    bool
		leading  bool
		eligible bool
	}{
		{"no live view yet: the hold counts", nil, false, true, false},
		{"only itself and a held peer: keeps the VIP", []string{"a", "c"}, false, true, true},
		{"a free peer: gives it up", []string{"a", "b", "c"}, false, true, false},
		{"forced: gives it up", []string{"a"}, true, true, false},
		{"a held candidate does not campaign", []string{"a"}, false, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h.set(held(tc.force))
			leading = tc.leading
			if tc.live == nil {
				h.mu.Lock()
				h.live, h.liveAt = nil, time.Time{}
				h.mu.Unlock()
			} else {
				h.setLive(tc.live)
			}
			if err := h.eligible(); (err == nil) != tc.eligible {
				t.Fatalf("eligible = %v, want eligible %v", err, tc.eligible)
			}
		})
	}
	// A view of the peers older than a report's staleness is no view.
	h.set(held(false))
	leading = true
	h.setLive([]string{"a"})
	h.mu.Lock()
	h.liveAt = time.Now().Add(-time.Minute)
	h.mu.Unlock()
	if h.eligible() == nil {
		t.Fatal("a stale view of the peers kept a held holder")
	}
}

// In virtual time each of the handoff's clocks is exact: a fresh node is
// out of the election until it has read the records or holdReadWait has
// passed; a busy holder is forced to let go at handoffDrainMax, not
// before; a hold ends at its Until; a held holder's view of live peers
// counts for membership.ReportStale.
func TestHandoffClocksAreExact(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		leading := false
		fb := &fakeBusy{busy: 1, total: 3}
		h := newHandoffs(nil, "a", nil, func() bool { return leading }, slog.New(slog.DiscardHandler))
		h.bal = fb
		testkit.HappensAt(t, holdReadWait, "eligibility with the records unread", func() bool { return h.eligible() == nil })

		// A busy holder drains for handoffDrainMax exactly.
		leading = true
		h.set(handoff.State{Request: &handoff.Request{ID: "r1", From: "a", To: "b"}})
		if _, y := h.handOff(); y {
			t.Fatal("yielded at once while busy")
		}
		testkit.HappensAt(t, handoffDrainMax, "yield of a busy holder", func() bool { _, y := h.handOff(); return y })
		if h.status.Phase != handoff.Released || h.status.ForcedAfter != handoffDrainMax {
			t.Fatalf("at handoffDrainMax: status %+v; want released, forced after exactly %v", h.status, handoffDrainMax)
		}
		if fb.closed != 1 {
			t.Fatalf("connections closed %d times, want once", fb.closed)
		}

		// A hold ends at its Until. A held candidate never campaigns.
		leading = false
		until := time.Now().Add(time.Minute)
		h.set(handoff.State{Holds: map[string]handoff.Hold{"a": {Node: "a", Until: until}}})
		testkit.HappensAt(t, time.Until(until), "end of the hold", func() bool { return h.eligible() == nil })

		// Held while leading with no live unheld peer: it keeps the
		// VIP while its view is fresh, and gives it up once the view is
		// older than a report's staleness.
		leading = true
		h.set(handoff.State{Holds: map[string]handoff.Hold{"a": {Node: "a", Until: time.Now().Add(time.Hour)}}})
		h.setLive([]string{"a"})
		// Stale once older than ReportStale: at ReportStale + 1 ns.
		testkit.HappensAt(t, membership.ReportStale+time.Nanosecond, "giving the VIP up on a stale view of the peers", func() bool { return h.eligible() != nil })
	})
}
