package election

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/vigil-ha/vigil/internal/etcdtest"
	"github.com/vigil-ha/vigil/internal/netfault"
	"github.com/vigil-ha/vigil/internal/testkit"
)

// slowStore is a 3-member embedded etcd whose members advertise a delay
// proxy each: every answer any candidate gets is late by what set says,
// while raft runs at full speed.
type slowStore struct {
	c       *etcdtest.Cluster
	proxies []*netfault.Proxy
}

func startSlowStore(t *testing.T) *slowStore {
	t.Helper()
	s := &slowStore{}
	s.c = etcdtest.StartAdvertising(t, 3, func(i int, listen string) string {
		host, _, _ := strings.Cut(listen, ":")
		ln, err := net.Listen("tcp", host+":0")
		if err != nil {
			t.Fatal(err)
		}
		p := netfault.NewProxy(ln, listen, testkit.Log(t))
		t.Cleanup(func() { _ = p.Close() })
		s.proxies = append(s.proxies, p)
		return "http://" + ln.Addr().String()
	})
	return s
}

func (s *slowStore) set(t *testing.T, d time.Duration) {
	t.Helper()
	for _, p := range s.proxies {
		if err := p.Set(netfault.Delay{Latency: d}); err != nil {
			t.Fatal(err)
		}
	}
}

// slowTimings doubles the default timings (1.6 s lease, 1 s renew
// deadline, 200 ms retry) for the slow-store tests, and their latencies
// with them: the rules only depend on the ratios, and the wider absolute
// margins keep the tests steady under the race detector beside other
// packages. bench/gray measures the defaults on a quiet machine.
func slowTimings(c *Config) {
	c.LeaseDuration, c.RenewDeadline, c.RetryPeriod = 2*tLease, 2*tRenew, 2*tRetry
}

// TestSlowStoreKeepsTheHolder, with the default timings doubled: a store
// whose every answer is 400 ms late (200 ms at the defaults) must not move
// the lock: the holder's renewals are pipelined and may take until the
// deadline they set. Before, every operation was cut off after two retry
// periods, and at that latency no node could hold the lock at all. When the
// store gets too slow for the lease (1.4 s) the holder steps down and
// nobody leads; at 560 ms, within the lease again but more than half the
// renew deadline, a holder is back within seconds and keeps the lock.
func TestSlowStoreKeepsTheHolder(t *testing.T) {
	s := startSlowStore(t)
	tr := newTracker(t)
	var cands []*candidate
	for i := range 3 {
		cands = append(cands, startCandidate(t, fmt.Sprintf("n%d", i+1), s.c.Endpoints, tr, 2*tLease, 2*tRenew, 2*tRetry))
	}
	holder := tr.waitLeader(t, 10*time.Second, "")
	// Wait until every candidate follows the advertised (proxied) URLs.
	for _, c := range cands {
		testkit.WaitFor(t, 10*time.Second, c.name+" follows the proxies", func() bool {
			eps := c.lock.Endpoints()
			return len(eps) == 3 && strings.Contains(strings.Join(eps, ","), s.proxies[0].Addr().String())
		})
	}
	tr.mu.Lock()
	startsBefore := len(tr.starts[holder])
	tr.mu.Unlock()

	s.set(t, 2*200*time.Millisecond)
	testkit.Always(t, 6*time.Second, holder+" holding with every answer 400ms late", func() bool { return tr.leader() == holder })
	now := tr.leader()
	tr.mu.Lock()
	starts, stops := len(tr.starts[holder]), len(tr.stops[holder])
	tr.mu.Unlock()
	if now != holder || starts != startsBefore || stops != 0 {
		t.Fatalf("with every answer 400ms late the lock moved: holder %q (was %q), %d tenures, %d step-downs: %v", now, holder, starts, stops, tr.reasons)
	}
	var held *candidate
	for _, c := range cands {
		if c.name == holder {
			held = c
		}
	}
	st := held.el.Status()
	t.Logf("at 400ms: renewal latency %v, margin %v, least margin %v, at risk %q", st.RenewLatency, st.RenewMargin, st.RenewMarginMin, st.AtRisk)
	if st.RenewLatency < 2*200*time.Millisecond || st.RenewMargin <= 0 || st.RenewMargin > 2*tRenew-2*200*time.Millisecond {
		t.Errorf("status does not show the slow renewals: latency %v, margin %v", st.RenewLatency, st.RenewMargin)
	}

	// Too slow for the lease: the holder must go, and nobody may lead
	// while no renewal can land in time.
	s.set(t, 2*700*time.Millisecond)
	testkit.WaitFor(t, 10*time.Second, holder+" steps down", func() bool { return tr.leader() == "" })
	testkit.Always(t, 4*time.Second, "leaderless while every answer takes 1400ms, more than the renew deadline", func() bool { return tr.leader() == "" })
	// Slow, but within what the lease carries (560 ms): a new holder must
	// take the lock and keep it. Its first renewals go out while its
	// takeover is still under way; sent after it, they would come too late
	// (560 + 560 ms > the 1 s renew deadline) and the lock would flap.
	back := time.Now()
	s.set(t, 2*280*time.Millisecond)
	next := tr.waitLeader(t, 10*time.Second, "")
	t.Logf("store at 560ms again: %s leads after %v", next, time.Since(back).Round(time.Millisecond))
	if d := time.Since(back); d > 5*time.Second {
		t.Errorf("the lock came back %v after the store was within the lease again; want a few seconds at most", d)
	}
	tr.mu.Lock()
	tenures := len(tr.starts[next])
	tr.mu.Unlock()
	testkit.Always(t, 6*time.Second, next+" holding at 560ms", func() bool { return tr.leader() == next })
	tr.mu.Lock()
	again := len(tr.starts[next])
	tr.mu.Unlock()
	if l := tr.leader(); l != next || again != tenures {
		t.Errorf("at 560ms the new holder %s did not keep the lock: leader now %q, tenures %d -> %d: %v", next, l, tenures, again, tr.reasons[next])
	}
	s.set(t, 0)
	if tr.overlap.Load() {
		t.Fatal("two candidates led at once")
	}
}
