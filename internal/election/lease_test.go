package election

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/vigil-ha/vigil/internal/etcdtest"
	"github.com/vigil-ha/vigil/internal/kubetest"
	"github.com/vigil-ha/vigil/internal/netfault"
	"github.com/vigil-ha/vigil/internal/testaddr"
	"github.com/vigil-ha/vigil/internal/testkit"
)

const testLeaseName = "vigil-test"

// cutProxy forwards TCP to a kube-apiserver until cut; then it holds every
// connection, old and new, without forwarding a byte: a black-holed link.
type cutProxy struct {
	ln     net.Listener
	target string
	cut    atomic.Bool
	mu     sync.Mutex
	conns  []net.Conn
	wg     sync.WaitGroup
}

func newCutProxy(t *testing.T, target string) *cutProxy {
	return newCutProxyOn(t, testaddr.Loopback(t)+":0", target) // the serving certificate's address
}

// newCutProxyOn is newCutProxy listening on addr.
func newCutProxyOn(t *testing.T, addr, target string) *cutProxy {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, target: target}
	p.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.track(c)
			p.wg.Go(func() { p.serve(c) })
		}
	})
	t.Cleanup(p.close)
	return p
}

func (p *cutProxy) track(c net.Conn) {
	p.mu.Lock()
	p.conns = append(p.conns, c)
	p.mu.Unlock()
}

func (p *cutProxy) serve(c net.Conn) {
	if p.cut.Load() {
		_, _ = io.Copy(io.Discard, c) // hold it, say nothing
		return
	}
	s, err := net.Dial("tcp", p.target)
	if err != nil {
		c.Close()
		return
	}
	p.track(s)
	pipe := func(dst, src net.Conn) {
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if err != nil {
				dst.Close()
				return
			}
			for p.cut.Load() { // black hole: drop nothing, deliver nothing
				time.Sleep(10 * time.Millisecond)
				if isClosed(dst) {
					return
				}
			}
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
	}
	p.wg.Go(func() { pipe(s, c) })
	pipe(c, s)
}

func isClosed(c net.Conn) bool {
	return c.SetReadDeadline(time.Time{}) != nil
}

func (p *cutProxy) close() {
	p.ln.Close()
	p.cut.Store(false)
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *cutProxy) url() string { return "https://" + p.ln.Addr().String() }

type leaseCandidate struct {
	el     *Elector
	cancel context.CancelFunc
	done   chan struct{}
}

// startLeaseCandidate runs an elector on the test Lease through the API
// server at url.
func startLeaseCandidate(t *testing.T, s *kubetest.Server, url, name string, tr *tracker, mods ...func(*Config)) *leaseCandidate {
	t.Helper()
	rc := s.Config(kubetest.AdminToken)
	rc.Host = url
	rc.QPS, rc.Burst = 100, 200
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{
		Identity: name, Lock: NewLeaseLock(cs.CoordinationV1(), DefaultLeaseNamespace, testLeaseName),
		LeaseDuration: tLease, RenewDeadline: tRenew, RetryPeriod: tRetry,
		ReleaseOnCancel: true, Callbacks: tr.callbacks(name),
	}
	for _, m := range mods {
		m(&cfg)
	}
	el, err := New(cfg, testkit.Log(t).With("node", name))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &leaseCandidate{el: el, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(c.done)
		if err := el.Run(ctx); err != nil {
			t.Errorf("%s: Run: %v", name, err)
		}
	}()
	t.Cleanup(c.stop)
	return c
}

func (c *leaseCandidate) stop() { c.cancel(); <-c.done }

func readLease(t *testing.T, s *kubetest.Server) Observation {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	obs, err := NewLeaseLock(s.Client(t, kubetest.AdminToken).CoordinationV1(), DefaultLeaseNamespace, testLeaseName).Get(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return obs
}

// TestLease runs the Lease backend against a real kube-apiserver: acquire,
// renew, release, failover when the holder is cut off from the API server
// (it steps down before anyone takes over), and a user without RBAC.
func TestLease(t *testing.T) {
	s := kubetest.Start(t, etcdtest.Start(t, 1).Endpoints[0])
	s.WaitNamespace(t, DefaultLeaseNamespace)

	t.Run("acquire renew release", func(t *testing.T) {
		tr := newTracker(t)
		a := startLeaseCandidate(t, s, s.URL, "a", tr)
		tr.waitLeader(t, 10*time.Second, "")
		first := readLease(t, s)
		if first.Holder() != "a" || first.Record.LeaseDuration() != tLease {
			t.Fatalf("lease after acquire: %+v", first.Record)
		}
		// The object is a standard Lease: kubectl and client-go read it.
		lease, err := s.Client(t, kubetest.AdminToken).CoordinationV1().Leases(DefaultLeaseNamespace).Get(context.Background(), testLeaseName, metav1.GetOptions{})
		if err != nil || *lease.Spec.HolderIdentity != "a" || *lease.Spec.LeaseDurationSeconds != 1 || lease.Spec.RenewTime == nil {
			t.Fatalf("lease object: %+v, %v", lease, err)
		}
		testkit.WaitFor(t, 5*time.Second, "a renewal", func() bool { return readLease(t, s).Revision != first.Revision })
		a.stop()
		if h := readLease(t, s).Holder(); h != "" {
			t.Fatalf("after a clean stop the holder is %q, want the lease released", h)
		}
	})

	t.Run("cut-off holder steps down before takeover", func(t *testing.T) {
		tr := newTracker(t)
		pa, pb := newCutProxy(t, s.URL[len("https://"):]), newCutProxy(t, s.URL[len("https://"):])
		proxies := map[string]*cutProxy{"a": pa, "b": pb}
		startLeaseCandidate(t, s, pa.url(), "a", tr)
		startLeaseCandidate(t, s, pb.url(), "b", tr)
		for round := range 2 {
			holder := tr.waitLeader(t, 15*time.Second, "")
			cut := time.Now()
			proxies[holder].cut.Store(true)
			tr.checkHandover(t, round, holder, cut)
			proxies[holder].cut.Store(false)
		}
		if tr.overlap.Load() {
			t.Fatal("two candidates led at once")
		}
	})

	// The API server is down when the candidate starts (connections
	// refused): it retries, never leads meanwhile, and takes the lease once
	// the server answers. Losing nothing, it never exits.
	t.Run("API server down at start", func(t *testing.T) {
		tr := newTracker(t)
		addr := fmt.Sprintf("%s:%d", testaddr.Loopback(t), testaddr.Port(t))
		startLeaseCandidate(t, s, "https://"+addr, "late", tr)
		// Several failed reads, with backoff.
		testkit.Always(t, 2*time.Second, "leaderless while the API server is unreachable", func() bool { return tr.leader() == "" })
		newCutProxyOn(t, addr, s.URL[len("https://"):])
		tr.waitLeader(t, 10*time.Second, "")
	})

	// An API server whose every answer is late (its etcd slow) costs the
	// holder nothing: the renewals are pipelined. The timings are the
	// defaults doubled (slowTimings), as is the latency: 500 ms, which the
	// old 2-retry-period cut-off refused.
	t.Run("slow API server keeps the holder", func(t *testing.T) {
		tr := newTracker(t)
		var proxies []*netfault.Proxy
		var counters []*inFlightLock
		for _, name := range []string{"a", "b"} {
			ln, err := net.Listen("tcp", testaddr.Loopback(t)+":0") // the serving certificate's address
			if err != nil {
				t.Fatal(err)
			}
			p := netfault.NewProxy(ln, s.URL[len("https://"):], testkit.Log(t))
			t.Cleanup(func() { _ = p.Close() })
			proxies = append(proxies, p)
			startLeaseCandidate(t, s, "https://"+ln.Addr().String(), name, tr, slowTimings, func(c *Config) {
				cl := &inFlightLock{LeaseLock: c.Lock.(*LeaseLock)}
				counters = append(counters, cl)
				c.Lock = cl
			})
		}
		holder := tr.waitLeader(t, 10*time.Second, "")
		for _, p := range proxies {
			if err := p.Set(netfault.Delay{Latency: 2 * 250 * time.Millisecond}); err != nil {
				t.Fatal(err)
			}
		}
		testkit.Always(t, 5*time.Second, holder+" holding the Lease with every API answer 500ms late", func() bool { return tr.leader() == holder })
		tr.mu.Lock()
		starts, stops := len(tr.starts[holder]), len(tr.stops[holder])
		tr.mu.Unlock()
		if now := tr.leader(); now != holder || starts != 1 || stops != 0 {
			t.Fatalf("with every API answer 500ms late the Lease moved: holder %q (was %q), %d tenures, %d step-downs: %v", now, holder, starts, stops, tr.reasons)
		}
		// Patches of one Lease in flight together are retried by the API
		// server against each other: at most two at once.
		for _, c := range counters {
			if peak := c.peakInFlight(); peak > costlyInFlight {
				t.Fatalf("%d Lease renewals were under way at once, want at most %d", peak, costlyInFlight)
			}
		}
		if peak := counters[0].peakInFlight() + counters[1].peakInFlight(); peak < costlyInFlight {
			t.Fatalf("at 500ms per answer and a renewal every 200ms the holder never had two renewals under way (peak %d): the pipeline is not running", peak)
		}
	})

	// Renewals of one tenure may be under way together and land in any
	// order; none lands once another writer has taken the Lease.
	t.Run("renew compares the tenure", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		lock := NewLeaseLock(s.Client(t, kubetest.AdminToken).CoordinationV1(), DefaultLeaseNamespace, "tenure-test")
		rec := Record{Tenure: "t1", Holder: "a", Instance: "i1", LeaseDurationMillis: 800, RenewTime: time.Now().UTC()}
		got, err := lock.Write(ctx, rec, 0)
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		errs := make(chan error, 4)
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := rec
				r.RenewTime = time.Now().UTC()
				_, err := lock.Renew(ctx, r)
				errs <- err
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatalf("concurrent renewal of one tenure: %v", err)
			}
		}
		cur, err := lock.Get(ctx)
		if err != nil || cur.Record.Tenure != "t1" || cur.Revision == got.Revision {
			t.Fatalf("after the renewals: %+v, %v", cur, err)
		}
		other := Record{Tenure: "t2", Holder: "b", Instance: "i2", LeaseDurationMillis: 800}
		if _, err := lock.Write(ctx, other, cur.Revision); err != nil {
			t.Fatal(err)
		}
		obs, err := lock.Renew(ctx, rec)
		if !errors.Is(err, ErrConflict) || obs.Holder() != "b" {
			t.Fatalf("a renewal of a tenure that lost the Lease: %v, holder %q; want ErrConflict and b", err, obs.Holder())
		}
	})

	t.Run("forbidden", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := NewLeaseLock(s.Client(t, kubetest.NobodyToken).CoordinationV1(), DefaultLeaseNamespace, testLeaseName).Get(ctx)
		if !errors.Is(err, ErrForbidden) {
			t.Fatalf("err = %v, want ErrForbidden", err)
		}
	})
}

// inFlightLock is a LeaseLock that counts the renewals under way at once.
type inFlightLock struct {
	*LeaseLock
	mu        sync.Mutex
	now, peak int
}

func (l *inFlightLock) Renew(ctx context.Context, rec Record) (Observation, error) {
	l.mu.Lock()
	l.now++
	l.peak = max(l.peak, l.now)
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		l.now--
		l.mu.Unlock()
	}()
	return l.LeaseLock.Renew(ctx, rec)
}

func (l *inFlightLock) peakInFlight() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.peak
}
