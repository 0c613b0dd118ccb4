package etcdcluster

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Status is what one member said of itself.
type Status struct {
	Endpoint  string
	ID        uint64
	Leader    uint64 // the raft leader it follows; its own ID when it leads
	RaftIndex uint64 // applied index
	Learner   bool
	DBSize    int64
	Took      time.Duration // how long the member took to answer
	member    *Member
}

// StatusAll asks every connected member for its status in parallel, over
// the existing connections, and returns the answers that arrived before ctx
// ended.
func (c *Cluster) StatusAll(ctx context.Context) []Status {
	c.identify(ctx)
	return eachMember(c, func(m *Member) (Status, bool) {
		st, err := m.status(ctx)
		return st, err == nil
	})
}

// eachMember runs f on every connected member in parallel and returns the
// results it kept (ok), in no particular order.
func eachMember[T any](c *Cluster, f func(*Member) (T, bool)) []T {
	members := c.Members()
	ch := make(chan T, len(members))
	var wg sync.WaitGroup
	for _, m := range members {
		wg.Go(func() {
			if v, ok := f(m); ok {
				ch <- v
			}
		})
	}
	wg.Wait()
	close(ch)
	var out []T
	for v := range ch {
		out = append(out, v)
	}
	return out
}

func (m *Member) status(ctx context.Context) (Status, error) {
	asked := time.Now()
	resp, err := m.maint.Status(ctx, &pb.StatusRequest{})
	if err != nil {
		return Status{}, err
	}
	return Status{Endpoint: m.Endpoint, ID: resp.Header.MemberId, Leader: resp.Leader, RaftIndex: resp.RaftAppliedIndex,
		Learner: resp.IsLearner, DBSize: resp.DbSize, Took: time.Since(asked), member: m}, nil
}

// StatusOf asks the member at endpoint (one of its client URLs) for its
// status, over the existing connection; an endpoint not connected yet (a
// member added since the last list read) gets a connection of its own for
// this one call.
func (c *Cluster) StatusOf(ctx context.Context, endpoint string) (Status, error) {
	for _, m := range c.Members() {
		if m.Endpoint == endpoint {
			return m.status(ctx)
		}
	}
	m, err := c.dial(endpoint)
	if err != nil {
		return Status{}, err
	}
	defer m.Client.Close()
	return m.status(ctx)
}

// Moving raft leadership is a disruption of its own: until the transferee
// has taken over, the leader drops proposals (the VIP holder's renewals
// among them), for up to an etcd election timeout if the transfer fails.
const (
	// statusTimeout bounds each member's Status answer before a move, so
	// that a powered-off member, whose connection hangs, cannot use up the
	// time the move itself needs.
	statusTimeout = 500 * time.Millisecond
	// moveLeaderTimeout bounds one transfer. etcd answers only once the
	// transferee leads, waiting for as long as the request's context
	// allows: a transfer that fails, or leadership that goes elsewhere
	// meanwhile, would leave an unbounded call waiting for ever. A
	// caught-up transferee takes over within a few heartbeats, and raft
	// gives up a transfer after an election timeout (1 s by default).
	moveLeaderTimeout = 5 * time.Second
	// shedMaxLag is how many raft entries behind the leader a transferee
	// may be. One that is further behind has to catch up first, and the
	// transfer may time out meanwhile.
	shedMaxLag = 16
	// shedRounds and shedLeaderLag: before a move, every member is asked
	// for its status shedRounds times, and the move waits while the
	// leader's answer came more than shedLeaderLag after the slowest
	// other voter's in any round. A leader that is descheduled, stopped
	// or starved now and then (a process throttled by its cgroup, a
	// machine swapping) answers late in bursts; its transfer then takes
	// hundreds of milliseconds, and every write waits for it (in the
	// lab, a holder whose own etcd member led raft while it ran 37 ms in
	// every 82 lost the VIP twice, once per move). The bursts are
	// missed in one round more often than in three.
	shedRounds    = 3
	shedLeaderLag = 10 * time.Millisecond
)

// ErrNoLeader is returned when no member that answered reports itself the
// raft leader.
var ErrNoLeader = errors.New("no etcd member reports itself the raft leader")

// MoveLeader asks the member that leads raft now to hand leadership to the
// voter to. It returns nil at once if to leads already. The request goes
// over the leader's own connection (only the leader can transfer) and is
// bounded by moveLeaderTimeout.
func (c *Cluster) MoveLeader(ctx context.Context, to uint64) error {
	sctx, cancel := context.WithTimeout(ctx, statusTimeout)
	answers := c.StatusAll(sctx)
	cancel()
	var leader *Status
	for i, a := range answers {
		if a.ID == a.Leader {
			leader = &answers[i]
		}
	}
	if leader == nil {
		return ErrNoLeader
	}
	if leader.ID == to {
		return nil
	}
	return moveLeader(ctx, leader.member.Client, to)
}

func moveLeader(ctx context.Context, leader *clientv3.Client, to uint64) error {
	mctx, cancel := context.WithTimeout(ctx, moveLeaderTimeout)
	defer cancel()
	_, err := leader.MoveLeader(mctx, to)
	return err
}

// ErrShedDeferred wraps the reason ShedLeadership left leadership where it
// is although the member it was asked about leads: a voter does not answer
// or follows another leader (a cluster with a fault: a transfer adds risk
// and leaves no spare member to fail over to), or no voter is caught up.
var ErrShedDeferred = errors.New("etcd raft leadership stays on this member for now")

// ShedLeadership moves etcd raft leadership away from the member called
// name, if it leads, to the most caught-up other voter. It reports the
// member leadership moved to, or "" when name does not lead. It moves
// nothing, and returns an error wrapping ErrShedDeferred, unless there are
// three voters or more, every voter answers and follows the leader, one of
// them is within shedMaxLag entries of it, and the leader answers as
// promptly as the others (shedRounds, shedLeaderLag).
func (c *Cluster) ShedLeadership(ctx context.Context, name string) (string, error) {
	if _, err := c.MemberList(ctx); err != nil {
		return "", err
	}
	voters := c.Voters()
	sctx, cancel := context.WithTimeout(ctx, statusTimeout)
	answers := c.StatusAll(sctx)
	cancel()
	var leader *Status
	byID := map[uint64]Status{}
	for i, a := range answers {
		byID[a.ID] = a
		if a.ID == a.Leader {
			leader = &answers[i]
		}
	}
	if leader == nil || voters[leader.ID] != name {
		return "", nil
	}
	if len(voters) == 2 {
		// Two voters lose their quorum with either member: moving
		// leadership off the VIP holder buys no faster failover, and the
		// transfer pauses writes, the holder's renewals among them. After
		// a quorum recovery the second voter is a machine that has just
		// joined and is starting its control plane; in the kubeadm lab a
		// move to it cost the holder the VIP.
		return "", fmt.Errorf("%w: with 2 voters, losing either member loses the quorum; a move would only pause writes", ErrShedDeferred)
	}
	var cands []Status
	for id, vname := range voters {
		a, ok := byID[id]
		switch {
		case !ok:
			return "", fmt.Errorf("%w: voter %s does not answer", ErrShedDeferred, VoterLabel(vname, id))
		case a.Leader != leader.ID:
			return "", fmt.Errorf("%w: voter %s follows another leader (%x)", ErrShedDeferred, VoterLabel(vname, id), a.Leader)
		case id != leader.ID && !a.Learner && a.RaftIndex+shedMaxLag >= leader.RaftIndex:
			cands = append(cands, a)
		}
	}
	if len(cands) == 0 {
		if len(voters) < 2 {
			return "", nil // a single member: nowhere to move it
		}
		return "", fmt.Errorf("%w: no other voter is within %d entries of the leader's raft index %d", ErrShedDeferred, shedMaxLag, leader.RaftIndex)
	}
	for round := 1; ; round++ {
		if lag := leaderLag(answers, leader.ID, voters); lag > shedLeaderLag {
			return "", fmt.Errorf("%w: it answers %v later than the other voters (a slow leader's transfer is slow, and every write waits for it)", ErrShedDeferred, lag.Round(time.Millisecond))
		}
		if round == shedRounds {
			break
		}
		sctx, cancel := context.WithTimeout(ctx, statusTimeout)
		answers = c.StatusAll(sctx)
		cancel()
	}
	sort.Slice(cands, func(i, j int) bool {
		if cands[i].RaftIndex != cands[j].RaftIndex {
			return cands[i].RaftIndex > cands[j].RaftIndex
		}
		return cands[i].ID < cands[j].ID
	})
	to := cands[0]
	if err := moveLeader(ctx, leader.member.Client, to.ID); err != nil {
		return "", fmt.Errorf("move etcd leadership from %s to %s: %w", name, VoterLabel(voters[to.ID], to.ID), err)
	}
	return VoterLabel(voters[to.ID], to.ID), nil
}

// leaderLag is how much later than the slowest other voter the leader
// answered in one round of StatusAll: zero when it was not slower, and
// statusTimeout when it did not answer that round at all.
func leaderLag(answers []Status, leader uint64, voters map[uint64]string) time.Duration {
	var own, others time.Duration
	found := false
	for _, a := range answers {
		switch _, voter := voters[a.ID]; {
		case a.ID == leader:
			own, found = a.Took, true
		case voter && !a.Learner:
			others = max(others, a.Took)
		}
	}
	if !found {
		return statusTimeout
	}
	return max(0, own-others)
}

// StoreLeaderless reports true when a majority of the voters answered and
// none of them follows a leader that also answered: the cluster is electing
// a raft leader, and no write can commit until it has one.
func (c *Cluster) StoreLeaderless(ctx context.Context) (bool, error) {
	voters := c.Voters()
	if len(voters) == 0 {
		return false, errors.New("etcd voter list not known yet")
	}
	leaders := map[uint64]uint64{} // answering voter -> leader it follows
	for _, a := range c.StatusAll(ctx) {
		if _, ok := voters[a.ID]; ok {
			leaders[a.ID] = a.Leader
		}
	}
	if len(leaders) <= len(voters)/2 {
		return false, nil
	}
	for _, lead := range leaders {
		if _, ok := leaders[lead]; ok {
			return false, nil // a leader that answered us is working
		}
	}
	return true, nil
}

// OnLeader runs op over the connection of the member that leads raft now:
// membership changes, which must not be sent twice (an addition through two
// members adds two members) and which only the leader commits anyway.
func OnLeader[T any](ctx context.Context, c *Cluster, op func(context.Context, *clientv3.Client) (T, error)) (T, error) {
	return OnLeaderExcept(ctx, c, 0, op)
}

// ErrLeads is returned by OnLeaderExcept when the member it was told to
// keep out leads raft.
var ErrLeads = errors.New("the member leads raft")

// OnLeaderExcept is OnLeader, but returns ErrLeads without running op when
// the member except (0: none) leads raft now. The removal of a member uses
// it: leadership moved off that member may have moved back since (a VIP
// holder shedding it), and removing the raft leader costs an etcd
// election, every write waiting for it.
func OnLeaderExcept[T any](ctx context.Context, c *Cluster, except uint64, op func(context.Context, *clientv3.Client) (T, error)) (T, error) {
	sctx, cancel := context.WithTimeout(ctx, statusTimeout)
	answers := c.StatusAll(sctx)
	cancel()
	for _, a := range answers {
		if a.ID == a.Leader {
			if except != 0 && a.ID == except {
				var zero T
				return zero, fmt.Errorf("%w (%x)", ErrLeads, a.ID)
			}
			return op(ctx, a.member.Client)
		}
	}
	if len(answers) > 0 {
		// Electing a leader: the member forwards the change once one is
		// elected, or answers with etcd's own error.
		return op(ctx, answers[0].member.Client)
	}
	var zero T
	return zero, fmt.Errorf("%w: no etcd member answered (%s)", ErrNoLeader, strings.Join(c.Endpoints(), ","))
}

// VoterLabel names a voter; one that has not started yet has no name.
func VoterLabel(name string, id uint64) string {
	if name == "" {
		return fmt.Sprintf("%x", id)
	}
	return name
}

// Unaware returns the endpoints of the connected members that answered and
// do not list member id yet (serializable reads: what each member has
// applied). A member that does not answer is not counted: it cannot answer
// a new member either.
//
// A new member's etcd fetches the cluster from the first peer that answers
// and refuses to start if that peer's list lacks it ("member count is
// unequal"), so its start-up command is printed only once every member
// knows it.
func (c *Cluster) Unaware(ctx context.Context, id uint64) []string {
	c.identify(ctx)
	out := eachMember(c, func(m *Member) (string, bool) {
		resp, err := m.Client.MemberList(ctx, clientv3.WithSerializable())
		if err != nil {
			return "", false
		}
		for _, x := range resp.Members {
			if x.ID == id {
				return "", false
			}
		}
		return m.Endpoint, true
	})
	sort.Strings(out)
	return out
}
