package lab

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/vigil-ha/vigil/internal/nstest"
	"github.com/vigil-ha/vigil/internal/testkit"
)

// TestBGPLab runs the failover drills in the routed lab: the client reaches
// the VIP only through a router running BIRD 2, by the BGP host route the
// holder advertises. After every drill the router's forwarding entry must
// name the holder, and only the holder's route may be there, bar one
// from a node that died without withdrawing (which loses on MED). A router
// that goes away leaves no node holding the VIP; when it is back, one does.
func TestBGPLab(t *testing.T) {
	requireBIRD(t)
	l := newTestLab(t, "a 3-node routed lab")
	ctx := context.Background()
	// With BFD between the nodes and the router (the routed labs of
	// TestIPFamilyLabs run without it).
	if err := l.Up(ctx, Settings{Nodes: 3, Impl: ImplVigil, LBPort: APIServerPort, BackendPort: APIServerPort, Announce: AnnounceBGP, BGPBFD: true}); err != nil {
		t.Fatal(err)
	}
	// routedTo waits until the router forwards the VIP to the one node that
	// holds it, and (unless allowStale) holds no other node's route.
	routedTo := func(t *testing.T, allowStale bool, within time.Duration) string {
		t.Helper()
		var holder string
		testkit.WaitNilEvery(t, within, 50*time.Millisecond, "the router to forward the VIP to its one holder", func() error {
			st, err := l.Status(ctx)
			if err != nil {
				return err
			}
			stuck := fmt.Errorf("holders %v, router %+v", st.Holders, st.Router)
			if len(st.Holders) != 1 || st.Router == nil {
				return stuck
			}
			n, err := l.node(st.Holders[0])
			if err != nil {
				return err
			}
			ip := n.IP.String()
			if st.Router.NextHop != ip || !slices.Contains(st.Router.Learned, ip) {
				return stuck
			}
			if !allowStale && len(st.Router.Learned) != 1 {
				return stuck // a route from a node that no longer holds the VIP
			}
			holder = st.Holders[0]
			return nil
		})
		return holder
	}
	routedTo(t, false, 10*time.Second)
	for _, kind := range []string{DrillKillLeader, DrillGraceful, DrillKillDaemon, DrillPartitionLeader, DrillKillEtcdLeader} {
		t.Run(kind, func(t *testing.T) {
			r := mustDrill(ctx, t, l, kind) // the client is behind the router
			if kind == DrillKillEtcdLeader && r.After != r.Before {
				t.Fatalf("the death of etcd's raft leader moved the VIP from %s to %s", r.Before, r.After)
			}
			// A node killed or cut off without withdrawing would keep its
			// route at the router until the session's hold timer (9 s),
			// the holder's route winning on MED meanwhile; with BFD the
			// router drops it within 300 ms of the node's last packet,
			// well before the drill has even measured the failover.
			start := time.Now()
			routedTo(t, false, 3*time.Second)
			t.Logf("router forwards to the holder alone %v after the drill", time.Since(start).Round(time.Millisecond))
		})
	}
	// A frozen holder (SIGSTOP: its TCP connections stay open, no CEASE
	// goes out) loses its route at the router to BFD, within its
	// detection time, not the 9 s hold time.
	t.Run("bfd-frozen-holder", func(t *testing.T) {
		holder := routedTo(t, false, 10*time.Second)
		n, err := l.node(holder)
		if err != nil {
			t.Fatal(err)
		}
		frozen := time.Now()
		if err := l.signal(ctx, n, roleVigil, syscall.SIGSTOP, 0); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = l.signal(ctx, n, roleVigil, syscall.SIGCONT, 0) }()
		testkit.WaitNilEvery(t, 5*time.Second, 20*time.Millisecond, "the router to drop frozen "+holder+"'s route", func() error {
			r, err := l.VIPRoute(ctx)
			if err == nil && slices.Contains(r.Learned, n.IP.String()) {
				err = fmt.Errorf("it has %+v", r)
			}
			return err
		})
		took := time.Since(frozen)
		t.Logf("the router dropped frozen %s's route %v after the freeze (BFD %v x 3)", holder, took.Round(time.Millisecond), BFDInterval)
		if took > 2*time.Second {
			t.Fatalf("the router dropped frozen %s's route %v after the freeze; BFD should in about 300 ms", holder, took)
		}
		if err := l.signal(ctx, n, roleVigil, syscall.SIGCONT, 0); err != nil {
			t.Fatal(err)
		}
		routedTo(t, false, 10*time.Second)
	})
	t.Run("router-down", func(t *testing.T) {
		rt := l.routerNode()
		if err := l.signal(ctx, rt, roleBird, syscall.SIGTERM, 5*time.Second); err != nil {
			t.Fatal(err)
		}
		// Every session is down: no node may announce, so none holds.
		testkit.WaitNilEvery(t, 10*time.Second, 100*time.Millisecond, "no holder once the router went away", func() error {
			st, err := l.Status(ctx)
			if err == nil && len(st.Holders) != 0 {
				err = fmt.Errorf("%v hold the VIP", st.Holders)
			}
			return err
		})
		if err := l.startRouter(); err != nil {
			t.Fatal(err)
		}
		if err := l.waitRouterSessions(ctx, 30*time.Second); err != nil {
			t.Fatal(err)
		}
		routedTo(t, false, 10*time.Second)
	})
}

// requireBIRD skips (or fails, under hack/test.sh) without BIRD 2, which
// the routed labs run as their router.
func requireBIRD(t *testing.T) {
	t.Helper()
	for _, bin := range []string{"bird", "birdc"} {
		if _, err := exec.LookPath(bin); err != nil {
			nstest.Unavailable(t, "%s is not installed (apt-get install bird2)", bin)
		}
	}
}
