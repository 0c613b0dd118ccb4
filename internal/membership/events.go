package membership

import "fmt"

// EventKind is what a membership operation just did or found. The values
// are stable words, for logs and scripts.
type EventKind string

const (
	// Removal.
	EventMovingLeader EventKind = "moving-leader"     // the member to remove leads raft; leadership moves first
	EventMoveRetry    EventKind = "move-leader-retry" // the move failed; it is tried again
	EventRemoving     EventKind = "removing"
	EventRemoved      EventKind = "removed"
	EventAlreadyGone  EventKind = "already-removed"
	EventUnhealthy    EventKind = "unhealthy-retry" // etcd refused a change as "unhealthy cluster"; retrying
	// Pruning.
	EventWouldRemove EventKind = "would-remove" // dry run
	EventWouldKeep   EventKind = "would-keep"   // dry run: the removal would be refused
	EventEvidence    EventKind = "evidence"     // why a member is being removed
	EventVetoed      EventKind = "vetoed"       // removable, but something else manages that machine (Cluster API)
	// Replacement, in its four steps.
	EventStep      EventKind = "step"
	EventStartEtcd EventKind = "start-etcd" // the command line the new member's etcd needs
	EventWaiting   EventKind = "waiting"    // for the learner to catch up
	EventPromoted  EventKind = "promoted"
	EventDone      EventKind = "done"
)

// Event is one step of a membership operation: what kind, which member
// (its label, or the new member's name; "" when none), and a sentence for
// people. Commands print Text; the daemon logs it with Kind and Member as
// fields.
type Event struct {
	Kind   EventKind
	Member string
	Text   string
}

func (e Event) String() string { return e.Text }

// Reporter receives the events of an operation, in order, on the caller's
// goroutine. nil discards them.
type Reporter func(Event)

func (r Reporter) say(kind EventKind, member, format string, a ...any) {
	if r != nil {
		r(Event{Kind: kind, Member: member, Text: fmt.Sprintf(format, a...)})
	}
}
