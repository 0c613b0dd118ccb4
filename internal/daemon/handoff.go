package daemon

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/vigil-ha/vigil/internal/handoff"
	"github.com/vigil-ha/vigil/internal/membership"
)

// handoffs follows vigil handoff's records for this node and answers the
// elector from what it last read: HandOff (a request makes this node step
// down or stand by) and eligibility (a hold keeps it out).
//
// The holder named in a request waits, before it steps down, for a moment
// when no connection through its load balancer is in an exchange
// (lb.Balancer.Busy): connections idle at the move are closed cleanly and
// their clients reconnect to the new holder, while one with a request in
// flight would lose it. It waits handoffDrainMax at most, then steps down
// anyway: a planned move must not hang on a client that never pauses.
type handoffs struct {
	store   *handoff.Store
	self    string
	bal     busyCounter // nil without --lb-port
	leading func() bool // whether this node holds the lock now
	log     *slog.Logger

	mu       sync.Mutex
	st       handoff.State
	read     bool                     // st was read at least once
	draining string                   // the request this holder drains for
	released string                   // the request this holder gave the lock up for
	since    time.Time                // since when
	status   *handoff.Status          // to report, nil when reported
	reported map[string]handoff.Phase // request ID -> last phase reported
	started  time.Time
	// live are the vigils whose member reports are fresh, as of liveAt
	// (membership.ObserverConfig.OnLive); zero liveAt: not known.
	live   []string
	liveAt time.Time
	// kept is set while this holder keeps the VIP although held, because
	// no peer may take it; ignored are the malformed records logged.
	kept    bool
	ignored map[string]bool
}

const (
	// handoffPoll is how often the records are read: a handoff starts
	// within this of the command's request.
	handoffPoll = 250 * time.Millisecond
	// handoffQuiet: a connection that moved a byte this recently is in an
	// exchange.
	handoffQuiet = 2 * time.Millisecond
	// handoffDrainMax bounds the wait for a quiet moment.
	handoffDrainMax = 3 * time.Second
	// holdReadWait bounds how long a starting node waits to read its hold.
	holdReadWait = 2 * time.Second
	// statusTTL keeps a status record as long as a handoff can take.
	statusTTL = 10 * time.Minute
)

// busyCounter is what handoffs needs of the load balancer.
type busyCounter interface {
	Busy(quiet time.Duration) (busy, total int)
	CloseAll(reason string)
}

func newHandoffs(store *handoff.Store, self string, bal balancers, leading func() bool, log *slog.Logger) *handoffs {
	var bc busyCounter
	if bal != nil {
		bc = bal // a nil slice in the interface would not be nil
	}
	return &handoffs{store: store, self: self, bal: bc, leading: leading, log: log.With("part", "handoff"), reported: map[string]handoff.Phase{}, started: time.Now(), ignored: map[string]bool{}}
}

// setLive records the vigils known to run now.
func (h *handoffs) setLive(live []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.live, h.liveAt = live, time.Now()
}

// Run reads the records every handoffPoll, and writes this holder's status
// for the command, until ctx ends.
func (h *handoffs) Run(ctx context.Context) {
	t := time.NewTicker(handoffPoll)
	defer t.Stop()
	failing := false
	for {
		rctx, cancel := context.WithTimeout(ctx, handoffPoll*4)
		st, err := h.store.Read(rctx)
		cancel()
		switch {
		case err != nil && ctx.Err() == nil:
			if !failing {
				h.log.Debug("cannot read the handoff records; keeping the last", "err", err)
				failing = true
			}
		case err == nil:
			failing = false
			h.set(st)
		}
		h.report(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (h *handoffs) set(st handoff.State) {
	h.mu.Lock()
	defer h.mu.Unlock()
	was := h.st
	h.st, h.read = st, true
	for key, why := range st.Ignored {
		if !h.ignored[key] {
			h.ignored[key] = true
			h.log.Warn("ignoring a malformed vigil handoff record", "key", key, "why", why)
		}
	}
	for key := range h.ignored {
		if _, still := st.Ignored[key]; !still {
			delete(h.ignored, key) // logged again if it comes back
		}
	}
	if st.Request != nil && (was.Request == nil || was.Request.ID != st.Request.ID) {
		h.log.Info("handoff requested", "id", st.Request.ID, "from", st.Request.From, "to", st.Request.To, "by", st.Request.By)
	}
	if _, held := st.Holds[h.self]; held {
		if _, was := was.Holds[h.self]; !was {
			h.log.Info("held out of the election by vigil handoff --hold", "until", st.Holds[h.self].Until)
		}
	} else if _, was := was.Holds[h.self]; was {
		h.log.Info("hold released: campaigning again")
	}
}

// report writes the pending status, if any.
func (h *handoffs) report(ctx context.Context) {
	h.mu.Lock()
	st := h.status
	h.status = nil
	h.mu.Unlock()
	if st == nil {
		return
	}
	wctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if err := h.store.Report(wctx, *st, statusTTL); err != nil {
		h.log.Debug("cannot report the handoff's status", "id", st.ID, "err", err)
	}
}

// note queues a status for the command, once per request and phase.
func (h *handoffs) note(st handoff.Status) {
	if h.reported[st.ID] == st.Phase {
		return
	}
	h.reported[st.ID] = st.Phase
	h.status = &st
}

// handOff is election.Config.HandOff.
func (h *handoffs) handOff() (string, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	reason, yield := h.st.Yield(h.self)
	if !yield {
		h.draining = ""
		return "", false
	}
	r := h.st.Request
	if !h.leading() {
		return reason, true // a candidate stands by (for YieldFor at most)
	}
	// A leader gives the lock up only if it is From, and once per request:
	// a node that took the lock anyway (nobody else did within YieldFor)
	// keeps it, or the VIP would flap until the request expires.
	if r.From != h.self || h.released == r.ID {
		return "", false
	}
	now := time.Now()
	if h.draining != r.ID {
		h.draining, h.since = r.ID, now
	}
	busy, total := 0, 0
	if h.bal != nil {
		busy, total = h.bal.Busy(handoffQuiet)
	}
	st := handoff.Status{ID: r.ID, At: now, Busy: busy, Total: total}
	waited := now.Sub(h.since)
	switch {
	case busy == 0:
		st.Phase = handoff.Released
	case waited >= handoffDrainMax:
		st.Phase, st.ForcedAfter = handoff.Released, waited
		h.log.Warn("handing off without a quiet moment", "id", r.ID, "busy", busy, "connections", total, "waited", waited.Round(time.Millisecond))
	default:
		st.Phase = handoff.Draining
		h.note(st)
		return "", false
	}
	h.note(st)
	h.released = r.ID
	if h.bal != nil {
		// Now, at the quiet moment, before the VIP goes: each client
		// learns of the close within a round trip and sends its next
		// request on a new connection, to the new holder. Closed any
		// later, a request sent meanwhile would be cut.
		h.bal.CloseAll("handoff")
	}
	h.log.Info("handing the VIP off", "id", r.ID, "to", r.To, "connections", total, "waited", waited.Round(time.Millisecond))
	return reason, true
}

// eligible is an error while a hold keeps this node out, and at start
// until the records are read (a node held for a reboot must not take the
// VIP in the moment before it learns of its hold), for holdReadWait at
// most: etcd may be down, and a Lease election goes on without it.
func (h *handoffs) eligible() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.read && time.Since(h.started) < holdReadWait {
		return errors.New("reading vigil handoff's holds")
	}
	now := time.Now()
	err := h.st.Eligible(h.self, now)
	if err == nil || h.st.Holds[h.self].Force || !h.leading() ||
		h.liveAt.IsZero() || now.Sub(h.liveAt) > membership.ReportStale ||
		len(h.st.Standbys(h.live, h.self, h.self, now)) > 0 {
		if h.kept && err != nil {
			h.log.Info("held: a peer may take the VIP now; giving it up")
		}
		h.kept = false
		return err
	}
	// Held, leading, and no live unheld peer: giving the VIP up would
	// leave nobody holding it. Keep it until a peer can take it.
	if !h.kept {
		h.kept = true
		h.log.Warn("held out of the election by vigil handoff --hold, but no peer may take the VIP (none runs, or all are held); keeping it until one can (vigil handoff --hold --force gives it up anyway)", "live", h.live)
	}
	return nil
}
