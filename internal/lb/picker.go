package lb

import (
	"fmt"

	"github.com/vigil-ha/vigil/internal/validate"
)

// Candidate is what a Picker sees of one backend.
type Candidate struct {
	Addr string
	// Usable: the backend passed its checks and takes new connections.
	Usable bool
	// Active counts its connections being dialled or proxied.
	Active int
}

// Picker chooses the backend each new connection goes to (in the manner of
// CoreDNS's forward.Policy). The balancer owns the backends, their health
// and their connection counts; the picker owns only its choice, and
// whatever state that needs (a round-robin position, preference tiers).
//
// Pick gets every backend, sorted by address, and those this connection
// already tried and failed to dial. It returns the index of the one to dial
// next, or -1 to give up (the client is reset). anyway says the backend is
// picked although it is not Usable, as a last resort; otherwise a backend
// that is not Usable by the time the connection is made is given up.
//
// Pick is called with the balancer's lock held, one call at a time: it must
// be quick, must not block, and must not call the Balancer.
type Picker interface {
	Pick(backends []Candidate, tried map[string]bool) (i int, anyway bool)
}

// LeastConn picks the usable backend with the fewest active connections,
// ties broken in turn. It suits the API server's mix of short requests and
// watches that last for hours: round robin would pile long watches on
// whichever backend came back up last.
func LeastConn() Picker { return &leastConn{} }

// RoundRobin picks usable backends in turn.
func RoundRobin() Picker { return &roundRobin{} }

// ParsePolicy returns the picker --lb-policy names: "least-conn" (the
// default, also for "") or "round-robin".
func ParsePolicy(s string) (Picker, error) {
	switch s {
	case "least-conn", "":
		return LeastConn(), nil
	case "round-robin":
		return RoundRobin(), nil
	}
	return nil, fmt.Errorf("%w: unknown balancing policy %q (least-conn or round-robin)", validate.ErrInvalid, s)
}

type leastConn struct{ next int }

func (*leastConn) String() string { return "least-conn" }

func (p *leastConn) Pick(bs []Candidate, tried map[string]bool) (int, bool) {
	i := LeastConnFrom(bs, tried, &p.next, func(Candidate) bool { return true })
	return i, false
}

// LeastConnFrom is least connections among the usable backends not tried
// that keep says to keep, ties broken in turn from *next, which it
// advances past the one picked; -1 when none is left. For pickers that
// narrow the choice first (the worker agent's tiers).
func LeastConnFrom(bs []Candidate, tried map[string]bool, next *int, keep func(Candidate) bool) int {
	n := len(bs)
	best := -1
	for k := range n {
		i := (*next + k) % n
		b := bs[i]
		if !b.Usable || tried[b.Addr] || !keep(b) {
			continue
		}
		if best < 0 || b.Active < bs[best].Active {
			best = i
		}
	}
	if best >= 0 {
		*next = (best + 1) % n
	}
	return best
}

type roundRobin struct{ next int }

func (*roundRobin) String() string { return "round-robin" }

func (p *roundRobin) Pick(bs []Candidate, tried map[string]bool) (int, bool) {
	n := len(bs)
	for k := range n {
		i := (p.next + k) % n
		if bs[i].Usable && !tried[bs[i].Addr] {
			p.next = (i + 1) % n
			return i, false
		}
	}
	return -1, false
}
