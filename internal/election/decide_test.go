package election

import (
	"errors"
	"testing"
	"time"

	"github.com/vigil-ha/vigil/internal/validate"
)

func rec(holder string, lease time.Duration) *Record {
	return &Record{Holder: holder, LeaseDurationMillis: lease.Milliseconds()}
}

func TestAcquirable(t *testing.T) {
	t0 := time.Unix(1000, 0)
	lease := 800 * time.Millisecond
	seen := window{valid: true, rev: 7, term: 2, since: t0}
	tests := []struct {
		name     string
		obs      Observation
		w        window
		now      time.Time
		want     bool
		wantWait time.Duration
	}{
		{"absent key", Observation{}, window{}, t0, true, 0},
		{"released", Observation{Record: rec("", time.Millisecond), Revision: 7}, seen, t0, true, 0},
		{"own record from an earlier run", Observation{Record: rec("me", lease), Revision: 7}, seen, t0, true, 0},
		{"fresh record", Observation{Record: rec("other", lease), Revision: 7}, seen, t0.Add(100 * time.Millisecond), false, 700 * time.Millisecond},
		{"just before expiry", Observation{Record: rec("other", lease), Revision: 7}, seen, t0.Add(lease - time.Millisecond), false, time.Millisecond},
		{"expired", Observation{Record: rec("other", lease), Revision: 7}, seen, t0.Add(lease), true, 0},
		{"window for another revision", Observation{Record: rec("other", lease), Revision: 8}, seen, t0.Add(time.Hour), false, lease},
		{"no window yet", Observation{Record: rec("other", lease), Revision: 7}, window{}, t0.Add(time.Hour), false, lease},
		{"own record, this process", Observation{Record: &Record{Holder: "me", Instance: "me-1", LeaseDurationMillis: 800}, Revision: 7}, seen, t0, true, 0},
		{"own name, another process: wait for a lease", Observation{Record: &Record{Holder: "me", Instance: "me-2", LeaseDurationMillis: 800}, Revision: 7}, seen, t0.Add(100 * time.Millisecond), false, 700 * time.Millisecond},
		{"own name, another process, unchanged for a lease", Observation{Record: &Record{Holder: "me", Instance: "me-2", LeaseDurationMillis: 800}, Revision: 7}, seen, t0.Add(lease), true, 0},
		{"record's own lease counts", Observation{Record: rec("other", 2*time.Second), Revision: 7}, seen, t0.Add(lease), false, 2*time.Second - lease},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, wait := acquirable(tc.obs, tc.w, "me", "me-1", tc.now)
			if got != tc.want || wait != tc.wantWait {
				t.Fatalf("acquirable = %v, %v; want %v, %v", got, wait, tc.want, tc.wantWait)
			}
		})
	}
}

func TestTwinRenewed(t *testing.T) {
	twin := func(rev int64, inst string) Observation {
		return Observation{Record: &Record{Holder: "me", Instance: inst}, Revision: rev}
	}
	tests := []struct {
		name      string
		prev, cur Observation
		want      bool
	}{
		{"twin renews", twin(7, "me-2"), twin(8, "me-2"), true},
		{"left-over record stands still", twin(7, "me-2"), twin(7, "me-2"), false},
		{"this process's own record", twin(7, "me-1"), twin(8, "me-1"), false},
		{"record of an older vigil (no instance)", twin(7, ""), twin(8, ""), false},
		{"earlier run replaced by another", twin(7, "me-2"), twin(8, "me-3"), false},
		{"a peer's record", Observation{Record: rec("other", time.Second), Revision: 7}, Observation{Record: rec("other", time.Second), Revision: 8}, false},
		{"absent then twin", Observation{}, twin(8, "me-2"), false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := twinRenewed(tc.prev, tc.cur, "me", "me-1"); got != tc.want {
				t.Fatalf("twinRenewed = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestWindowRestarts(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var w window
	w.observe(Observation{Revision: 5, Term: 3}, t0)
	w.observe(Observation{Revision: 5, Term: 3}, t0.Add(time.Second))
	if !w.since.Equal(t0) {
		t.Fatalf("same revision and term must not restart the window: since=%v", w.since)
	}
	w.observe(Observation{Revision: 5, Term: 2}, t0.Add(2*time.Second))
	if !w.since.Equal(t0) {
		t.Fatalf("an answer from a member on an older term must not restart the window")
	}
	w.observe(Observation{Revision: 5, Term: 4}, t0.Add(3*time.Second))
	if !w.since.Equal(t0.Add(3 * time.Second)) {
		t.Fatalf("a new raft term must restart the window, since=%v", w.since)
	}
	w.observe(Observation{Revision: 6, Term: 4}, t0.Add(4*time.Second))
	if !w.since.Equal(t0.Add(4*time.Second)) || w.rev != 6 {
		t.Fatalf("a new revision must restart the window: %+v", w)
	}
}

func TestLeaseDeadline(t *testing.T) {
	t0 := time.Unix(1000, 0)
	renew := 500 * time.Millisecond
	var l lease
	l.renewed(3, t0, renew)
	if l.expired(t0.Add(renew - time.Nanosecond)) {
		t.Fatal("expired before the renew deadline")
	}
	if !l.expired(t0.Add(renew)) {
		t.Fatal("not expired at the renew deadline")
	}
	// A probe that started before the last renewal never shortens the deadline.
	if l.storeLeaderless(t0.Add(-time.Second), renew) {
		t.Fatal("an older probe moved the deadline")
	}
	if !l.storeLeaderless(t0.Add(300*time.Millisecond), renew) || !l.deadline.Equal(t0.Add(800*time.Millisecond)) {
		t.Fatalf("a leaderless probe must anchor the deadline at its start: %v", l.deadline.Sub(t0))
	}
	// A renewal that started before the probe keeps the later deadline.
	l.renewed(4, t0.Add(100*time.Millisecond), renew)
	if !l.deadline.Equal(t0.Add(800*time.Millisecond)) || l.rev != 4 {
		t.Fatalf("deadline went backwards: %v", l.deadline.Sub(t0))
	}
}

func TestValidateTimings(t *testing.T) {
	ms := time.Millisecond
	tests := []struct {
		name                string
		lease, renew, retry time.Duration
		ok                  bool
	}{
		{"defaults", DefaultLeaseDuration, DefaultRenewDeadline, DefaultRetryPeriod, true},
		{"tuned", 350 * ms, 200 * ms, 50 * ms, true},
		{"renew equals lease", 800 * ms, 800 * ms, 100 * ms, false},
		{"renew above lease", 800 * ms, 900 * ms, 100 * ms, false},
		{"margin too small", 800 * ms, 750 * ms, 100 * ms, false},
		{"retry not below renew", 800 * ms, 500 * ms, 500 * ms, false},
		{"zero retry", 800 * ms, 500 * ms, 0, false},
		{"negative retry", 800 * ms, 500 * ms, -ms, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := ValidateTimings(tc.lease, tc.renew, tc.retry)
			if (err == nil) != tc.ok {
				t.Fatalf("ValidateTimings(%v, %v, %v) = %v, want ok=%v", tc.lease, tc.renew, tc.retry, err, tc.ok)
			}
			if err != nil && !errors.Is(err, validate.ErrInvalid) {
				t.Fatalf("error %v does not wrap validate.ErrInvalid", err)
			}
		})
	}
}
