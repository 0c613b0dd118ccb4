package lab

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/vigil-ha/vigil/internal/testkit"
)

// TestIPFamilyLabs runs the failover drills in an IPv6-only lab, a
// dual-stack lab and a routed dual-stack lab. The client probes every VIP
// address; each drill must report every family, both families must end on
// the same new holder, and in dual-stack they must switch together (the
// goal is 50 ms apart; the bound here is generous, bench/failover records
// the figures).
func TestIPFamilyLabs(t *testing.T) {
	cases := []struct {
		name     string
		settings Settings
		families []string
	}{
		{"ipv6", Settings{IPFamily: IPv6}, []string{IPv6}},
		{"dual", Settings{IPFamily: Dual}, []string{IPv4, IPv6}},
		{"dual-bgp", Settings{IPFamily: Dual, Announce: AnnounceBGP}, []string{IPv4, IPv6}},
		{"ipv6-bgp", Settings{IPFamily: IPv6, Announce: AnnounceBGP}, []string{IPv6}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.settings.bgp() {
				requireBIRD(t)
			}
			l := newTestLab(t, "a 3-node "+c.name+" lab")
			ctx := context.Background()
			s := c.settings
			s.Nodes, s.Impl, s.LBPort, s.BackendPort = 3, ImplVigil, APIServerPort, APIServerPort
			if err := l.Up(ctx, s); err != nil {
				t.Fatal(err)
			}
			st, err := l.Status(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(st.Holders) != 1 || strings.Count(st.VIP, ",") != len(c.families)-1 {
				t.Fatalf("status: VIP %s on %v; want %d addresses on one node", st.VIP, st.Holders, len(c.families))
			}
			if s.bgp() {
				// The router forwards the VIP's first address to the
				// holder's address of that family.
				n, err := l.node(st.Holders[0])
				if err != nil {
					t.Fatal(err)
				}
				want := n.IP
				if !s.has4() {
					want = nodeIP6(n.Index)
				}
				testkit.WaitNilEvery(t, 10*time.Second, 100*time.Millisecond, fmt.Sprintf("the router to forward the VIP to %s (%s)", want, n.Name), func() error {
					if st.Router != nil && st.Router.NextHop == want.String() {
						return nil
					}
					stuck := fmt.Errorf("router: %+v", st.Router)
					var err error
					if st, err = l.Status(ctx); err != nil {
						t.Fatal(err)
					}
					return stuck
				})
			}
			for _, kind := range []string{DrillKillLeader, DrillGraceful, DrillPartitionLeader, DrillKillDaemon, DrillKillEtcdLeader} {
				t.Run(kind, func(t *testing.T) {
					r := mustDrill(ctx, t, l, kind)
					if len(r.Families) != len(c.families) {
						t.Fatalf("families %+v, want %v", r.Families, c.families)
					}
					for i, f := range r.Families {
						if f.Family != c.families[i] || f.After != r.After {
							t.Errorf("%s: %s answered by %s; want %s answered by %s", f.VIP, f.Family, f.After, c.families[i], r.After)
						}
					}
					if kind == DrillKillEtcdLeader && r.After != r.Before {
						t.Errorf("the death of etcd's raft leader moved the VIP from %s to %s", r.Before, r.After)
					}
					if len(r.Families) > 1 && r.SkewMillis > 200 {
						t.Errorf("the families switched %.0fms apart; one election moves both", r.SkewMillis)
					}
				})
			}
		})
	}
}
