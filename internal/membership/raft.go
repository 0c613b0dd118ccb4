package membership

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"
)

// Client reachability is one view of a member; raft's is the other. A
// member whose client port is filtered, or too busy to answer (a long
// defragmentation), still replicates raft normally, serves its own node's
// API server over loopback and counts towards quorum: removing it would
// cost the cluster a working voter. So before a prune, every member that
// answers is asked what its raft transport has received from the others
// (etcdcluster.PeerTraffic), twice, a second or more apart: a member whose
// raft messages still arrive somewhere is not pruned, whatever its client
// port does.
//
// A live follower answers the leader's heartbeats, a live leader sends
// them; followers exchange little with each other. So the evidence that a
// member went silent counts only where the raft leader's own count was
// read (or, for the leader itself, its followers' counts): without it,
// raft's view is unknown, and nothing is pruned.

// RaftLinks is what the answering members' raft transports say of one
// member.
type RaftLinks struct {
	// LinkedFrom names the answering members that received raft messages
	// from this one between the two reads.
	LinkedFrom []string `json:"linkedFrom"`
	// Asked counts the answering members (other than this one) whose
	// counts were read twice.
	Asked int `json:"asked"`
	// Error says why raft's view is unknown, or what could not be read.
	Error string `json:"error,omitempty"`
	// leaderRead: the raft leader's counts (or, for the leader, a
	// follower's) were among those read.
	leaderRead bool
}

// Linked tells whether raft messages from the member still arrive.
func (r *RaftLinks) Linked() bool { return r != nil && len(r.LinkedFrom) > 0 }

// Known tells whether the answers can show the member silent: counts read
// twice from the member that hears from it (the leader, or for the
// leader, a follower).
func (r *RaftLinks) Known() bool { return r != nil && (r.Linked() || (r.Asked > 0 && r.leaderRead)) }

// String is a short summary: "linked from cp1, cp2 (2 of 2 asked)",
// "silent (2 asked)", "unknown (...)".
func (r *RaftLinks) String() string {
	switch {
	case r == nil:
		return "not checked"
	case r.Linked():
		return fmt.Sprintf("linked from %s (%d of %d asked)", strings.Join(r.LinkedFrom, ", "), len(r.LinkedFrom), r.Asked)
	case r.Known():
		return fmt.Sprintf("silent (%d asked)", r.Asked)
	default:
		return "unknown (" + r.Error + ")"
	}
}

// raftSampleGap is the least time between the two reads of the counts: ten
// heartbeats at etcd's default interval.
const raftSampleGap = time.Second

// raftSampleMaxAge is how old a kept read may be to serve as the first of
// the two: a few observer rounds.
const raftSampleMaxAge = 10 * time.Second

// traffic is one read of one member's counts.
type traffic struct {
	at    time.Time
	bytes map[uint64]float64
}

// CheckRaft fills in Raft for every started member of v. Each member that
// answered Status in v is asked for its counts; the previous read of the
// same member serves as the first one if it is between raftSampleGap and
// raftSampleMaxAge old (the observer's rounds), otherwise CheckRaft reads
// again after raftSampleGap.
func (c *Cluster) CheckRaft(ctx context.Context, v *View) {
	var asked []Member
	for _, m := range v.Members {
		if m.Reachable && m.endpoint != "" {
			asked = append(asked, m)
		}
	}
	now := c.readTraffic(ctx, asked)
	before := map[uint64]traffic{}
	c.mu.Lock()
	for id, t := range c.traffic {
		before[id] = t
	}
	c.mu.Unlock()
	fresh := true
	for _, m := range asked {
		b, ok := before[m.ID]
		n, read := now[m.ID]
		if read && (!ok || n.at.Sub(b.at) < raftSampleGap || n.at.Sub(b.at) > raftSampleMaxAge) {
			fresh = false
		}
	}
	if !fresh {
		for id, t := range now {
			before[id] = t
		}
		select {
		case <-ctx.Done():
		case <-time.After(raftSampleGap):
		}
		now = c.readTraffic(ctx, asked)
	}
	c.mu.Lock()
	c.traffic = map[uint64]traffic{}
	for id, t := range now {
		c.traffic[id] = t
	}
	c.mu.Unlock()
	for i := range v.Members {
		m := &v.Members[i]
		if m.Name == "" {
			continue // never started: no transport has heard from it
		}
		m.Raft = raftLinksOf(*m, asked, before, now, v.RaftLeader)
	}
}

// raftLinksOf judges m from two reads of the counts of the members in
// asked: linked from every member whose count of bytes received from m
// grew between before and now.
func raftLinksOf(m Member, asked []Member, before, now map[uint64]traffic, leader uint64) *RaftLinks {
	r := &RaftLinks{}
	var unread []string
	for _, a := range asked {
		if a.ID == m.ID {
			continue // its own counts say nothing of itself
		}
		b, okB := before[a.ID]
		n, okN := now[a.ID]
		// A count that went down is a member that restarted in
		// between: its two reads compare nothing.
		if !okB || !okN || n.bytes[m.ID] < b.bytes[m.ID] {
			unread = append(unread, a.Name)
			continue
		}
		r.Asked++
		if leader != 0 && (a.ID == leader || m.ID == leader) {
			r.leaderRead = true
		}
		if n.bytes[m.ID] > b.bytes[m.ID] {
			r.LinkedFrom = append(r.LinkedFrom, a.Name)
		}
	}
	switch {
	case len(unread) > 0:
		r.Error = "no counts from " + strings.Join(unread, ", ")
	case r.Asked == 0:
		r.Error = "no other member answered"
	case !r.leaderRead:
		r.Error = "the raft leader's counts were not read"
	}
	return r
}

// readTraffic reads the counts of every member in ms, at once; a member
// that does not answer is left out.
func (c *Cluster) readTraffic(ctx context.Context, ms []Member) map[uint64]traffic {
	var mu sync.Mutex
	out := map[uint64]traffic{}
	var wg sync.WaitGroup
	for _, m := range ms {
		wg.Go(func() {
			sctx, cancel := context.WithTimeout(ctx, c.cfg.StatusTimeout)
			b, err := c.cl.PeerTraffic(sctx, m.endpoint)
			cancel()
			if err != nil {
				c.log.Debug("cannot read a member's raft traffic", "member", m.Label(), "err", err)
				return
			}
			mu.Lock()
			out[m.ID] = traffic{at: time.Now(), bytes: b}
			mu.Unlock()
		})
	}
	wg.Wait()
	return out
}
