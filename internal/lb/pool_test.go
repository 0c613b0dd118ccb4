package lb

import (
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func picks(p *pool, n int, skip map[string]bool) []string {
	var out []string
	for range n {
		b, _ := p.pick(skip)
		if b == nil {
			out = append(out, "-")
			continue
		}
		out = append(out, b.addr)
	}
	return out
}

func TestPoolPolicies(t *testing.T) {
	up := func(p *pool, addrs ...string) {
		for _, a := range addrs {
			p.m[a].usable = true
		}
	}
	t.Run("round robin skips unusable", func(t *testing.T) {
		p := newPool(RoundRobin())
		p.set([]string{"c:1", "a:1", "b:1"})
		up(p, "a:1", "c:1")
		if d := cmp.Diff([]string{"a:1", "c:1", "a:1", "c:1"}, picks(p, 4, nil)); d != "" {
			t.Fatal(d)
		}
	})
	t.Run("least conn prefers the idle backend", func(t *testing.T) {
		p := newPool(LeastConn())
		p.set([]string{"a:1", "b:1", "c:1"})
		up(p, "a:1", "b:1", "c:1")
		p.m["a:1"].active = 5
		p.m["b:1"].active = 1
		// c (0) first, then c and b tie at 1: turns go round.
		if d := cmp.Diff([]string{"c:1", "b:1", "c:1"}, picks(p, 3, nil)); d != "" {
			t.Fatal(d)
		}
		p.done(p.m["c:1"])
		p.done(p.m["c:1"])
		if got := p.m["c:1"].active; got != 0 {
			t.Fatalf("active = %d after done", got)
		}
	})
	t.Run("least conn spreads ties evenly", func(t *testing.T) {
		p := newPool(LeastConn())
		p.set([]string{"a:1", "b:1", "c:1"})
		up(p, "a:1", "b:1", "c:1")
		got := map[string]int{}
		for range 30 {
			b, _ := p.pick(nil)
			got[b.addr]++
			p.done(b) // short connections: all stay at 0
		}
		if d := cmp.Diff(map[string]int{"a:1": 10, "b:1": 10, "c:1": 10}, got); d != "" {
			t.Fatal(d)
		}
	})
	t.Run("skip and none usable", func(t *testing.T) {
		p := newPool(LeastConn())
		p.set([]string{"a:1", "b:1"})
		if b, _ := p.pick(nil); b != nil {
			t.Fatalf("picked %s, none is usable", b.addr)
		}
		up(p, "a:1", "b:1")
		if d := cmp.Diff([]string{"b:1", "b:1"}, picks(p, 2, map[string]bool{"a:1": true})); d != "" {
			t.Fatal(d)
		}
		if b, _ := p.pick(map[string]bool{"a:1": true, "b:1": true}); b != nil {
			t.Fatalf("picked %s, both skipped", b.addr)
		}
	})
	t.Run("set keeps state and returns removed", func(t *testing.T) {
		p := newPool(RoundRobin())
		p.set([]string{"a:1", "b:1"})
		up(p, "a:1", "b:1")
		removed := p.set([]string{"b:1", "c:1"})
		if len(removed) != 1 || removed[0].addr != "a:1" {
			t.Fatalf("removed = %v", removed)
		}
		if !p.m["b:1"].usable || p.m["c:1"].usable {
			t.Fatal("set lost b's state or made c usable unchecked")
		}
		if d := cmp.Diff([]string{"b:1", "c:1"}, p.order); d != "" {
			t.Fatal(d)
		}
		if p.usableCount() != 1 {
			t.Fatalf("usableCount = %d", p.usableCount())
		}
		if p.set(nil); len(picks(p, 1, nil)) != 1 || picks(p, 1, nil)[0] != "-" || len(p.order) != 0 {
			t.Fatal("empty pool picked something")
		}
	})
}

func TestParsePolicy(t *testing.T) {
	for s, want := range map[string]string{"": "least-conn", "least-conn": "least-conn", "round-robin": "round-robin"} {
		if got, err := ParsePolicy(s); err != nil || fmt.Sprint(got) != want {
			t.Errorf("ParsePolicy(%q) = %v, %v", s, got, err)
		}
	}
	if _, err := ParsePolicy("random"); err == nil {
		t.Error("ParsePolicy accepted random")
	}
}

// A picker's answer outside the list, or one already tried, picks nothing.
type badPicker int

func (p badPicker) Pick([]Candidate, map[string]bool) (int, bool) { return int(p), false }

func TestPoolGuardsThePicker(t *testing.T) {
	for _, i := range []int{-1, 2, 0} {
		p := newPool(badPicker(i))
		p.set([]string{"a:1", "b:1"})
		if d := cmp.Diff([]string{"-"}, picks(p, 1, map[string]bool{"a:1": true})); d != "" {
			t.Fatalf("picker answering %d: %s", i, d)
		}
	}
}
