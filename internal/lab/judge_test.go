package lab

import (
	"testing"
	"time"
)

func TestWorkerJudgement(t *testing.T) {
	t0 := time.Unix(100, 0)
	ws := []window{{t0, t0.Add(time.Second)}}
	if !inWindows(ws, t0) || !inWindows(ws, t0.Add(time.Second)) || inWindows(ws, t0.Add(1001*time.Millisecond)) {
		t.Fatal("window bounds")
	}
	good := WorkerResult{Name: "w1", KeysAcked: 100, WatchSeen: 99, APIRequests: 100, ErrorsInWindows: 3}
	if !good.ok() {
		t.Fatalf("%s judged bad", good)
	}
	for _, bad := range []func(*WorkerResult){
		func(w *WorkerResult) { w.ClientRestarts = 1 },
		func(w *WorkerResult) { w.AgentRestarts = 1 },
		func(w *WorkerResult) { w.ErrorsOutside = 1 },
		func(w *WorkerResult) { w.KeysMissing = 1 },
		func(w *WorkerResult) { w.WatchOutOfOrder = 1 },
		func(w *WorkerResult) { w.WatchSeen = 90 },
		func(w *WorkerResult) { w.KeysAcked, w.WatchSeen = 0, 0 },
	} {
		w := good
		bad(&w)
		if w.ok() {
			t.Errorf("%s judged good", w)
		}
	}
}

func TestJudgeSplit(t *testing.T) {
	t0 := time.Unix(100, 0)
	at := func(ms int, node string) reply {
		return reply{at: t0.Add(time.Duration(ms) * time.Millisecond), node: node}
	}
	clean := []reply{at(-10, "n1"), at(0, "n1"), at(800, "n2"), at(810, "n2")}
	if split, d := judgeSplit(nil, clean, t0); split {
		t.Fatalf("a single switch judged split: %s", d)
	}
	flap := []reply{at(0, "n1"), at(800, "n2"), at(810, "n1"), at(820, "n2")}
	if split, _ := judgeSplit(nil, flap, t0); !split {
		t.Fatal("alternating answers not judged split")
	}
	if split, _ := judgeSplit([]doubleHold{{at: t0, holders: []string{"n1", "n2"}}}, clean, t0); !split {
		t.Fatal("two holders not judged split")
	}
	failback := []reply{at(0, "n1"), at(800, "n2"), at(5000, "n1")}
	if split, d := judgeSplit(nil, failback, t0); split {
		t.Fatalf("a failback seconds later judged split: %s", d)
	}
}

func TestLongestGap(t *testing.T) {
	t0 := time.Unix(100, 0)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	rs := []reply{{at: ms(-20)}, {at: ms(-10)}, {at: ms(700)}, {at: ms(710)}, {at: ms(720)}}
	if g := longestGap(rs, ms(0), ms(720)); g != 710*time.Millisecond {
		t.Fatalf("gap = %v, want 710ms (from the last answer before the fault)", g)
	}
	if g := longestGap(rs[:2], ms(0), ms(1000)); g != 1010*time.Millisecond {
		t.Fatalf("gap with no answer after the fault = %v, want up to the end", g)
	}
}
