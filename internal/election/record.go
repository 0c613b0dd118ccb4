package election

import (
	"context"
	"errors"
	"time"
)

// Record is the lock record stored in the quorum store.
type Record struct {
	// Tenure names one holder's tenure: a random value written when a
	// candidate takes the lock and kept by every renewal of that tenure.
	// It is the record's first field, so the stored JSON begins with it,
	// and a renewal is a compare on that prefix (Renewer): any renewal of
	// the tenure may land, in any order, and none after another writer.
	// Empty in a released or retired record, and in records of vigils
	// before 0.9.
	Tenure string `json:"tenure,omitempty"`
	// Holder is the identity of the leader; empty after a release.
	Holder string `json:"holder"`
	// LeaseDurationMillis is the holder's lease duration. Candidates wait this
	// long, on their own clock, before they treat an unchanged record as expired.
	LeaseDurationMillis int64 `json:"leaseDurationMillis"`
	// AcquireTime and RenewTime are the holder's wall clock, for humans only;
	// no decision is based on them.
	AcquireTime time.Time `json:"acquireTime"`
	RenewTime   time.Time `json:"renewTime"`
	// Transitions counts changes of holder.
	Transitions int `json:"transitions"`
	// Nonce is unique per write attempt, so a leader that sends one renewal
	// through several members can recognise its own write.
	Nonce string `json:"nonce"`
	// Instance identifies the process that wrote the record (Config.Instance).
	// Two processes with the same Holder name but different instances are a
	// misconfiguration (a cloned VM, "localhost"), never one candidate.
	Instance string `json:"instance,omitempty"`
	// MAC is the hardware address the holder announces the VIP with; peers
	// compare who answers for the VIP against it (conflict detection).
	MAC string `json:"mac,omitempty"`
	// MovedTo, when set, says the election has moved to another lock (a
	// Kubernetes Lease) for good: see Retire. Such a record names no node,
	// and no candidate ever takes it.
	MovedTo string `json:"movedTo,omitempty"`
	// Format is vigil.RecordFormat when this version wrote the record, 0
	// when vigil 0.3.0 or before did. It is the last field: the stored
	// JSON must begin with the tenure, whatever the format (Renewer).
	Format int `json:"format,omitempty"`
}

// LeaseDuration returns the record's lease duration.
func (r Record) LeaseDuration() time.Duration {
	return time.Duration(r.LeaseDurationMillis) * time.Millisecond
}

// Observation is the result of one read or write of the lock.
type Observation struct {
	// Record is nil when the key does not exist.
	Record *Record
	// Revision is the key's modification revision, 0 when absent. Writes
	// compare against it.
	Revision int64
	// Term is the raft term reported by the member that answered; a change
	// means the store elected a new leader.
	Term uint64
}

// Holder returns the current holder, or "" when none.
func (o Observation) Holder() string {
	if o.Record == nil {
		return ""
	}
	return o.Record.Holder
}

// Lock is a record in a quorum store changed only by compare-and-swap.
type Lock interface {
	// Get reads the record linearizably.
	Get(ctx context.Context) (Observation, error)
	// Write stores rec if the key's revision is still rev (0: the key must
	// not exist). When another write came first it returns ErrConflict and
	// the current observation.
	Write(ctx context.Context, rec Record, rev int64) (Observation, error)
	// Describe names the lock for logs.
	Describe() string
}

// Renewer is implemented by a Lock whose renewals can be pipelined. Renew
// stores rec if the record in the store is still of rec.Tenure (written by
// this tenure, whichever of its writes landed last); otherwise it returns
// ErrConflict and the current observation. So a leader may send its next
// renewal before the last one is answered: a slow store then costs the
// leader a longer round trip, not a renewal per round trip.
type Renewer interface {
	Renew(ctx context.Context, rec Record) (Observation, error)
}

// Prober tells whether the store is, at this moment, unable to commit any
// write: a majority of its voting members answer and none of them follows a
// leader that also answered. See the package documentation.
type Prober interface {
	StoreLeaderless(ctx context.Context) (bool, error)
}

// Watcher is optionally implemented by a Lock. Watch sends an observation to
// out for every committed change of the record, until ctx is done, and then
// returns. Candidates use it to start their lease window at the moment a
// renewal lands, and to take a released lock at once, instead of at their
// next read.
type Watcher interface {
	Watch(ctx context.Context, out chan<- Observation)
}

// ErrConflict is returned by Lock.Write when the record changed since the
// revision the write was based on.
var ErrConflict = errors.New("election: lock record changed concurrently")

// ErrDuplicateIdentity is returned by Elector.Run when another live process
// campaigns or leads under the same identity (node name).
var ErrDuplicateIdentity = errors.New("election: another process uses this node name")

// validate.ErrInvalid wraps every configuration error.
