package vip

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/vigil-ha/vigil/internal/testkit"
)

// memLink is an in-memory interface: it records the address and can be told
// to fail adds or to lose its carrier.
type memLink struct {
	mu      sync.Mutex
	present bool
	adds    int
	failAdd error
	down    error
	// onAdd runs inside add, after the address is there (to simulate a
	// process stopped right after the netlink call).
	onAdd func()
}

func (l *memLink) add(netip.Prefix, time.Duration) (bool, error) {
	l.mu.Lock()
	if l.failAdd != nil {
		defer l.mu.Unlock()
		return false, l.failAdd
	}
	added := !l.present
	l.present = true
	l.adds++
	hook := l.onAdd
	l.mu.Unlock()
	if hook != nil {
		hook()
	}
	return added, nil
}

func (l *memLink) remove(netip.Prefix) (bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	was := l.present
	l.present = false
	return was, nil
}

func (l *memLink) removeStrays(netip.Prefix) (bool, error) { return false, nil }

func (l *memLink) has(netip.Prefix) (bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.present, nil
}

func (l *memLink) state() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.down
}

func (l *memLink) set(f func(*memLink)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	f(l)
}

func (l *memLink) isPresent() bool { ok, _ := l.has(netip.Prefix{}); return ok }

func newTestKeeper(l *memLink, cfg KeeperConfig) *Keeper {
	m := &Manager{cfg: Config{Address: netip.MustParsePrefix("192.0.2.100/24"), Interface: "eth0"}, link: l, log: slog.New(slog.DiscardHandler)}
	return NewKeeper(m, cfg, slog.New(slog.DiscardHandler))
}

// The keeper's tests run in virtual time (testing/synctest): its deadline
// timer fires exactly when the clock reaches the deadline, and sleeping
// past a refresh interval takes no time.

func TestKeeperFencesAtTheDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := &memLink{}
		k := newTestKeeper(l, KeeperConfig{})
		k.Hold(time.Now().Add(100 * time.Millisecond))
		if !l.isPresent() || !k.Valid() {
			t.Fatal("Hold with a deadline ahead did not add the VIP")
		}
		// Nothing renews: the keeper's own timer removes it at the
		// deadline, with no Run, no ticker and no elector involved.
		testkit.HappensAt(t, 100*time.Millisecond, "removal of the VIP", func() bool { return !l.isPresent() || !k.Valid() })
		if l.isPresent() || k.Valid() {
			t.Fatalf("at its lease deadline: present %v, valid %v", l.isPresent(), k.Valid())
		}
		// A refresh past the deadline must not add it back.
		k.check(true)
		if l.isPresent() {
			t.Fatal("a refresh past the deadline re-added the VIP")
		}
	})
}

func TestKeeperFollowsTheRole(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var strays, restored atomic.Int32
		l := &memLink{}
		k := newTestKeeper(l, KeeperConfig{OnStray: func() { strays.Add(1) }, OnRestored: func() { restored.Add(1) }})

		// Not holding: an address that appears is a stray.
		l.set(func(l *memLink) { l.present = true })
		k.check(false)
		if l.isPresent() || strays.Load() != 1 {
			t.Fatalf("stray not removed (present %v, strays %d)", l.isPresent(), strays.Load())
		}

		// Holding: a missing address is put back and reported once.
		k.Hold(time.Now().Add(time.Hour))
		if restored.Load() != 0 {
			t.Fatal("the first add of a tenure counted as a restore")
		}
		l.set(func(l *memLink) { l.present = false })
		k.check(false)
		if !l.isPresent() || restored.Load() != 1 {
			t.Fatalf("missing VIP not restored (present %v, restored %d)", l.isPresent(), restored.Load())
		}

		// Released: gone, and not a stray.
		if err := k.Release("test"); err != nil {
			t.Fatal(err)
		}
		k.check(false)
		if l.isPresent() || strays.Load() != 1 {
			t.Fatalf("after Release: present %v, strays %d", l.isPresent(), strays.Load())
		}
	})
}

// Real time: the deadline timer's callback waits for the keeper's lock
// while the add holds it, which virtual time cannot step past.
func TestKeeperUndoesALateAdd(t *testing.T) {
	l := &memLink{}
	k := newTestKeeper(l, KeeperConfig{})
	// The add lands, but the process "was stopped" across the deadline.
	until := time.Now().Add(30 * time.Millisecond)
	l.set(func(l *memLink) { l.onAdd = func() { time.Sleep(time.Until(until) + 10*time.Millisecond) } })
	k.Hold(until)
	if l.isPresent() {
		t.Fatal("an add that finished past the deadline was kept")
	}
}

func TestKeeperEligibility(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := &memLink{}
		k := newTestKeeper(l, KeeperConfig{})
		k.check(false)
		if err := k.Eligible(); err != nil {
			t.Fatalf("healthy link: %v", err)
		}
		l.set(func(l *memLink) { l.down = ErrLinkDown })
		k.check(false)
		if err := k.Eligible(); !errors.Is(err, ErrLinkDown) {
			t.Fatalf("link down: Eligible = %v", err)
		}
		l.set(func(l *memLink) { l.down, l.failAdd = nil, errors.New("permission denied") })
		k.Hold(time.Now().Add(time.Hour)) // first failure
		k.check(false)                    // an event: retried at once, fails again
		if err := k.Eligible(); err != nil {
			t.Fatalf("failures a moment apart already make the node ineligible: %v", err)
		}
		time.Sleep(RefreshInterval)
		k.check(true) // still failing a refresh interval later
		if err := k.Eligible(); err == nil {
			t.Fatal("two failed adds in a row leave the node eligible")
		}
		l.set(func(l *memLink) { l.failAdd = nil })
		k.check(true)
		if err := k.Eligible(); err != nil || !l.isPresent() {
			t.Fatalf("after a successful add: Eligible %v, present %v", err, l.isPresent())
		}
	})
}

// With a change source (netmon), the keeper looks again the moment links
// or addresses change, not at its next refresh: a stray that appears is
// gone before any time passes.
func TestKeeperLooksAgainOnAChange(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var strays atomic.Int32
		changes := make(chan struct{}, 1)
		l := &memLink{}
		k := newTestKeeper(l, KeeperConfig{OnStray: func() { strays.Add(1) }, Changes: changes})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- k.Run(ctx) }()
		synctest.Wait() // Run's first look
		start := time.Now()
		l.set(func(l *memLink) { l.present = true })
		changes <- struct{}{}
		synctest.Wait()
		if l.isPresent() || strays.Load() != 1 || time.Since(start) != 0 {
			t.Fatalf("after a change: present %v, strays %d, %v later", l.isPresent(), strays.Load(), time.Since(start))
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	})
}

// blockingHandler is a log handler whose every write waits until release
// is closed, as a write to a full pipe on stderr does.
type blockingHandler struct{ release chan struct{} }

func (h blockingHandler) Enabled(context.Context, slog.Level) bool  { return true }
func (h blockingHandler) Handle(context.Context, slog.Record) error { <-h.release; return nil }
func (h blockingHandler) WithAttrs([]slog.Attr) slog.Handler        { return h }
func (h blockingHandler) WithGroup(string) slog.Handler             { return h }

// A log write that blocks never keeps the VIP past the lease deadline: the
// keeper writes its log lines after letting go of its lock, so the
// deadline's removal does not wait for the "VIP added" line of the Hold
// before it. (In real time: a goroutine waiting for a mutex is not
// "durably blocked" for synctest, so a keeper that logs under its lock
// would hang a bubble instead of failing this test.)
func TestKeeperFencesWhileItsLogBlocks(t *testing.T) {
	l := &memLink{}
	h := blockingHandler{release: make(chan struct{})}
	t.Cleanup(func() { close(h.release) })
	m := &Manager{cfg: Config{Address: netip.MustParsePrefix("192.0.2.100/24"), Interface: "eth0"}, link: l, log: slog.New(h)}
	k := NewKeeper(m, KeeperConfig{}, slog.New(h))
	go k.Hold(time.Now().Add(100 * time.Millisecond)) // blocks on its "VIP added"
	testkit.WaitFor(t, 5*time.Second, "the VIP added", l.isPresent)
	testkit.WaitFor(t, 5*time.Second, "the VIP removed at the deadline with the log blocked", func() bool { return !l.isPresent() })
}
