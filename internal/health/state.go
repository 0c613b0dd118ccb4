package health

import (
	"fmt"
	"time"
)

// State is what the checker believes about one backend.
type State int

// States. A backend starts Unknown and is used by the balancer only once Up.
const (
	Unknown State = iota
	Up
	Down
)

func (s State) String() string {
	switch s {
	case Up:
		return "up"
	case Down:
		return "down"
	default:
		return "unknown"
	}
}

// Cause says why a check failed, which decides what happens to connections
// already established to the backend.
type Cause int

const (
	// NoCause: the last check passed.
	NoCause Cause = iota
	// Draining: the backend answered, but not 200. A kube-apiserver that is
	// shutting down fails /readyz for --shutdown-delay-duration while it
	// still serves requests in flight, so its established connections are
	// left to finish; only new ones go elsewhere.
	Draining
	// Dead: the backend's port refuses connections: its node is up and
	// its process is gone (killed, crashed, exited). Established connections
	// are closed at once: they are dead already, or about to be, and their
	// clients should reconnect elsewhere now.
	Dead
	// Unreachable: no answer in time, or a failure that does not prove the
	// process gone (timeout, no route, reset, TLS error). The process may
	// only be slow or paused: new connections go elsewhere, established ones
	// are left alone for the balancer's grace period, since resetting
	// thousands of watches costs the whole control plane a relist.
	Unreachable
)

func (c Cause) String() string {
	switch c {
	case Draining:
		return "draining"
	case Dead:
		return "dead"
	case Unreachable:
		return "unreachable"
	default:
		return "none"
	}
}

// Status is a snapshot of one backend.
type Status struct {
	Backend string // host:port that traffic goes to
	State   State
	// Cause of the current run of failures; NoCause when the last check
	// passed.
	Cause Cause
	// LastError describes the last failure.
	LastError string
	// FailingSince is when the first check of the current run of
	// consecutive failures started; zero when the last check passed or none
	// ran yet.
	FailingSince time.Time
	// PassingSince is when the current run of consecutive passed checks
	// began (the first of them ended); zero when the last check failed or
	// none ran yet. A backend can be Up while failing (fewer than fall
	// failures) and Up again after a brownout without ever going Down:
	// this, not Since, says how long it has answered.
	PassingSince time.Time
	// LastRTT is how long the last check took when it passed; zero when it
	// failed or none ran yet. A server that passes its checks slowly is
	// busy: in a brownout every server slows down before any fails.
	LastRTT time.Duration
	// Since is when State last changed.
	Since time.Time
}

func (s Status) String() string {
	if s.State == Down {
		return fmt.Sprintf("%s %s (%s: %s)", s.Backend, s.State, s.Cause, s.LastError)
	}
	return fmt.Sprintf("%s %s", s.Backend, s.State)
}

// result is the outcome of one check.
type result struct {
	cause Cause // NoCause on success
	err   string
	// started is when the check began; a failed check proves the backend
	// was failing from then on (a timed-out check ends Timeout later).
	started time.Time
	// took is how long the check took.
	took time.Duration
}

// tracker is the rise/fall state machine of one backend. It is a pure value:
// the checker feeds it results and acts on the transitions it reports.
//
//   - Unknown → Up on the first success: a backend that was never seen
//     failing is usable at once (a node restarting its LB does not wait
//     rise*interval before forwarding).
//   - Unknown → Down on the first failure.
//   - Up → Down after fall consecutive failures, or at once when marked
//     dead by the data path (a refused connection is proof enough).
//   - Down → Up after rise consecutive successes.
type tracker struct {
	rise, fall int
	st         Status
	okRun      int
	failRun    int
}

// observe folds in one result at now and reports whether State or Cause
// changed (the balancer needs both: draining → dead closes connections).
func (t *tracker) observe(r result, now time.Time) bool {
	before := t.st
	if r.cause == NoCause {
		t.failRun = 0
		t.okRun++
		t.st.FailingSince = time.Time{}
		t.st.LastRTT = r.took
		if t.st.PassingSince.IsZero() {
			t.st.PassingSince = now
		}
		switch t.st.State {
		case Unknown:
			t.set(Up, now)
		case Down:
			if t.okRun >= t.rise {
				t.set(Up, now)
			}
		}
		if t.st.State == Up {
			t.st.Cause = NoCause
		}
		return t.st.State != before.State || t.st.Cause != before.Cause
	}
	t.okRun = 0
	t.failRun++
	t.st.PassingSince, t.st.LastRTT = time.Time{}, 0
	t.st.LastError = r.err
	if t.st.FailingSince.IsZero() {
		t.st.FailingSince = now
		if !r.started.IsZero() && r.started.Before(now) {
			t.st.FailingSince = r.started
		}
	}
	switch t.st.State {
	case Unknown:
		t.set(Down, now)
	case Up:
		if t.failRun >= t.fall {
			t.set(Down, now)
		}
	}
	if t.st.State == Down {
		t.st.Cause = r.cause
	}
	return t.st.State != before.State || t.st.Cause != before.Cause
}

// markDead takes the backend down at once; the data path saw it refuse a
// connection.
func (t *tracker) markDead(err string, now time.Time) bool {
	before := t.st
	t.okRun = 0
	t.failRun = max(t.failRun+1, t.fall)
	t.st.PassingSince, t.st.LastRTT = time.Time{}, 0
	t.st.LastError = err
	if t.st.FailingSince.IsZero() {
		t.st.FailingSince = now
	}
	if t.st.State != Down {
		t.set(Down, now)
	}
	t.st.Cause = Dead
	return t.st.State != before.State || t.st.Cause != before.Cause
}

func (t *tracker) set(s State, now time.Time) {
	t.st.State = s
	t.st.Since = now
}
