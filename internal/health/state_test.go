package health

import (
	"testing"
	"time"
)

func TestTracker(t *testing.T) {
	ok := result{}
	dead := result{cause: Dead, err: "connection refused"}
	drain := result{cause: Draining, err: "HTTP 503"}
	type step struct {
		r         result
		markDead  bool
		want      State
		wantCause Cause
		changed   bool
	}
	cases := []struct {
		name  string
		steps []step
	}{
		{"first success is enough", []step{{r: ok, want: Up, changed: true}}},
		{"first failure takes an unknown backend down", []step{{r: dead, want: Down, wantCause: Dead, changed: true}}},
		{"up needs fall failures", []step{
			{r: ok, want: Up, changed: true},
			{r: dead, want: Up},
			{r: dead, want: Down, wantCause: Dead, changed: true},
		}},
		{"a success in between resets the fall count", []step{
			{r: ok, want: Up, changed: true},
			{r: dead, want: Up},
			{r: ok, want: Up},
			{r: dead, want: Up},
			{r: ok, want: Up},
		}},
		{"down needs rise successes", []step{
			{r: dead, want: Down, wantCause: Dead, changed: true},
			{r: ok, want: Down, wantCause: Dead},
			{r: ok, want: Up, changed: true},
		}},
		{"draining then dead changes the cause", []step{
			{r: ok, want: Up, changed: true},
			{r: drain, want: Up},
			{r: drain, want: Down, wantCause: Draining, changed: true},
			{r: drain, want: Down, wantCause: Draining},
			{r: dead, want: Down, wantCause: Dead, changed: true},
		}},
		{"mark dead is immediate", []step{
			{r: ok, want: Up, changed: true},
			{markDead: true, want: Down, wantCause: Dead, changed: true},
			{markDead: true, want: Down, wantCause: Dead},
			{r: ok, want: Down, wantCause: Dead},
			{r: ok, want: Up, changed: true},
		}},
		{"mark dead turns draining into dead", []step{
			{r: drain, want: Down, wantCause: Draining, changed: true},
			{markDead: true, want: Down, wantCause: Dead, changed: true},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tr := tracker{rise: 2, fall: 2, st: Status{Backend: "b"}}
			now := time.Unix(1000, 0)
			for i, s := range tc.steps {
				now = now.Add(time.Second)
				var changed bool
				if s.markDead {
					changed = tr.markDead("refused", now)
				} else {
					changed = tr.observe(s.r, now)
				}
				if tr.st.State != s.want || tr.st.Cause != s.wantCause || changed != s.changed {
					t.Fatalf("step %d: state %v cause %v changed %v, want %v %v %v", i, tr.st.State, tr.st.Cause, changed, s.want, s.wantCause, s.changed)
				}
			}
		})
	}
}

func TestTrackerFailingSince(t *testing.T) {
	tr := tracker{rise: 2, fall: 2}
	t0 := time.Unix(1000, 0)
	tr.observe(result{}, t0)
	if !tr.st.FailingSince.IsZero() {
		t.Fatal("FailingSince set after a success")
	}
	tr.observe(result{cause: Dead, started: t0.Add(400 * time.Millisecond)}, t0.Add(time.Second))
	tr.observe(result{cause: Dead}, t0.Add(2*time.Second))
	if got := tr.st.FailingSince; !got.Equal(t0.Add(400 * time.Millisecond)) {
		t.Fatalf("FailingSince = %v, want the start of the first failed check", got)
	}
	tr.observe(result{}, t0.Add(3*time.Second))
	if !tr.st.FailingSince.IsZero() {
		t.Fatal("FailingSince kept after a success")
	}
}

// PassingSince is the start of the current run of passes: it survives
// further passes, a single failure clears it even while the backend stays
// Up (fall 2), and so does a refused connection.
func TestTrackerPassingSince(t *testing.T) {
	tr := tracker{rise: 2, fall: 2}
	t0 := time.Unix(1000, 0)
	if !tr.st.PassingSince.IsZero() {
		t.Fatal("PassingSince set before any check")
	}
	tr.observe(result{took: 3 * time.Millisecond}, t0)
	tr.observe(result{took: 250 * time.Millisecond}, t0.Add(time.Second))
	if got := tr.st.PassingSince; !got.Equal(t0) || tr.st.LastRTT != 250*time.Millisecond {
		t.Fatalf("PassingSince = %v, LastRTT %v; want the first pass %v and the last check's 250ms", got, tr.st.LastRTT, t0)
	}
	tr.observe(result{cause: Unreachable, took: 600 * time.Millisecond}, t0.Add(2*time.Second))
	if tr.st.State != Up || !tr.st.PassingSince.IsZero() || tr.st.LastRTT != 0 {
		t.Fatalf("after one failure: %v, PassingSince %v, LastRTT %v; want up, zero and zero", tr.st.State, tr.st.PassingSince, tr.st.LastRTT)
	}
	tr.observe(result{}, t0.Add(3*time.Second))
	if got := tr.st.PassingSince; tr.st.State != Up || !got.Equal(t0.Add(3*time.Second)) {
		t.Fatalf("after passing again: %v, PassingSince %v; want up since %v", tr.st.State, got, t0.Add(3*time.Second))
	}
	tr.markDead("refused", t0.Add(4*time.Second))
	if !tr.st.PassingSince.IsZero() {
		t.Fatal("PassingSince kept after a refused connection")
	}
}

func TestValidatePath(t *testing.T) {
	for _, p := range []string{"/readyz", "/readyz?exclude=etcd", "/livez", "/"} {
		if err := ValidatePath(p); err != nil {
			t.Errorf("ValidatePath(%q) = %v", p, err)
		}
	}
	for _, p := range []string{"", "readyz", "//evil/readyz", "/ready z", "http://x/readyz", "/readyz#frag", "/a\nb"} {
		if err := ValidatePath(p); err == nil {
			t.Errorf("ValidatePath(%q) accepted", p)
		}
	}
}
