package etcdcluster

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"
)

// Hedged asks the preferred member alone while it answers in time, and the
// others only once it is late or fails. The operation here never touches
// the connections (they are dialled lazily, to nothing).
func TestHedged(t *testing.T) {
	eps := []string{"http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3"}
	c, err := New(Config{Endpoints: eps}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var mu sync.Mutex
	asked := map[string]int{}
	op := func(slow string, fail bool) func(context.Context, *Member) (string, error) {
		return func(ctx context.Context, m *Member) (string, error) {
			mu.Lock()
			asked[m.Endpoint]++
			mu.Unlock()
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
	// askedAll waits until every member was asked (the goroutines of the
	// members that lost the race count themselves a moment later).
	askedAll := func() bool {
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			mu.Lock()
			n := len(asked)
			mu.Unlock()
			if n == len(eps) {
				return true
			}
		}
		return false
	}
	reset := func() map[string]int {
		mu.Lock()
		defer mu.Unlock()
		got := asked
		asked = map[string]int{}
		return got
	}
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
