package vip

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// Keeper makes the address follow the node's role, continuously:
//
//   - present while the holder's lease is valid (Hold), refreshed every
//     RefreshInterval so its kernel lifetime never runs out on a live holder;
//   - absent the moment the lease deadline passes, fired by its own timer,
//     whatever the elector's goroutine is doing (blocked on a log write,
//     starved, or the whole process resumed after SIGSTOP);
//   - absent on a non-holder: an address that appears there (re-applied
//     network config, an operator's "ip addr add"), on any interface and
//     with any prefix length, is removed at once and reported as a stray;
//   - on the holder, in the managed form only: the VIP on another
//     interface or with another prefix length is removed as a stray;
//   - re-added at once on the holder when something removes it.
//
// It reacts to netlink address and link events, with a ticker as a backstop
// for lost events. Every add and remove happens under one mutex, so the
// reconciler, the timer and the elector's callbacks never interleave.
type Keeper struct {
	m   *Manager
	log *slog.Logger
	cfg KeeperConfig

	mu sync.Mutex // guards the fields below and serializes every add and remove
	// until is the lease deadline (monotonic); zero when not holding.
	until time.Time
	timer *time.Timer // fires at until
	// link is why the interface cannot carry the VIP now (nil: it can).
	link error
	// addFails counts consecutive failed adds, since firstFail; lastFail
	// is the latest.
	addFails  int
	firstFail time.Time
	lastFail  time.Time
	addErr    error
	// present is the last observed state, for telling re-adds apart.
	present bool
	// lastStray is set by reconcileLocked when it removed a stray VIP.
	lastStray bool
	closed    bool
	// notes are the log lines written under mu, to be written once it is
	// released (unlock).
	notes []logLine
}

// logLine is a log record the keeper writes after letting go of its lock.
// A log write can block (a full pipe on stderr, a stalled journald): with
// the lock held it kept the removal at the lease deadline waiting for as
// long, and a holder that had logged "VIP added" at that moment kept the
// VIP with etcd gone (TestBlockedHolderFencedByItsOwnDeadline, once in a
// package run).
type logLine struct {
	level slog.Level
	msg   string
	args  []any
}

// noteLocked keeps a log line for unlock; mu is held.
func (k *Keeper) noteLocked(level slog.Level, msg string, args ...any) {
	k.notes = append(k.notes, logLine{level, msg, args})
}

// unlock releases mu, then writes the lines noted under it.
func (k *Keeper) unlock() {
	notes := k.notes
	k.notes = nil
	k.mu.Unlock()
	for _, n := range notes {
		k.log.Log(context.Background(), n.level, n.msg, n.args...)
	}
}

// KeeperConfig are the Keeper's hooks. Each runs outside the Keeper's lock,
// on the goroutine that noticed the event; none may block for long.
type KeeperConfig struct {
	// OnStray runs after a VIP found on this node while it does not hold
	// the lock was removed.
	OnStray func()
	// OnRestored runs after the VIP, missing on the holder, was re-added
	// (the caller re-announces it).
	OnRestored func()
	// Changes, when set, says that links or addresses changed
	// (netmon.Monitor.Changes): the keeper looks again at once. When nil
	// the keeper subscribes to netlink events itself.
	Changes <-chan struct{}
}

// RefreshInterval is how often the holder re-adds the VIP, which resets its
// kernel lifetime. A quarter of the shortest lifetime (1 s): three refreshes
// in a row may be late before the kernel drops the address of a live holder.
const RefreshInterval = 250 * time.Millisecond

// addFailMemory is how long failed adds keep a node from campaigning. Long
// enough for a peer to take the lock; short enough that a transient netlink
// error does not bar the node for good.
const addFailMemory = 10 * time.Second

// NewKeeper returns a Keeper for m; it does nothing until Run, Hold or
// Release.
func NewKeeper(m *Manager, cfg KeeperConfig, log *slog.Logger) *Keeper {
	return &Keeper{m: m, cfg: cfg, log: log.With("vip", m.cfg.String(), "interface", m.cfg.Interface)}
}

// Hold records that this node holds the lock until deadline (a monotonic
// time of this process) and puts the VIP on the interface if the deadline is
// still ahead. Called at the start of a tenure and after every renewal.
func (k *Keeper) Hold(deadline time.Time) {
	k.mu.Lock()
	if k.closed {
		k.mu.Unlock()
		return
	}
	k.until = deadline
	if k.timer == nil {
		k.timer = time.AfterFunc(time.Until(deadline), k.expire)
	} else {
		k.timer.Reset(time.Until(deadline))
	}
	restored := false
	if !k.present {
		restored = k.reconcileLocked(false)
	}
	stray := k.lastStray
	k.lastStray = false
	k.unlock()
	k.after(stray, restored)
}

// Release removes the VIP and forgets the lease: this node no longer holds
// the lock.
func (k *Keeper) Release(reason string) error {
	k.mu.Lock()
	defer k.unlock()
	k.until = time.Time{}
	if k.timer != nil {
		k.timer.Stop()
	}
	removed, err := k.m.remove()
	if err != nil {
		return fmt.Errorf("remove vip %s from %s: %w", k.m.cfg, k.m.cfg.Interface, err)
	}
	k.present = false
	if removed {
		k.noteLocked(slog.LevelInfo, "VIP removed", "reason", reason)
	}
	return nil
}

// Valid tells whether the lease is valid now. Everything that touches the
// VIP on the holder's behalf (announcements included) asks first.
func (k *Keeper) Valid() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.validLocked(time.Now())
}

func (k *Keeper) validLocked(now time.Time) bool { return !k.until.IsZero() && now.Before(k.until) }

// Eligible returns why this node cannot hold the VIP now: its interface is
// gone, down or without carrier, or adding the VIP has kept failing (twice
// or more, for at least a refresh interval) lately. nil when it can.
func (k *Keeper) Eligible() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.link != nil {
		return k.link
	}
	if k.addFails >= 2 && k.lastFail.Sub(k.firstFail) >= RefreshInterval && time.Since(k.lastFail) < addFailMemory {
		return fmt.Errorf("adding the VIP failed %d times: %w", k.addFails, k.addErr)
	}
	return nil
}

// Run follows address and link events on the VIP's interface and reconciles
// the address with the role until ctx is done. The caller runs it for the
// whole life of the process; the VIP is removed when it returns.
func (k *Keeper) Run(ctx context.Context) error {
	events := k.cfg.Changes
	if events == nil {
		ev, stop, err := subscribe(ctx)
		if err != nil {
			k.log.Warn("cannot follow netlink events; checking the VIP on a timer only", "err", err)
		} else {
			events = ev
			defer stop()
		}
	}
	t := time.NewTicker(RefreshInterval)
	defer t.Stop()
	k.check(false)
	for {
		select {
		case <-ctx.Done():
			k.mu.Lock()
			k.closed = true
			k.until = time.Time{}
			if k.timer != nil {
				k.timer.Stop()
			}
			k.mu.Unlock()
			return nil
		case <-events:
			k.check(false)
		case <-t.C:
			k.check(true)
		}
	}
}

// expire runs at the lease deadline.
func (k *Keeper) expire() { k.check(false) }

// check reconciles once; refresh also renews the lifetime of a held VIP.
func (k *Keeper) check(refresh bool) {
	k.mu.Lock()
	k.link = k.m.link.state()
	restored := k.reconcileLocked(refresh)
	stray := k.lastStray
	k.lastStray = false
	k.unlock()
	k.after(stray, restored)
}

func (k *Keeper) after(stray, restored bool) {
	if stray && k.cfg.OnStray != nil {
		k.cfg.OnStray()
	}
	if restored && k.cfg.OnRestored != nil {
		k.cfg.OnRestored()
	}
}

// reconcileLocked makes the address match the role and reports whether a
// missing VIP was put back on the holder. The removal of an address the
// holder may no longer have comes first; its log lines are written after
// the lock is released (noteLocked).
func (k *Keeper) reconcileLocked(refresh bool) (restored bool) {
	if !k.validLocked(time.Now()) {
		holding := !k.until.IsZero()
		removed, err := k.m.remove()
		switch {
		case err != nil:
			k.noteLocked(slog.LevelError, "cannot remove the VIP", "err", err)
		case removed && holding:
			k.present = false
			k.noteLocked(slog.LevelWarn, "VIP removed: the lease deadline passed before a renewal (fenced)")
		case removed:
			k.present = false
			k.lastStray = true
			k.noteLocked(slog.LevelWarn, "stray VIP removed: this node does not hold the lock, yet the address was on it (re-applied network config?)")
		default:
			k.present = false
		}
		return false
	}
	// Only the managed form may stay: another prefix length, or the VIP on
	// another interface, has no kernel lifetime of ours and would outlive
	// this tenure.
	if removed, err := k.m.removeStrays(); err != nil {
		k.noteLocked(slog.LevelError, "cannot remove a stray form of the VIP", "err", err)
	} else if removed {
		k.lastStray = true
		k.noteLocked(slog.LevelWarn, "stray VIP removed: the VIP was also on another interface or with another prefix length")
	}
	present, err := k.m.has()
	if err != nil {
		present = false
	}
	if present && !refresh {
		k.present = true
		return false
	}
	added, err := k.m.add()
	if err != nil {
		if k.addFails == 0 {
			k.firstFail = time.Now()
		}
		k.addFails++
		k.lastFail, k.addErr = time.Now(), err
		k.noteLocked(slog.LevelError, "cannot add the VIP", "err", err, "failures", k.addFails)
		return false
	}
	k.addFails = 0
	// The add may have been delayed past the deadline (the process was
	// stopped between the check above and the netlink call): undo it.
	if !k.validLocked(time.Now()) {
		_, _ = k.m.remove()
		k.present = false
		k.noteLocked(slog.LevelWarn, "VIP removed again: the lease deadline passed while adding it (fenced)")
		return false
	}
	wasPresent := k.present
	k.present = true
	switch {
	case added && wasPresent:
		k.noteLocked(slog.LevelWarn, "VIP was removed from the holder by someone else; re-added")
		return true
	case added:
		k.noteLocked(slog.LevelInfo, "VIP added")
	}
	return false
}
