package lab

import (
	"context"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestECMPLab runs the routed lab with --bgp-mode ecmp: every node
// advertises the VIP and the router (BIRD, merge paths) spreads flows. A
// node whose API server fails its checks withdraws its route and comes
// back when it passes again; a node that loses power is withdrawn by BFD,
// survivor flows keep flowing on their nodes (the router hashes
// resiliently, so none is moved either), and new connections fail only
// briefly (ecmp-node-killed).
func TestECMPLab(t *testing.T) {
	requireBIRD(t)
	l := newTestLab(t, "a 3-node routed lab in ECMP mode")
	ctx := context.Background()
	s := Settings{Nodes: 3, Impl: ImplVigil, LBPort: APIServerPort, BackendPort: APIServerPort, Announce: AnnounceBGP, BGPBFD: true, BGPMode: BGPModeECMP}
	if err := l.Up(ctx, s); err != nil {
		t.Fatal(err)
	}
	if got := DrillsFor(s); !slices.Equal(got, []string{DrillECMPNodeKilled}) {
		t.Fatalf("drills for an ECMP lab: %v", got)
	}
	if r := l.Drill(ctx, DrillKillLeader, 1); r.Error == "" {
		t.Fatalf("%s ran in an ECMP lab, which has no single holder", DrillKillLeader)
	}
	all := l.nodeIPs()
	// The router forwards through a resilient group holding every node
	// (fib.go), not BIRD's plain multipath route.
	if _, err := l.waitNextHops(ctx, all, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if out, err := ipOut(ctx, "-n", nodeNS(routerName), "nexthop", "show", "id", strconv.Itoa(fibGroupID)); err != nil || !strings.Contains(out, "type resilient") || strings.Count(out, "/") != len(all)-1 {
		t.Fatalf("the router's next-hop group: %q (%v); want a resilient group of %d", out, err, len(all))
	}

	t.Run("apiserver-unready-withdraws", func(t *testing.T) {
		n := l.st.Nodes[1]
		if err := l.SetAPIServerMode(ctx, n.Name, ModeUnready); err != nil {
			t.Fatal(err)
		}
		failed := time.Now()
		rest := slices.DeleteFunc(slices.Clone(all), func(ip string) bool { return ip == n.IP.String() })
		// The checks take it out within interval x fall plus a timeout
		// (under 2 s), and the route goes at once: 10 s is generous.
		if _, err := l.waitNextHops(ctx, rest, 10*time.Second); err != nil {
			t.Fatalf("%s's API server fails its checks: %v", n.Name, err)
		}
		t.Logf("%s withdrawn %v after its API server began failing /readyz", n.Name, time.Since(failed).Round(time.Millisecond))
		rep, err := l.vigilStatus(ctx, n.Name)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s's vigil: %+v", n.Name, rep)
		if err := l.SetAPIServerMode(ctx, n.Name, ModeOK); err != nil {
			t.Fatal(err)
		}
		if _, err := l.waitNextHops(ctx, all, 10*time.Second); err != nil {
			t.Fatalf("%s's API server passes again: %v", n.Name, err)
		}
	})
	t.Run(DrillECMPNodeKilled, func(t *testing.T) {
		t.Cleanup(func() {
			if t.Failed() {
				logNodeLogs(t, l, 40)
				logTail(t, filepath.Join(l.nodeDir(l.routerNode()), roleRouterFIB+".log"), "the router's router-fib.log", 20)
			}
		})
		r := l.Drill(ctx, DrillECMPNodeKilled, 1)
		t.Log(r)
		if !r.OK() || r.ECMP == nil {
			t.Fatalf("drill failed: %s", r)
		}
		// BFD at 100 ms x 3 drops the node in about 300 ms.
		if e := r.ECMP; e.WithdrawnMillis > 2000 {
			t.Fatalf("the router dropped the dead node after %.0fms; BFD should in about 300 ms", e.WithdrawnMillis)
		}
	})
}
