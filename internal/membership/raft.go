package membership

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
)

// Client reachability is one view of a member; raft's is the other. A
// member whose client port is filtered, or too busy to answer (a long
// defragmentation), still replicates raft normally, serves its own node's
// API server over loopback and counts towards quorum: removing it would
// cost the cluster a working voter. So before a prune, every member that
// answers is asked what its raft transport says of the others
// (etcdcluster.PeerLinks), and a member that any of them still has a
// working link with is not pruned, whatever its client port does.

// RaftLinks is what the answering members' raft transports say of one
// member.
type RaftLinks struct {
	// LinkedFrom names the answering members whose transport has a
	// working link with this one.
	LinkedFrom []string `json:"linkedFrom"`
	// Asked counts the answering members (other than this one) whose
	// transport state could be read.
	Asked int `json:"asked"`
	// Error says why some could not be read, if any.
	Error string `json:"error,omitempty"`
}

// Linked tells whether raft still has a working link with the member.
func (r *RaftLinks) Linked() bool { return r != nil && len(r.LinkedFrom) > 0 }

// Known tells whether any answering member's transport state was read.
func (r *RaftLinks) Known() bool { return r != nil && r.Asked > 0 }

// String is a short summary: "linked from cp1, cp2", "no link (2 asked)",
// "unknown (...)".
func (r *RaftLinks) String() string {
	switch {
	case r == nil:
		return "not checked"
	case r.Linked():
		return fmt.Sprintf("linked from %s (%d of %d asked)", strings.Join(r.LinkedFrom, ", "), len(r.LinkedFrom), r.Asked)
	case r.Known():
		return fmt.Sprintf("no link (%d asked)", r.Asked)
	default:
		return "unknown (" + r.Error + ")"
	}
}

// CheckRaft fills in Raft for every started member of v: each member that
// answered Status in v is asked, once, for its transport's links.
func (c *Cluster) CheckRaft(ctx context.Context, v *View) {
	type answer struct {
		name  string
		links map[uint64]bool
		err   error
	}
	var (
		mu      sync.Mutex
		answers []answer
		wg      sync.WaitGroup
	)
	for _, m := range v.Members {
		if !m.Reachable || m.endpoint == "" {
			continue
		}
		wg.Go(func() {
			sctx, cancel := context.WithTimeout(ctx, c.cfg.StatusTimeout)
			links, err := c.cl.PeerLinks(sctx, m.endpoint, m.ID)
			cancel()
			mu.Lock()
			answers = append(answers, answer{m.Name, links, err})
			mu.Unlock()
		})
	}
	wg.Wait()
	slices.SortFunc(answers, func(a, b answer) int { return strings.Compare(a.name, b.name) })
	for i := range v.Members {
		m := &v.Members[i]
		if m.Name == "" {
			continue // never started: no transport has seen it
		}
		r := &RaftLinks{}
		var errs []string
		for _, a := range answers {
			switch {
			case a.name == m.Name:
				continue // its own view of itself says nothing
			case a.err != nil:
				errs = append(errs, a.err.Error())
				continue
			}
			r.Asked++
			if a.links[m.ID] {
				r.LinkedFrom = append(r.LinkedFrom, a.name)
			}
		}
		if len(errs) > 0 {
			r.Error = strings.Join(errs, "; ")
		} else if r.Asked == 0 {
			r.Error = "no other member answered"
		}
		m.Raft = r
	}
}
