package etcdcluster

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"
)

// threeMembers is a Cluster of three members whose connections are dialled
// lazily, to nothing: the operations of these tests never touch them.
func threeMembers(t *testing.T) (*Cluster, []string) {
	eps := []string{"http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3"}
	c, err := New(Config{Endpoints: eps}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c, eps
}

// Hedged asks the preferred member alone while it answers in time, and the
// others only once it is late or fails. The operation here never touches
// the connections (they are dialled lazily, to nothing).
func TestHedged(t *testing.T) {
	c, eps := threeMembers(t)
	var asked tally
	op := func(slow string, fail bool) func(context.Context, *Member) (string, error) {
		return func(ctx context.Context, m *Member) (string, error) {
			asked.add(m.Endpoint)
			if m.Endpoint == slow {
				if fail {
					return "", errors.New("refused")
				}
				<-ctx.Done()
				return "", ctx.Err()
			}
			return m.Endpoint, nil
		}
	}
	askedAll := func() bool { return len(asked.wait(len(eps))) == len(eps) }
	reset := func() map[string]int { return asked.wait(0) }
	ctx := context.Background()
	// Healthy preferred member: asked alone.
	v, m, err := Hedged(ctx, c, eps[1], time.Second, op("", false), nil)
	if err != nil || v != eps[1] || m.Endpoint != eps[1] {
		t.Fatalf("Hedged = %q, %v, %v", v, m, err)
	}
	if got := reset(); len(got) != 1 || got[eps[1]] != 1 {
		t.Fatalf("a healthy preferred member: asked %v, want it alone", got)
	}
	// Late: the others are asked after the delay, and one of them answers.
	start := time.Now()
	v, _, err = Hedged(ctx, c, eps[1], 50*time.Millisecond, op(eps[1], false), nil)
	if err != nil || v == eps[1] || time.Since(start) < 50*time.Millisecond {
		t.Fatalf("a late preferred member: %q, %v after %v", v, err, time.Since(start))
	}
	if !askedAll() {
		t.Fatalf("a late preferred member: asked %v, want every member", reset())
	}
	reset()
	// Failing: the others are asked at once.
	start = time.Now()
	if v, _, err = Hedged(ctx, c, eps[1], time.Hour, op(eps[1], true), nil); err != nil || v == eps[1] || time.Since(start) > time.Second {
		t.Fatalf("a failing preferred member: %q, %v after %v", v, err, time.Since(start))
	}
	reset()
	// No preference: every member at once.
	if _, _, err := Hedged(ctx, c, "", time.Hour, op("", false), nil); err != nil {
		t.Fatal(err)
	}
	if !askedAll() {
		t.Fatalf("no preference: asked %v, want every member", reset())
	}
}

// A Path goes through the member that answered last, alone; after a
// failure or a late answer, through the member that answered instead.
func TestPath(t *testing.T) {
	const slow = 400 * time.Millisecond
	c, eps := threeMembers(t)
	var asked tally
	var mu sync.Mutex
	down := map[string]string{} // endpoint -> "fail" or "hang"
	op := func(ctx context.Context, m *Member) (string, error) {
		asked.add(m.Endpoint)
		mu.Lock()
		how := down[m.Endpoint]
		mu.Unlock()
		switch how {
		case "fail":
			return "", errors.New("refused")
		case "hang":
			<-ctx.Done()
			return "", ctx.Err()
		case "slow":
			time.Sleep(slow)
		}
		return m.Endpoint, nil
	}
	set := func(ep, how string) {
		mu.Lock()
		defer mu.Unlock()
		down[ep] = how
	}
	counts := asked.wait
	ctx := context.Background()
	var p Path
	if p.First() != "" {
		t.Fatalf("a new path goes through %q, want every member", p.First())
	}
	first, err := Via(ctx, c, &p, op)
	if err != nil || p.First() != first {
		t.Fatalf("Via = %q, %v; the path then goes through %q", first, err, p.First())
	}
	if got := counts(3); len(got) != 3 {
		t.Fatalf("a new path asked %v, want every member", got)
	}
	for range 5 {
		if v, err := Via(ctx, c, &p, op); err != nil || v != first {
			t.Fatalf("Via = %q, %v, want %q", v, err, first)
		}
	}
	if got := counts(1); len(got) != 1 || got[first] != 5 {
		t.Fatalf("a healthy path: asked %v, want %s alone, 5 times", got, first)
	}
	// The member fails: the others answer, and the path moves to one of them.
	set(first, "fail")
	second, err := Via(ctx, c, &p, op)
	if err != nil || second == first || p.First() != second {
		t.Fatalf("after %s failed: Via = %q, %v; path through %q", first, second, err, p.First())
	}
	counts(3)
	if v, err := Via(ctx, c, &p, op); err != nil || v != second {
		t.Fatalf("Via = %q, %v, want %q", v, err, second)
	}
	if got := counts(1); len(got) != 1 {
		t.Fatalf("after the move: asked %v, want %s alone", got, second)
	}
	// The new member hangs: after a hedge delay the third answers.
	set(second, "hang")
	start := time.Now()
	third, err := Via(ctx, c, &p, op)
	if err != nil || third == first || third == second || p.First() != third {
		t.Fatalf("after %s hung: Via = %q, %v; path through %q", second, third, err, p.First())
	}
	if took := time.Since(start); took < MinHedge {
		t.Fatalf("a late member was passed over after %v, before the hedge delay %v", took, MinHedge)
	}
	// The hedge delay is not the new member's round trip: it answered at
	// once, so the next delay is the least.
	if _, d := p.next(); d != MinHedge {
		t.Fatalf("after a hedged answer the next hedge delay is %v, want %v (the answering member's own round trip, not the hedge's)", d, MinHedge)
	}
	// One slow answer everywhere (a lost packet, resent): the delay moves
	// an eighth of the way, not to twice that answer.
	for _, ep := range eps {
		set(ep, "slow")
	}
	if v, err := Via(ctx, c, &p, op); err != nil || v != third {
		t.Fatalf("Via = %q, %v, want %q", v, err, third)
	}
	if _, d := p.next(); d >= slow/2 {
		t.Fatalf("after one answer in %v the hedge delay is %v, want it barely moved (an eighth of the way: %v)", slow, d, 2*slow/8)
	}
	// Every member fails: an error, and the next operation asks everyone.
	for _, ep := range eps {
		set(ep, "fail")
	}
	counts(3)
	if _, err := Via(ctx, c, &p, op); err == nil {
		t.Fatal("Via succeeded with every member down")
	}
	if p.First() != "" {
		t.Fatalf("after a failure everywhere the path goes through %q, want every member", p.First())
	}
}

// tally counts the operations each member was asked.
type tally struct {
	mu      sync.Mutex
	asked   map[string]int
	changed chan struct{} // a token after each add
}

func (t *tally) add(ep string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.asked == nil {
		t.asked = map[string]int{}
	}
	t.asked[ep]++
	select {
	case t.changes() <- struct{}{}:
	default:
	}
}

// changes is the add notification channel, made on first use (under mu).
func (t *tally) changes() chan struct{} {
	if t.changed == nil {
		t.changed = make(chan struct{}, 1)
	}
	return t.changed
}

// wait waits up to 5 s until n members were asked in all (the goroutines of
// members that lost the race count themselves a moment later), then returns
// the counts and clears them.
func (t *tally) wait(n int) map[string]int {
	deadline := time.After(5 * time.Second)
	for waiting := true; waiting; {
		t.mu.Lock()
		got, changed := len(t.asked), t.changes()
		t.mu.Unlock()
		if got >= n {
			break
		}
		select {
		case <-changed:
		case <-deadline:
			waiting = false
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	got := t.asked
	t.asked = nil
	return got
}
