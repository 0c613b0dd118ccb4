// Package election elects one leader among the control-plane nodes over an
// existing quorum store. It never runs consensus of its own: the store (etcd,
// or later the Kubernetes Lease API) decides every write, and this package only
// decides when to try one.
//
// # Algorithm
//
// The shape is client-go's leaderelection: a lock record (holder, lease
// duration, a per-write nonce) lives under one key and is changed only by
// compare-and-swap on the key's revision. Expiry is judged on the observer's own
// monotonic clock, never on timestamps written by another machine:
//
//   - A candidate watches the record. It may take the lock only after it has
//     seen the same revision, in the same raft term, for a whole lease duration
//     (measured from the moment a read returned that revision), or at once when
//     the record is released (empty holder) or absent.
//   - The leader renews every retry period. If no renewal has succeeded for the
//     renew deadline it steps down: the OnStoppedLeading callback (which removes
//     the VIP) runs before the elector does anything else.
//
// # Why two nodes never hold the lock
//
// A renewal that starts at time T is committed before any read can return it,
// so a candidate's lease window starts after T and it cannot write before
// T + LeaseDuration. The leader gives up at T + RenewDeadline at the latest.
// LeaseDuration - RenewDeadline is the margin that covers removing the address
// (a netlink call, well under a millisecond), scheduling delay and clock rate
// differences; Validate insists on at least 100 ms of it.
//
// # When the store itself has no leader
//
// An etcd leader election (about 1.6 s with etcd's default 1 s election timeout)
// stops every write, including the VIP holder's renewal. Stepping down then
// would turn a store hiccup into a VIP outage although nobody else can take the
// lock either. So, when a renewal fails, the leader asks each etcd member for its
// status (see Prober). If a majority of the voting members answer and none of
// them names a leader that also answered, no write can commit anywhere (a
// leader able to commit needs a majority, which would overlap the members that
// answered, and renewals are sent through every member, so one of them would
// have been forwarded to it). The leader then keeps the lock, anchoring its
// deadline at the start of that probe. Candidates restart their lease window
// whenever they see a new raft term, so after the store recovers they wait a
// full lease again while the leader renews. A leader that is cut off from the
// other members sees at most a minority answer and steps down on time.
//
// # Moving to another election
//
// Two elections running side by side (some nodes on the etcd lock, some on
// a Lease) would each elect a holder. Retire closes the old one first: it
// takes the old lock under the candidate rule above, so the old holder has
// stepped down, and writes a record that never expires and names where the
// election went (Record.MovedTo). Candidates never take such a record, so
// from that write on only the new election can elect anyone.
package election
