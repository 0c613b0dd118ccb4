package daemon

import (
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/vigil-ha/vigil/internal/etcdcluster"
	"github.com/vigil-ha/vigil/internal/health"
)

type fakeChecker struct{ c *calls }

func (f fakeChecker) Set(b []string) { f.c.add(fmt.Sprintf("checker.set %v", b)) }
func (f fakeChecker) DialFailed(b string, err error) {
	f.c.add(fmt.Sprintf("checker.dialFailed %s: %v", b, err))
}

type fakeBalancer struct{ c *calls }

func (f fakeBalancer) Update(st health.Status) {
	f.c.add(fmt.Sprintf("bal.update %s %v", st.Backend, st.State))
}
func (f fakeBalancer) SetBackends(b []string) { f.c.add(fmt.Sprintf("bal.set %v", b)) }
func (f fakeBalancer) setBackends(b []string) { f.c.add(fmt.Sprintf("port.set %v", b)) }
func (f fakeBalancer) Kick()                  { f.c.add("ecmp.kick") }
func (f fakeBalancer) changed()               { f.c.add("feed.changed") }
func (f fakeBalancer) PublishedChanged()      { f.c.add("disc.published") }
func (f fakeBalancer) again()                 { f.c.add("announce.again") }

// Every part that follows the API servers hears what it must, through the
// wiring: discovery's set reaches the checker, every port and the feed; a
// health verdict reaches the first port's balancer, ECMP and the feed; a
// failed dial reaches the checker.
func TestWiringReachesEveryPart(t *testing.T) {
	c := &calls{}
	f := fakeBalancer{c}
	w := &apiWiring{checker: fakeChecker{c}, bal: f, more: []portBackends{f}, ecmp: f, feed: f, disc: f}
	w.backendsChanged([]string{"10.0.0.1:6443"})
	wantCalls(t, "backends", c.take(), "bal.set [10.0.0.1:6443]", "checker.set [10.0.0.1:6443]", "port.set [10.0.0.1:6443]", "feed.changed")
	w.healthChanged(health.Status{Backend: "10.0.0.1:6443", State: health.Down})
	wantCalls(t, "health", c.take(), "bal.update 10.0.0.1:6443 down", "ecmp.kick", "feed.changed")
	w.dialFailed("10.0.0.1:6443", errors.New("refused"))
	wantCalls(t, "dial", c.take(), "checker.dialFailed 10.0.0.1:6443: refused")
	w.publishedChanged(nil)
	wantCalls(t, "published", c.take(), "disc.published")

	// The least a node has: a checker (no balancer, ports, ECMP, feed
	// or discovery to tell).
	w = &apiWiring{checker: fakeChecker{c}}
	w.backendsChanged([]string{"10.0.0.2:6443"})
	w.healthChanged(health.Status{Backend: "10.0.0.2:6443", State: health.Up})
	w.publishedChanged(nil)
	wantCalls(t, "checker only", c.take(), "checker.set [10.0.0.2:6443]")
}

// What the parts report becomes metrics (and Events, with a client): a
// stray VIP, a restored one (announced again, where ARP/NDP announces), an
// impostor etcd before the client knows its own cluster, a new holder, a
// lease at risk.
func TestNoticesCountWhatTheyHear(t *testing.T) {
	c := &calls{}
	var changed atomic.Int64
	x := &notices{node: "n1", vip: "10.0.0.100/24", iface: "eth0", m: newNodeMetrics(), holderChanged: &changed}
	x.strayVIP()
	x.restoredVIP() // no announcer (BGP): counted only
	x.reannounce = fakeBalancer{c}
	x.restoredVIP()
	wantCalls(t, "restored", c.take(), "announce.again")
	x.foreignEtcd(etcdcluster.Foreign{Endpoint: "https://10.0.0.9:2379", ClusterID: 0xbad}) // x.etcd nil: etcdcluster.New still runs
	x.newLeader("n2")
	x.atRisk("renewals answered with 80ms of the lease left")
	for name, got := range map[string]float64{
		"strays":      testutil.ToFloat64(x.m.strays),
		"restored":    testutil.ToFloat64(x.m.restored) / 2,
		"foreign":     testutil.ToFloat64(x.m.foreign),
		"transitions": testutil.ToFloat64(x.m.transitions),
		"atRisk":      testutil.ToFloat64(x.m.atRisk),
	} {
		if got != 1 {
			t.Errorf("%s = %v, want 1", name, got)
		}
	}
	if changed.Load() == 0 {
		t.Error("the holder's change time was not set")
	}
	x.atRisk("")
	if v := testutil.ToFloat64(x.m.atRisk); v != 0 {
		t.Errorf("at risk = %v after it ended", v)
	}
}
