package election

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// memLock is a lock record in memory, shared by the candidates of one
// test: each has its view (memView). A view that is cut hangs every
// operation until its context ends, as a leader cut off from its store
// sees it.
type memLock struct {
	mu  sync.Mutex
	obs Observation
	cut map[string]bool
}

type memView struct {
	l   *memLock
	who string
}

func (v memView) wait(ctx context.Context) error {
	v.l.mu.Lock()
	cut := v.l.cut[v.who]
	v.l.mu.Unlock()
	if cut {
		<-ctx.Done()
		return ctx.Err()
	}
	return nil
}

func (v memView) Get(ctx context.Context) (Observation, error) {
	if err := v.wait(ctx); err != nil {
		return Observation{}, err
	}
	v.l.mu.Lock()
	defer v.l.mu.Unlock()
	return v.l.obs, nil
}

func (v memView) Write(ctx context.Context, r Record, rev int64) (Observation, error) {
	if err := v.wait(ctx); err != nil {
		return Observation{}, err
	}
	v.l.mu.Lock()
	defer v.l.mu.Unlock()
	if rev != v.l.obs.Revision {
		return v.l.obs, ErrConflict
	}
	v.l.obs = Observation{Record: &r, Revision: v.l.obs.Revision + 1}
	return v.l.obs, nil
}

func (v memView) Describe() string { return "memory lock (" + v.who + ")" }

func (l *memLock) setCut(who string, on bool) {
	l.mu.Lock()
	l.cut[who] = on
	l.mu.Unlock()
}

// lateView is a view of a memLock whose every request reaches the store
// *lat late, as through a slow path to etcd: a write still takes effect
// when it arrives, however long ago its sender gave up on it. It renews as
// the etcd lock does (a Renewer: the tenure is compared, so renewals are
// pipelined).
type lateView struct {
	memView
	lat *atomic.Int64 // nanoseconds
}

// arrive waits for the request to reach the store.
func (v lateView) arrive() { time.Sleep(time.Duration(v.lat.Load())) }

func (v lateView) Get(ctx context.Context) (Observation, error) {
	v.arrive()
	obs, err := v.memView.Get(ctx)
	if err == nil {
		err = ctx.Err()
	}
	return obs, err
}

func (v lateView) Write(ctx context.Context, r Record, rev int64) (Observation, error) {
	v.arrive()
	obs, err := v.memView.Write(context.WithoutCancel(ctx), r, rev)
	if err == nil {
		err = ctx.Err()
	}
	return obs, err
}

func (v lateView) Renew(ctx context.Context, r Record) (Observation, error) {
	v.arrive()
	v.l.mu.Lock()
	defer v.l.mu.Unlock()
	if v.l.obs.Record == nil || v.l.obs.Record.Tenure != r.Tenure {
		return v.l.obs, ErrConflict
	}
	v.l.obs = Observation{Record: &r, Revision: v.l.obs.Revision + 1}
	return v.l.obs, ctx.Err()
}

// tenures records, in virtual time, each candidate's leases and tenures.
type tenures struct {
	mu       sync.Mutex
	deadline map[string]time.Time // the last OnLease deadline
	started  map[string]time.Time
	stopped  map[string]time.Time
	leading  string
	overlap  bool
}

func (tn *tenures) callbacks(who string) Callbacks {
	return Callbacks{
		OnLease: func(d time.Time) {
			tn.mu.Lock()
			tn.deadline[who] = d
			tn.mu.Unlock()
		},
		OnStartedLeading: func(context.Context) {
			tn.mu.Lock()
			defer tn.mu.Unlock()
			if tn.leading != "" {
				tn.overlap = true
			}
			tn.leading, tn.started[who] = who, time.Now()
		},
		OnStoppedLeading: func(StepDown) {
			tn.mu.Lock()
			defer tn.mu.Unlock()
			if tn.leading == who {
				tn.leading = ""
			}
			tn.stopped[who] = time.Now()
		},
	}
}

func (tn *tenures) get() (leading string, started, stopped, deadline map[string]time.Time) {
	tn.mu.Lock()
	defer tn.mu.Unlock()
	cp := func(m map[string]time.Time) map[string]time.Time {
		out := map[string]time.Time{}
		for k, v := range m {
			out[k] = v
		}
		return out
	}
	return tn.leading, cp(tn.started), cp(tn.stopped), cp(tn.deadline)
}

// In virtual time: a leader cut off from its store steps down exactly at
// the deadline of its last answered renewal (RenewDeadline after that
// renewal began), and its peer takes the lock only once the record has
// stood still for a whole LeaseDuration on the peer's own clock: never
// while the cut-off leader may still hold the VIP.
func TestCutOffLeaderStepsDownAtItsDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := &memLock{cut: map[string]bool{}}
		tn := &tenures{deadline: map[string]time.Time{}, started: map[string]time.Time{}, stopped: map[string]time.Time{}}
		log := slog.New(slog.DiscardHandler)
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		defer func() { cancel(); wg.Wait() }()
		start := func(who string) {
			el, err := New(Config{Identity: who, Lock: memView{l, who},
				LeaseDuration: DefaultLeaseDuration, RenewDeadline: DefaultRenewDeadline, RetryPeriod: DefaultRetryPeriod,
				ReleaseOnCancel: true, Callbacks: tn.callbacks(who)}, log)
			if err != nil {
				t.Fatal(err)
			}
			wg.Go(func() { _ = el.Run(ctx) })
		}
		start("a")
		synctest.Wait()
		if leading, _, _, _ := tn.get(); leading != "a" {
			t.Fatalf("leading %q, want a (the lock was free)", leading)
		}
		start("b")
		time.Sleep(10 * DefaultLeaseDuration) // many renewals; b stands by
		if leading, _, _, _ := tn.get(); leading != "a" {
			t.Fatalf("leading %q after 10 leases, want a", leading)
		}

		cut := time.Now()
		l.setCut("a", true)
		time.Sleep(3 * DefaultLeaseDuration)
		leading, started, stopped, deadline := tn.get()
		if leading != "b" {
			t.Fatalf("leading %q after the cut, want b", leading)
		}
		if !stopped["a"].Equal(deadline["a"]) {
			t.Errorf("a stepped down %v after its lease deadline (want exactly at it)", stopped["a"].Sub(deadline["a"]))
		}
		if d := deadline["a"].Sub(cut); d <= 0 || d > DefaultRenewDeadline {
			t.Errorf("a's last deadline %v after the cut, want within the renew deadline (%v)", d, DefaultRenewDeadline)
		}
		if gap, min := started["b"].Sub(stopped["a"]), DefaultLeaseDuration-DefaultRenewDeadline; gap < min {
			t.Errorf("b took the lock %v after a stepped down, want at least %v", gap, min)
		}
		if tn.overlap {
			t.Error("two candidates led at once")
		}
		t.Logf("a stepped down %v after the cut; b took over %v after that", stopped["a"].Sub(cut), started["b"].Sub(stopped["a"]))
	})
}

// In virtual time: a holder whose store answers it alone too late for the
// lease (its requests arrive late, and its writes land however late) steps
// down and stands aside, and its peer, whose store answers at once, takes
// the lock a lease after the holder's last write landed, and keeps it. Before, the slow node took
// its own record back at once, its late writes kept the lease fresh in its
// peer's eyes, and nobody held the lock for as long as the slowness lasted.
func TestSlowHolderStandsAsideForAPeer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := &memLock{cut: map[string]bool{}}
		tn := &tenures{deadline: map[string]time.Time{}, started: map[string]time.Time{}, stopped: map[string]time.Time{}}
		log := slog.New(slog.NewTextHandler(t.Output(), nil))
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		defer func() { cancel(); wg.Wait() }()
		lat := map[string]*atomic.Int64{}
		for _, who := range []string{"a", "b"} {
			lat[who] = new(atomic.Int64)
			el, err := New(Config{Identity: who, Lock: lateView{memView{l, who}, lat[who]},
				LeaseDuration: DefaultLeaseDuration, RenewDeadline: DefaultRenewDeadline, RetryPeriod: DefaultRetryPeriod,
				ReleaseOnCancel: true, Callbacks: tn.callbacks(who)}, log.With("node", who))
			if err != nil {
				t.Fatal(err)
			}
			wg.Go(func() { _ = el.Run(ctx) })
			synctest.Wait()
		}
		time.Sleep(5 * DefaultLeaseDuration)
		if leading, _, _, _ := tn.get(); leading != "a" {
			t.Fatalf("leading %q, want a (it started first)", leading)
		}

		late := DefaultRenewDeadline - 10*time.Millisecond
		slow := time.Now()
		lat["a"].Store(int64(late))
		time.Sleep(20 * DefaultLeaseDuration)
		leading, started, stopped, _ := tn.get()
		if leading != "b" {
			t.Fatalf("leading %q 16 s after a's requests began to reach the store %v late, want b", leading, late)
		}
		// a steps down within a renew deadline and a latency, its last
		// writes arrive one latency later, and b waits a lease from there.
		if d, most := started["b"].Sub(slow), DefaultRenewDeadline+3*late+DefaultLeaseDuration+2*DefaultRetryPeriod; d > most {
			t.Errorf("b took the lock %v after a's store turned slow, want within %v", d, most)
		}
		if stopped["b"].After(started["b"]) {
			t.Errorf("b lost the lock again at %v", stopped["b"].Sub(slow))
		}
		if tn.overlap {
			t.Error("two candidates led at once")
		}
		t.Logf("a stepped down %v after its store turned slow; b took over %v after that", stopped["a"].Sub(slow), started["b"].Sub(stopped["a"]))
	})
}

// macOf is a MAC that the test changes.
type macOf struct {
	mu  sync.Mutex
	mac string
}

func (m *macOf) MAC() string  { m.mu.Lock(); defer m.mu.Unlock(); return m.mac }
func (m *macOf) set(s string) { m.mu.Lock(); m.mac = s; m.mu.Unlock() }

// The record carries the MAC of the moment: one that changes while this
// node leads reaches the record with the next renewal.
func TestRecordFollowsTheMAC(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := &memLock{cut: map[string]bool{}}
		mac := &macOf{mac: "02:00:00:00:00:01"}
		ctx, cancel := context.WithCancel(context.Background())
		el, err := New(Config{Identity: "a", Lock: memView{l, "a"}, MAC: mac,
			LeaseDuration: DefaultLeaseDuration, RenewDeadline: DefaultRenewDeadline, RetryPeriod: DefaultRetryPeriod}, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- el.Run(ctx) }()
		defer func() { cancel(); <-done }()
		recorded := func() string {
			o, _ := memView{l, "test"}.Get(context.Background())
			if o.Record == nil {
				return ""
			}
			return o.Record.MAC
		}
		synctest.Wait()
		if got := recorded(); got != "02:00:00:00:00:01" {
			t.Fatalf("record's MAC %q at the take-over", got)
		}
		mac.set("02:00:00:00:00:02")
		time.Sleep(2 * DefaultRetryPeriod)
		if got := recorded(); got != "02:00:00:00:00:02" {
			t.Fatalf("record's MAC %q two retry periods after it changed", got)
		}
	})
}
