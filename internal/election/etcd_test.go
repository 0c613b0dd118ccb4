package election

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/vigil-ha/vigil/internal/etcdcluster"
	"github.com/vigil-ha/vigil/internal/etcdtest"
	"github.com/vigil-ha/vigil/internal/testaddr"
	"github.com/vigil-ha/vigil/internal/testkit"
)

// tracker records leadership of every candidate and fails the test if two
// ever lead at once.
type tracker struct {
	t       *testing.T
	mu      sync.Mutex
	leading map[string]time.Time // candidate -> since
	starts  map[string][]time.Time
	stops   map[string][]time.Time
	reasons map[string][]string
	renews  map[string][]error // OnRenew's errors, nil for a success
	overlap atomic.Bool
}

func newTracker(t *testing.T) *tracker {
	return &tracker{t: t, leading: map[string]time.Time{}, starts: map[string][]time.Time{}, stops: map[string][]time.Time{}, reasons: map[string][]string{}, renews: map[string][]error{}}
}

func (tr *tracker) callbacks(name string) Callbacks {
	return Callbacks{
		OnStartedLeading: func(context.Context) {
			tr.mu.Lock()
			defer tr.mu.Unlock()
			if len(tr.leading) > 0 {
				tr.overlap.Store(true)
				tr.t.Errorf("%s started leading while %v lead", name, tr.leading)
			}
			now := time.Now()
			tr.leading[name] = now
			tr.starts[name] = append(tr.starts[name], now)
		},
		OnStoppedLeading: func(sd StepDown) {
			reason := sd.Detail
			tr.mu.Lock()
			defer tr.mu.Unlock()
			delete(tr.leading, name)
			tr.stops[name] = append(tr.stops[name], time.Now())
			tr.reasons[name] = append(tr.reasons[name], reason)
		},
		OnRenew: func(took time.Duration, err error) {
			tr.mu.Lock()
			defer tr.mu.Unlock()
			if took < 0 || took > time.Minute {
				tr.t.Errorf("%s: renewal took %v", name, took)
			}
			tr.renews[name] = append(tr.renews[name], err)
		},
	}
}

func (tr *tracker) leader() string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	for n := range tr.leading {
		return n
	}
	return ""
}

func (tr *tracker) waitLeader(t *testing.T, d time.Duration, not string) string {
	t.Helper()
	var l string
	testkit.WaitFor(t, d, fmt.Sprintf("a leader other than %q", not), func() bool {
		l = tr.leader()
		return l != "" && l != not
	})
	return l
}

// checkHandover waits for a new leader after holder was cut off from the
// store at cut, and fails the test unless holder stepped down first, within
// the renew deadline (plus slack).
func (tr *tracker) checkHandover(t *testing.T, round int, holder string, cut time.Time) {
	t.Helper()
	next := tr.waitLeader(t, 15*time.Second, holder)
	tr.mu.Lock()
	stops, starts := tr.stops[holder], tr.starts[next]
	tr.mu.Unlock()
	stopAt, startAt := stops[len(stops)-1], starts[len(starts)-1]
	if !stopAt.Before(startAt) {
		t.Fatalf("round %d: %s started leading at %v, before %s stepped down at %v", round, next, startAt.Sub(cut), holder, stopAt.Sub(cut))
	}
	if d := stopAt.Sub(cut); d > tRenew+tLease {
		t.Fatalf("round %d: %s stepped down %v after losing the store; renew deadline is %v", round, holder, d, tRenew)
	}
	t.Logf("round %d: %s cut at 0, stepped down at %v, %s took over at %v", round, holder, stopAt.Sub(cut), next, startAt.Sub(cut))
}

// cuttable wraps a lock; while cut, every call hangs until its context ends,
// as over a black-holed link.
type cuttable struct {
	*EtcdLock
	cut atomic.Bool
}

func (c *cuttable) Get(ctx context.Context) (Observation, error) {
	if c.cut.Load() {
		<-ctx.Done()
		return Observation{}, ctx.Err()
	}
	return c.EtcdLock.Get(ctx)
}

func (c *cuttable) Write(ctx context.Context, r Record, rev int64) (Observation, error) {
	if c.cut.Load() {
		<-ctx.Done()
		return Observation{}, ctx.Err()
	}
	return c.EtcdLock.Write(ctx, r, rev)
}

func (c *cuttable) Renew(ctx context.Context, r Record) (Observation, error) {
	if c.cut.Load() {
		<-ctx.Done()
		return Observation{}, ctx.Err()
	}
	return c.EtcdLock.Renew(ctx, r)
}

func (c *cuttable) StoreLeaderless(ctx context.Context) (bool, error) {
	if c.cut.Load() {
		<-ctx.Done()
		return false, ctx.Err()
	}
	return c.EtcdLock.StoreLeaderless(ctx)
}

type candidate struct {
	name   string
	lock   *cuttable
	el     *Elector
	cancel context.CancelFunc
	done   chan struct{}
}

func startCandidate(t *testing.T, name string, endpoints []string, tr *tracker, lease, renew, retry time.Duration, mods ...func(*Config)) *candidate {
	t.Helper()
	l, err := NewEtcdLock(EtcdConfig{Endpoints: endpoints, Key: "/test/leader"}, testkit.Log(t))
	if err != nil {
		t.Fatal(err)
	}
	c := &candidate{name: name, lock: &cuttable{EtcdLock: l}, done: make(chan struct{})}
	cfg := Config{
		Identity: name, Lock: c.lock, Prober: c.lock,
		LeaseDuration: lease, RenewDeadline: renew, RetryPeriod: retry,
		ReleaseOnCancel: true, Callbacks: tr.callbacks(name),
	}
	for _, m := range mods {
		m(&cfg)
	}
	c.el, err = New(cfg, testkit.Log(t).With("node", name))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	go func() {
		defer close(c.done)
		if err := c.el.Run(ctx); err != nil {
			t.Errorf("%s: Run: %v", name, err)
		}
	}()
	t.Cleanup(c.stop)
	return c
}

// stop cancels the candidate and waits for Run to return. Safe to call twice.
func (c *candidate) stop() {
	c.cancel()
	<-c.done
	c.lock.Close()
}

// withClient runs f with a client of endpoints and a 5 s context.
func withClient(t *testing.T, endpoints []string, f func(context.Context, *clientv3.Client)) {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	f(ctx, cli)
}

func readRecord(t *testing.T, endpoints []string) Record {
	t.Helper()
	var resp *clientv3.GetResponse
	var err error
	withClient(t, endpoints, func(ctx context.Context, cli *clientv3.Client) { resp, err = cli.Get(ctx, "/test/leader") })
	if err != nil || len(resp.Kvs) == 0 {
		t.Fatalf("read lock record: %v (%d keys)", err, len(resp.Kvs))
	}
	var r Record
	if err := json.Unmarshal(resp.Kvs[0].Value, &r); err != nil {
		t.Fatal(err)
	}
	return r
}

const (
	tLease = DefaultLeaseDuration
	tRenew = DefaultRenewDeadline
	tRetry = DefaultRetryPeriod
)

func TestAcquireRenewRelease(t *testing.T) {
	c := etcdtest.Start(t, 1)
	cl, err := etcdcluster.New(etcdcluster.Config{Endpoints: c.Endpoints}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	holder := func() string {
		t.Helper()
		h, err := EtcdHolder(testkit.Context(t, 10*time.Second), cl, "/test/leader")
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	if h := holder(); h != "" {
		t.Fatalf("EtcdHolder before any candidate = %q, want none", h)
	}
	tr := newTracker(t)
	a := startCandidate(t, "a", c.Endpoints, tr, tLease, tRenew, tRetry)
	tr.waitLeader(t, 10*time.Second, "")
	first := readRecord(t, c.Endpoints)
	if first.Holder != "a" {
		t.Fatalf("holder = %q, want a", first.Holder)
	}
	if h := holder(); h != "a" {
		t.Fatalf("EtcdHolder = %q, want a", h)
	}
	// Renewals keep changing the record while the holder stays.
	testkit.WaitFor(t, 5*time.Second, "a renewal", func() bool { return readRecord(t, c.Endpoints).Nonce != first.Nonce })
	// OnRenew runs once the renew loop has the answer, a moment after the
	// write is visible: a stop in between would leave it unreported (a
	// warm hack/test.sh run failed so).
	etcdtest.Retry(t, 5*time.Second, "OnRenew to report a renewal", func() error {
		tr.mu.Lock()
		defer tr.mu.Unlock()
		if len(tr.renews["a"]) == 0 {
			return errors.New("no renewal reported yet")
		}
		return nil
	})
	a.stop()
	if r := readRecord(t, c.Endpoints); r.Holder != "" {
		t.Fatalf("after a clean stop the holder is %q, want the lock released", r.Holder)
	}
	if h := holder(); h != "" {
		t.Fatalf("EtcdHolder of a released lock = %q, want none", h)
	}
	tr.mu.Lock()
	renews := tr.renews["a"]
	tr.mu.Unlock()
	if len(renews) == 0 || renews[0] != nil {
		t.Fatalf("OnRenew saw %v, want successful renewals", renews)
	}
	if n := len(tr.stops["a"]); n != 1 {
		t.Fatalf("OnStoppedLeading ran %d times, want 1", n)
	}
}

func TestReleaseHandsOverWithoutWaitingForTheLease(t *testing.T) {
	c := etcdtest.Start(t, 1)
	tr := newTracker(t)
	long := 10 * time.Second // so a takeover by expiry would be obvious
	cands := map[string]*candidate{
		"a": startCandidate(t, "a", c.Endpoints, tr, long, long-time.Second, tRetry),
		"b": startCandidate(t, "b", c.Endpoints, tr, long, long-time.Second, tRetry),
	}
	first := tr.waitLeader(t, 15*time.Second, "")
	stopped := time.Now()
	cands[first].stop()
	second := tr.waitLeader(t, 15*time.Second, first)
	if took := time.Since(stopped); took > long/2 {
		t.Fatalf("%s took over %v after %s released; the release did not work", second, took, first)
	}
}

// The holder loses etcd. Its peer must not take over before the holder
// has stepped down.
func TestCutOffHolderStepsDownBeforeTakeover(t *testing.T) {
	c := etcdtest.Start(t, 3)
	tr := newTracker(t)
	cands := map[string]*candidate{
		"a": startCandidate(t, "a", c.Endpoints, tr, tLease, tRenew, tRetry),
		"b": startCandidate(t, "b", c.Endpoints, tr, tLease, tRenew, tRetry),
	}
	for round := 0; round < 3; round++ {
		holder := tr.waitLeader(t, 15*time.Second, "")
		cut := time.Now()
		cands[holder].lock.cut.Store(true)
		tr.checkHandover(t, round, holder, cut)
		cands[holder].lock.cut.Store(false)
	}
	if tr.overlap.Load() {
		t.Fatal("two candidates led at once")
	}
}

// etcd loses its raft leader. Nobody can write until a new one is elected,
// so the holder keeps the lock and its peer does not take it. Also when
// every status answer is 150 ms late, as on a busy host (the chaos bench saw
// a holder step down when its probes were cut at 100 ms).
func TestHolderKeepsLockThroughEtcdLeaderElection(t *testing.T) {
	for _, tc := range []struct {
		name  string
		delay time.Duration
	}{{"prompt status", 0}, {"status 150ms late", 150 * time.Millisecond}} {
		t.Run(tc.name, func(t *testing.T) {
			c := etcdtest.Start(t, 3)
			tr := newTracker(t)
			slow := func(cfg *Config) { cfg.Prober = lateProber{cfg.Prober, tc.delay} }
			startCandidate(t, "a", c.Endpoints, tr, tLease, tRenew, tRetry, slow)
			holder := tr.waitLeader(t, 15*time.Second, "")
			b := startCandidate(t, "b", c.Endpoints, tr, tLease, tRenew, tRetry, slow)
			// b follows the record, and its voter list is cached before
			// a member dies.
			testkit.WaitFor(t, 10*time.Second, "b to see "+holder+" hold the lock", func() bool { return b.el.Status().Holder == holder })
			if _, err := b.lock.MemberList(testkit.Context(t, 10*time.Second)); err != nil {
				t.Fatal(err)
			}
			raftLeader := c.WaitLeader(5 * time.Second)
			t.Logf("killing etcd raft leader %s", c.Names[raftLeader])
			c.Kill(raftLeader)
			newLeader := c.WaitLeader(15 * time.Second)
			t.Logf("etcd elected %s", c.Names[newLeader])
			// The holder must renew through the new raft leader.
			testkit.Always(t, 2*tLease, holder+" leading through the etcd election", func() bool { return tr.leader() == holder })
			tr.mu.Lock()
			defer tr.mu.Unlock()
			if len(tr.stops[holder]) != 0 {
				t.Fatalf("%s stepped down during the etcd election: %v", holder, tr.reasons[holder])
			}
		})
	}
}

// lateProber answers each probe delay late (or not at all, if its context
// ends first), as a member whose host is busy.
type lateProber struct {
	Prober
	delay time.Duration
}

func (p lateProber) StoreLeaderless(ctx context.Context) (bool, error) {
	select {
	case <-time.After(p.delay):
	case <-ctx.Done():
		return false, ctx.Err()
	}
	return p.Prober.StoreLeaderless(ctx)
}

func TestForeignWriteMakesLeaderStepDown(t *testing.T) {
	c := etcdtest.Start(t, 1)
	tr := newTracker(t)
	startCandidate(t, "a", c.Endpoints, tr, tLease, tRenew, tRetry)
	tr.waitLeader(t, 10*time.Second, "")
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	b, _ := json.Marshal(Record{Holder: "intruder", LeaseDurationMillis: time.Hour.Milliseconds(), Nonce: "x"})
	if _, err := cli.Put(context.Background(), "/test/leader", string(b)); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 5*time.Second, "the leader to step down once somebody else took the lock", func() bool { return tr.leader() == "" })
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if want := `lock taken by "intruder"`; tr.reasons["a"][0] != want {
		t.Fatalf("reason = %q, want %q", tr.reasons["a"][0], want)
	}
}

// During kubeadm init etcd starts after vigil: the candidate waits, never
// leads meanwhile, and leads once etcd is up.
func TestEtcdStartsLater(t *testing.T) {
	cp, pp := testaddr.Port(t), testaddr.Port(t)
	ep := fmt.Sprintf("http://%s:%d", testaddr.Loopback(t), cp)
	tr := newTracker(t)
	startCandidate(t, "a", []string{ep}, tr, tLease, tRenew, tRetry)
	testkit.Always(t, 2*time.Second, "leaderless without etcd", func() bool { return tr.leader() == "" })
	cfg := etcdtest.Config(t, "late", cp, pp, fmt.Sprintf("late=http://%s:%d", testaddr.Loopback(t), pp))
	e, err := startEmbedded(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	tr.waitLeader(t, 15*time.Second, "")
}

// The endpoints given are a seed: the lock finds every member from one, and
// drops a member that was removed.
func TestEndpointsFollowMembership(t *testing.T) {
	c := etcdtest.Start(t, 3)
	l, err := NewEtcdLock(EtcdConfig{Endpoints: c.Endpoints[:1], Key: "/test/leader"}, testkit.Log(t))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := l.Get(ctx); err != nil {
		t.Fatal(err)
	}
	want := append([]string(nil), c.Endpoints...)
	sort.Strings(want)
	// The list is refreshed beside the operation, not in its way.
	testkit.WaitFor(t, 10*time.Second, "every member's endpoint from a one-member seed", func() bool {
		return slices.Equal(l.Endpoints(), want)
	})

	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints[:1]})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	id := uint64(c.Members[2].Server.MemberID())
	// etcd refuses removals until its members have been connected for a
	// few seconds ("unhealthy cluster"); retry until it accepts.
	testkit.WaitFor(t, 20*time.Second, "etcd to accept the member removal", func() bool {
		rctx, rcancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer rcancel()
		_, err := cli.MemberRemove(rctx, id)
		return err == nil
	})
	if _, err := l.Cluster().FreshMemberList(ctx); err != nil { // do not wait for the next refresh
		t.Fatal(err)
	}
	if _, err := l.Get(ctx); err != nil {
		t.Fatal(err)
	}
	if got := l.Endpoints(); slices.Contains(got, c.Endpoints[2]) || len(got) != 2 {
		t.Fatalf("endpoints after removing %s = %v", c.Endpoints[2], got)
	}
}

// TestYield covers health-aware placement: a leader that must yield hands the
// lock over at once; a yielding candidate stands by while a peer can lead,
// takes the lock when nobody else does, and then keeps it.
func TestYield(t *testing.T) {
	c := etcdtest.Start(t, 1)
	tr := newTracker(t)
	var aSick atomic.Bool
	const yieldFor = 2 * time.Second
	a := startCandidate(t, "a", c.Endpoints, tr, tLease, tRenew, tRetry, func(cfg *Config) {
		cfg.Yield = func() (string, bool) { return "local API server failing", aSick.Load() }
		cfg.YieldFor = yieldFor
	})
	if l := tr.waitLeader(t, 10*time.Second, ""); l != "a" {
		t.Fatalf("leader %s, want a", l)
	}
	b := startCandidate(t, "b", c.Endpoints, tr, tLease, tRenew, tRetry)

	sick := time.Now()
	aSick.Store(true)
	tr.waitLeader(t, 5*time.Second, "a")
	took := time.Since(sick)
	t.Logf("b leads %v after a had to yield", took)
	if took > tLease {
		// The release is watched by b: no lease wait.
		t.Errorf("handover took %v, more than a lease (%v): was the lock released?", took, tLease)
	}
	if r := tr.reasons["a"]; len(r) == 0 || r[len(r)-1] == "" {
		t.Fatalf("a's stop reasons: %v", r)
	}

	// b goes away; a, still sick, stands by for yieldFor and then leads.
	stopped := time.Now()
	b.stop()
	tr.waitLeader(t, yieldFor+5*time.Second, "b")
	if waited := time.Since(stopped); waited < yieldFor-100*time.Millisecond {
		t.Fatalf("a took the lock %v after b left, before its stand-by of %v", waited, yieldFor)
	}
	// ...and keeps it although still sick: no flapping.
	testkit.Always(t, 4*tLease, "a holding the tenure it took while yielding", func() bool { return tr.leader() == "a" })
	_ = a
}

// A second process with the holder's name never leads: it sees the holder
// renew under its name, and Run fails with ErrDuplicateIdentity. The holder
// is not disturbed.
func TestDuplicateIdentity(t *testing.T) {
	c := etcdtest.Start(t, 1)
	tr := newTracker(t)
	var deadlines atomic.Int64
	startCandidate(t, "a", c.Endpoints, tr, tLease, tRenew, tRetry, func(cfg *Config) {
		cfg.Callbacks.OnLease = func(d time.Time) {
			if time.Until(d) <= 0 || time.Until(d) > tRenew {
				t.Errorf("OnLease deadline %v from now, want within the renew deadline", time.Until(d))
			}
			deadlines.Add(1)
		}
	})
	if l := tr.waitLeader(t, 10*time.Second, ""); l != "a" {
		t.Fatalf("leader %s, want a", l)
	}
	first := readRecord(t, c.Endpoints)

	l, err := NewEtcdLock(EtcdConfig{Endpoints: c.Endpoints, Key: "/test/leader"}, testkit.Log(t))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	twinLed := atomic.Bool{}
	twin, err := New(Config{
		Identity: "a", Lock: l, LeaseDuration: tLease, RenewDeadline: tRenew, RetryPeriod: tRetry,
		Callbacks: Callbacks{OnStartedLeading: func(context.Context) { twinLed.Store(true) }},
	}, testkit.Log(t).With("node", "a-twin"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = twin.Run(ctx)
	if !errors.Is(err, ErrDuplicateIdentity) {
		t.Fatalf("twin Run = %v, want ErrDuplicateIdentity", err)
	}
	t.Logf("twin refused: %v", err)
	if !strings.Contains(err.Error(), first.Instance) {
		t.Errorf("the error does not name the other instance %s", first.Instance)
	}
	if twinLed.Load() {
		t.Fatal("the twin led")
	}
	if r := readRecord(t, c.Endpoints); r.Holder != "a" || r.Instance != first.Instance {
		t.Fatalf("record %+v after the twin; want a's first instance %s", r, first.Instance)
	}
	tr.mu.Lock()
	stops := len(tr.stops["a"])
	tr.mu.Unlock()
	if stops != 0 {
		t.Fatalf("the holder stepped down %d times", stops)
	}
	// The twin saw a renewal land in etcd; the holder's OnLease for it
	// runs once its write returns, which may be just after.
	testkit.WaitFor(t, 5*time.Second, "OnLease once per renewal (twice)", func() bool { return deadlines.Load() >= 2 })
}

// A record left by an earlier process of this node (another instance) is
// taken after it stood still for a lease, not at once.
func TestEarlierRunsRecordWaitsOneLease(t *testing.T) {
	c := etcdtest.Start(t, 1)
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints, DialTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	b, _ := json.Marshal(Record{Holder: "a", Instance: "host/pid-1/dead", LeaseDurationMillis: tLease.Milliseconds()})
	if _, err := cli.Put(context.Background(), "/test/leader", string(b)); err != nil {
		t.Fatal(err)
	}
	tr := newTracker(t)
	start := time.Now()
	startCandidate(t, "a", c.Endpoints, tr, tLease, tRenew, tRetry)
	tr.waitLeader(t, 10*time.Second, "")
	if took := time.Since(start); took < tLease-50*time.Millisecond {
		t.Fatalf("took the earlier instance's record after %v, before a lease (%v)", took, tLease)
	}
}

// A leader whose Eligible check fails steps down and releases the lock, so
// a peer takes over without waiting a lease; an ineligible candidate does
// not campaign.
func TestIneligibleLeaderReleases(t *testing.T) {
	c := etcdtest.Start(t, 1)
	tr := newTracker(t)
	long := 10 * time.Second
	var aDown atomic.Bool
	a := startCandidate(t, "a", c.Endpoints, tr, long, long-time.Second, tRetry, func(cfg *Config) {
		cfg.Eligible = func() error {
			if aDown.Load() {
				return errors.New("interface eth0 has no carrier")
			}
			return nil
		}
	})
	if l := tr.waitLeader(t, 10*time.Second, ""); l != "a" {
		t.Fatalf("leader %s, want a", l)
	}
	startCandidate(t, "b", c.Endpoints, tr, long, long-time.Second, tRetry)
	down := time.Now()
	aDown.Store(true)
	tr.waitLeader(t, 5*time.Second, "a")
	if took := time.Since(down); took > long/2 {
		t.Fatalf("b took over %v after a became ineligible; the lock was not released", took)
	}
	if r := tr.reasons["a"]; len(r) == 0 || !strings.Contains(r[len(r)-1], "no carrier") {
		t.Fatalf("a's stop reasons: %v", r)
	}
	// While b holds the lock, a's status says why a does not campaign,
	// and stops saying it once a could hold the VIP again.
	etcdtest.Retry(t, 5*time.Second, "a's status to say it is ineligible", func() error {
		if why := a.el.Status().Ineligible; !strings.Contains(why, "no carrier") {
			return fmt.Errorf("a's status: ineligible %q", why)
		}
		return nil
	})
	aDown.Store(false)
	etcdtest.Retry(t, 5*time.Second, "a's status to say it is eligible again", func() error {
		if why := a.el.Status().Ineligible; why != "" {
			return fmt.Errorf("a's status: ineligible %q", why)
		}
		return nil
	})
}

// The VIP holder's member hands raft leadership to a caught-up voter, and
// leaves it in place while a voter does not answer: a transfer then adds
// risk to a cluster that already has a fault.
func TestShedRaftLeadership(t *testing.T) {
	c := etcdtest.Start(t, 3)
	lead := c.WaitLeader(10 * time.Second)
	l, err := NewEtcdLock(EtcdConfig{Endpoints: c.Endpoints}, testkit.Log(t))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	if to, err := l.ShedRaftLeadership(ctx, c.Names[(lead+1)%3]); to != "" || err != nil {
		t.Fatalf("shed for a member that does not lead = %q, %v; want nothing to do", to, err)
	}
	var to string
	etcdtest.Retry(t, 10*time.Second, "move leadership off "+c.Names[lead], func() error {
		to, err = l.ShedRaftLeadership(ctx, c.Names[lead])
		if err == nil && to == "" {
			return errors.New("nothing moved")
		}
		return err
	})
	now := c.WaitLeader(5 * time.Second)
	if to == c.Names[lead] || c.Names[now] != to {
		t.Fatalf("moved from %s to %s; raft leader now %s", c.Names[lead], to, c.Names[now])
	}

	c.Kill(lead) // a follower now
	_, err = l.ShedRaftLeadership(ctx, c.Names[now])
	if !errors.Is(err, ErrShedDeferred) || !strings.Contains(err.Error(), c.Names[lead]+" does not answer") {
		t.Fatalf("shed with a voter down = %v; want it deferred, naming %s", err, c.Names[lead])
	}
	if c.Leader() != now {
		t.Fatalf("raft leadership moved to %d with a voter down", c.Leader())
	}
}
