package membership

import (
	"errors"
	"fmt"
	"slices"
	"time"
)

// Errors. Every refusal wraps ErrRefused and says why and what to do. Bad
// input (a malformed URL, a name taken) wraps validate.ErrInvalid, the one
// sentinel of invalid configuration.
var (
	ErrRefused       = errors.New("membership: refused")
	ErrUnknownMember = errors.New("membership: no such member")
)

// Member is one etcd member and what was observed of it.
type Member struct {
	ID         uint64   `json:"id"`
	Name       string   `json:"name"`
	PeerURLs   []string `json:"peerURLs"`
	ClientURLs []string `json:"clientURLs"`
	Learner    bool     `json:"learner"`
	// Observed through Status on each client URL.
	Reachable bool   `json:"reachable"`
	Leader    bool   `json:"leader"`
	RaftIndex uint64 `json:"raftIndex,omitempty"`
	// Lag is the raft leader's applied index minus this member's.
	Lag    uint64 `json:"lag"`
	DBSize int64  `json:"dbSize,omitempty"`
	Error  string `json:"error,omitempty"`
	// SeenBy is what each vigil's published report says of the member,
	// by observer (node name).
	SeenBy map[string]Sighting `json:"seenBy,omitempty"`
	// Raft is what the answering members' raft transports say of it
	// (raft.go); nil until CheckRaft.
	Raft *RaftLinks `json:"raft,omitempty"`

	endpoint   string // the client URL that answered Status
	leaderSeen uint64 // the raft leader its Status named
}

// IDString is the member ID as etcdctl prints it.
func (m Member) IDString() string { return fmt.Sprintf("%x", m.ID) }

// Label names a member for messages.
func (m Member) Label() string {
	if m.Name == "" {
		return m.IDString() + " (not started)"
	}
	return fmt.Sprintf("%s (%s)", m.Name, m.IDString())
}

// View is a snapshot of the cluster's members.
type View struct {
	Members []Member
	// LeaderID is the raft leader as the reachable members report it; 0
	// when none does.
	LeaderID uint64
	// RaftLeader is the leader most reachable members follow, whether or
	// not it answers itself; 0 when none names one.
	RaftLeader uint64
	// Reports are the views the vigils have published.
	Reports []Report
	// AskedAt is when the members were asked for their status, and
	// AnsweredAt when the last answer (or timeout) came: a member
	// unreachable in this view did not answer at any time in between.
	AskedAt, AnsweredAt time.Time
}

// counts returns voters and healthy (reachable) voters. Learners count for
// neither: they do not vote.
func (v View) counts() (voters, healthy int) {
	for _, m := range v.Members {
		if m.Learner {
			continue
		}
		voters++
		if m.Reachable {
			healthy++
		}
	}
	return voters, healthy
}

func quorum(voters int) int { return voters/2 + 1 }

// Find resolves a name or a hexadecimal ID.
func (v View) Find(nameOrID string) (Member, error) {
	for _, m := range v.Members {
		if m.Name == nameOrID || m.IDString() == nameOrID {
			return m, nil
		}
	}
	return Member{}, fmt.Errorf("%w: %q is neither the name nor the hexadecimal ID of a member (see vigil members list)", ErrUnknownMember, nameOrID)
}

// CheckRemove tells whether removing m is safe.
//
//   - The cluster must have quorum now, or the removal cannot commit: etcd
//     with a dead majority needs disaster recovery (vigil members recover),
//     not a membership change.
//   - After the removal, the healthy voters must still form a quorum of the
//     remaining voters. Removing a dead voter never lowers the healthy count,
//     only the quorum; removing a healthy one lowers both.
//   - A healthy member is removed only with force: it is doing its job.
func (v View) CheckRemove(m Member, force bool) error {
	voters, healthy := v.counts()
	if healthy < quorum(voters) {
		return fmt.Errorf("%w: the cluster has no quorum (%d of %d voters reachable, %d needed), so no membership change can commit; bring members back, or if they are lost for good run vigil members recover on a survivor (docs/operations.md, disaster recovery)",
			ErrRefused, healthy, voters, quorum(voters))
	}
	if m.Reachable && !force {
		return fmt.Errorf("%w: %s is healthy; removing it is a deliberate act: pass `force` (or use replace to swap it for a new member first)", ErrRefused, m.Label())
	}
	if m.Learner {
		return nil // no vote, no quorum change
	}
	after, healthyAfter := voters-1, healthy
	if m.Reachable {
		healthyAfter--
	}
	if after == 0 {
		return fmt.Errorf("%w: %s is the last voter", ErrRefused, m.Label())
	}
	if healthyAfter < quorum(after) {
		return fmt.Errorf("%w: removing %s would leave %d healthy of %d voters, below the quorum of %d; bring a member back or add one first",
			ErrRefused, m.Label(), healthyAfter, after, quorum(after))
	}
	return nil
}

// transferTarget picks the healthy voter, other than m, to take raft
// leadership before m is removed: the one furthest along, and one not in
// avoid whenever there is one. Remove avoids the member on the VIP
// holder's node: the holder's vigil moves raft leadership off its own
// member within seconds (daemon's raftShedder), to the voter furthest
// along, which may well be m, and a second transfer pauses every write
// again. Replace also avoids the member it has just promoted: a member
// that started moments ago, on a busy machine, is the likeliest to take
// longer than an election timeout, and every write waits meanwhile.
func (v View) transferTarget(m Member, avoid ...uint64) (Member, bool) {
	var best Member
	found := false
	for _, c := range v.Members {
		if c.ID == m.ID || c.Learner || !c.Reachable {
			continue
		}
		cAvoided, bestAvoided := slices.Contains(avoid, c.ID), slices.Contains(avoid, best.ID)
		switch {
		case !found:
		case cAvoided != bestAvoided:
			if cAvoided {
				continue
			}
		case c.RaftIndex <= best.RaftIndex:
			continue
		}
		best, found = c, true
	}
	return best, found
}
