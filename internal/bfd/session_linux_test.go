package bfd

import (
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"testing"
	"time"

	"github.com/vigil-ha/vigil/internal/netns"
	"github.com/vigil-ha/vigil/internal/nstest"
	"github.com/vigil-ha/vigil/internal/testkit"
)

// recorder keeps a session's state changes.
type recorder struct{ testkit.Record[Status] }

func (r *recorder) add(s Status)  { r.Add(s) }
func (r *recorder) all() []Status { return r.All() }

func (r *recorder) last() Status {
	all := r.All()
	if len(all) == 0 {
		return Status{State: "down"}
	}
	return all[len(all)-1]
}

// startIn starts a mux and a session to peer from local, both in ns.
func startIn(t *testing.T, ns string, local, peer netip.Addr, iv time.Duration) (*Mux, *Session, *recorder) {
	t.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	rec := &recorder{}
	var m *Mux
	var s *Session
	err := netns.Do(ns, func() (err error) {
		if m, err = Listen(local.Is4(), local.Is6(), log); err != nil {
			return err
		}
		s, err = m.Add(Config{Local: local, Peer: peer, Interval: iv, Multiplier: 3}, rec.add)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return m, s, rec
}

func waitState(t *testing.T, r *recorder, want string, within time.Duration) Status {
	t.Helper()
	var s Status
	testkit.WaitNil(t, within, "the session "+want, func() error {
		if s = r.last(); s.State != want {
			return fmt.Errorf("it is %s (changes %+v)", s.State, r.all())
		}
		return nil
	})
	return s
}

// Two of vigil's sessions, one in each namespace, of each family: they
// come up (through the Poll Sequence to the fast interval), one that goes
// silent is declared down by the other within the detection time, and one
// that stops says so (AdminDown), which the other takes for the neighbour
// going down.
func TestSessionsBetweenNamespaces(t *testing.T) {
	p := nstest.NewPair(t)
	for _, fam := range []struct{ name, a, b string }{{"IPv4", "192.0.2.1", "192.0.2.2"}, {"IPv6", "fd00:192::1", "fd00:192::2"}} {
		t.Run(fam.name, func(t *testing.T) {
			a, b := netip.MustParseAddr(fam.a), netip.MustParseAddr(fam.b)
			const iv = 50 * time.Millisecond
			_, sa, ra := startIn(t, p.A, a, b, iv)
			mb, sb, rb := startIn(t, p.B, b, a, iv)
			// Down -> (Init ->) Up takes a packet each way at the idle
			// interval (1 s) at most; a side that hears Init first goes
			// straight to Up.
			waitState(t, ra, "up", 5*time.Second)
			waitState(t, rb, "up", 5*time.Second)
			// Up for a while at the fast interval: no flap.
			changes := len(ra.all())
			testkit.Always(t, 20*iv, "both sessions up, A's unchanged", func() bool {
				return sa.Status().State == "up" && sb.Status().State == "up" && len(ra.all()) == changes
			})

			// B goes silent towards A (its send socket closed): A
			// declares it down within 3 x 50 ms and some.
			silent := time.Now()
			sb.conn.Close()
			st := waitState(t, ra, "down", 2*time.Second)
			took := time.Since(silent)
			if st.Diag != DiagDetectionExpired.String() {
				t.Fatalf("A went down with %q, want %q", st.Diag, DiagDetectionExpired)
			}
			t.Logf("A declared silent B down after %v (detection time %v)", took.Round(time.Millisecond), 3*iv)
			if took > time.Second {
				t.Fatalf("A took %v to see B silent; detection time is %v", took, 3*iv)
			}
			mb.Close()

			// B again, then stopped on purpose.
			mb, _, rb = startIn(t, p.B, b, a, iv)
			waitState(t, ra, "up", 5*time.Second)
			waitState(t, rb, "up", 5*time.Second)
			mb.Close()
			if st := waitState(t, ra, "down", 2*time.Second); st.Diag != DiagNeighborDown.String() {
				t.Fatalf("A went down with %q after B stopped, want %q", st.Diag, DiagNeighborDown)
			}
		})
	}
}
