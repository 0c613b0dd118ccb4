package agent

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/vigil-ha/vigil/internal/lb"
)

// picks runs n picks through p over bs (each counted as a new connection),
// "-" for none, "!" after an address picked as a last resort.
func picks(p lb.Picker, bs []lb.Candidate, n int, tried map[string]bool) []string {
	var out []string
	for range n {
		i, anyway := p.Pick(bs, tried)
		switch {
		case i < 0:
			out = append(out, "-")
		case anyway:
			out = append(out, bs[i].Addr+"!")
			bs[i].Active++
		default:
			out = append(out, bs[i].Addr)
			bs[i].Active++
		}
	}
	return out
}

func TestTieredPicker(t *testing.T) {
	p := &tieredPicker{}
	p.setTiers(map[string]int{"far:1": tierFar, "near1:1": tierNear, "near2:1": tierNear, "seed:1": tierSeed})
	bs := []lb.Candidate{{Addr: "far:1", Usable: true}, {Addr: "near1:1", Usable: true}, {Addr: "near2:1", Usable: true}, {Addr: "seed:1", Usable: true}}
	// The nearest tier takes every connection, spread least-conn.
	if d := cmp.Diff([]string{"near1:1", "near2:1", "near1:1", "near2:1"}, picks(p, bs, 4, nil)); d != "" {
		t.Fatal(d)
	}
	// A down backend of the nearest tier leaves the other; with the whole
	// tier down the next tier serves, and the seed only after every other.
	bs[1].Usable = false
	if d := cmp.Diff([]string{"near2:1"}, picks(p, bs, 1, nil)); d != "" {
		t.Fatal(d)
	}
	bs[2].Usable = false
	if d := cmp.Diff([]string{"far:1"}, picks(p, bs, 1, nil)); d != "" {
		t.Fatal(d)
	}
	if d := cmp.Diff([]string{"seed:1"}, picks(p, bs, 1, map[string]bool{"far:1": true})); d != "" {
		t.Fatal(d)
	}
	// Usable backends all tried: give up, no last resort.
	if d := cmp.Diff([]string{"-"}, picks(p, bs, 1, map[string]bool{"far:1": true, "seed:1": true})); d != "" {
		t.Fatal(d)
	}
	// No backend passes its checks: any backend, least connections first,
	// as a last resort; none left untried: give up.
	for i := range bs {
		bs[i].Usable = false
	}
	bs[0].Active, bs[1].Active, bs[2].Active, bs[3].Active = 3, 0, 2, 0
	if d := cmp.Diff([]string{"near1:1!", "seed:1!"}, picks(p, bs, 2, nil)); d != "" {
		t.Fatal(d)
	}
	all := map[string]bool{"far:1": true, "near1:1": true, "near2:1": true, "seed:1": true}
	if d := cmp.Diff([]string{"-"}, picks(p, bs, 1, all)); d != "" {
		t.Fatal(d)
	}
}
