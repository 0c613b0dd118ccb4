package membership

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestTrackerCountsOnlyUnbrokenRuns(t *testing.T) {
	a, b := voter("a", true), voter("b", false)
	v := view(a, b)
	t0 := time.Now()
	tr := NewTracker(3 * time.Second)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }

	tr.Observe(v, at(0), at(0))
	if d := tr.Down(b.ID); d != 0 {
		t.Fatalf("down after one observation = %v, want 0", d)
	}
	for s := 1.0; s <= 10; s++ {
		tr.Observe(v, at(s), at(s))
	}
	if d := tr.Down(b.ID); d != 10*time.Second {
		t.Fatalf("down after 10 s of observations = %v", d)
	}
	if d := tr.Down(a.ID); d != 0 {
		t.Fatalf("a reachable member is down for %v", d)
	}
	// A gap (the process paused, etcd out of reach) restarts the count:
	// the time in between is not downtime.
	tr.Observe(v, at(20), at(20))
	if d := tr.Down(b.ID); d != 0 {
		t.Fatalf("down right after a 10 s gap = %v, want 0", d)
	}
	if w := tr.Watching(); w != 0 {
		t.Fatalf("watching after a gap = %v", w)
	}
	tr.Observe(v, at(22), at(22))
	if d := tr.Down(b.ID); d != 2*time.Second {
		t.Fatalf("down 2 s after the gap = %v", d)
	}
	// One reachable observation ends the run.
	tr.Observe(view(a, voter("b", true)), at(23), at(23))
	tr.Observe(v, at(24), at(24))
	if d := tr.Down(b.ID); d != 0 {
		t.Fatalf("down right after a reachable sighting = %v", d)
	}
	r := tr.Report("node-a", "a", 7)
	if s := r.Members[b.IDString()]; s.Reachable || s.Name != "b" || r.Seq != 7 || r.Observer != "node-a" {
		t.Fatalf("report %+v", r)
	}
	// A round that took a while: the member did not answer at any time
	// from its start to its end.
	tr.Observe(v, at(25), at(26.5))
	if d := tr.Down(b.ID); d != 2500*time.Millisecond {
		t.Fatalf("down after a 1.5 s round = %v, want 2.5s", d)
	}
	// A member that left the list is forgotten.
	tr.Observe(view(a), at(27), at(27))
	if _, ok := tr.Report("x", "a", 8).Members[b.IDString()]; ok {
		t.Fatal("a removed member is still reported")
	}
}

// seen is one sighting for report: down for this long, or up.
type seen struct {
	m    Member
	down time.Duration
}

func report(observer string, sightings ...seen) Report {
	r := Report{Observer: observer, Member: observer, Seq: 1, Members: map[string]Sighting{}}
	for _, s := range sightings {
		r.Members[s.m.IDString()] = Sighting{Name: s.m.Name, Reachable: s.down < 0, DownMillis: max(s.down, 0).Milliseconds()}
	}
	return r
}

const up = -1 // a sighting of a reachable member

func TestJudge(t *testing.T) {
	a, b, c, d, e := voter("a", true), voter("b", true), voter("c", false), voter("d", true), voter("e", true)
	three := view(a, b, c)
	all := func(string) bool { return true }
	cases := []struct {
		name    string
		v       View
		reports []Report
		fresh   func(string) bool
		want    string
		agree   int
	}{
		{"both healthy voters agree", three, []Report{report("a", seen{c, time.Minute}), report("b", seen{c, time.Minute})}, all, Agreed, 2},
		{"only the holder lost it (one-sided)", three, []Report{report("a", seen{c, time.Minute}), report("b", seen{c, up}), report("c", seen{c, up})}, all, OneSided, 1},
		{"a majority sees it down, not long enough", three, []Report{report("a", seen{c, time.Minute}), report("b", seen{c, 5 * time.Second})}, all, NotYet, 1},
		{"stale reports do not count", three, []Report{report("a", seen{c, time.Minute}), report("b", seen{c, time.Minute})}, func(o string) bool { return o == "a" }, OneSided, 1},
		{"the member's own vigil does not count while its member is down", three, []Report{report("a", seen{c, time.Minute}), report("c", seen{c, time.Minute})}, all, OneSided, 1},
		{"one voter counts once", three, []Report{report("a", seen{c, time.Minute}), {Observer: "a2", Member: "a", Seq: 1, Members: map[string]Sighting{c.IDString(): {DownMillis: 60000}}}}, all, OneSided, 1},
		{"an observer that is no member does not count", three, []Report{report("a", seen{c, time.Minute}), report("worker", seen{c, time.Minute})}, all, OneSided, 1},
		{"5 voters: 3 of the 4 healthy agree", view(a, b, d, e, c), []Report{report("a", seen{c, time.Minute}), report("b", seen{c, time.Minute}), report("d", seen{c, time.Minute}), report("e", seen{c, up})}, all, Agreed, 3},
		{"5 voters: 2 agree", view(a, b, d, e, c), []Report{report("a", seen{c, time.Minute}), report("b", seen{c, time.Minute}), report("d", seen{c, up}), report("e", seen{c, up})}, all, OneSided, 2},
		{"no reports", three, nil, all, OneSided, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.v.Judge(c, 30*time.Second, tc.reports, tc.fresh)
			if got.Verdict != tc.want || got.Agree != tc.agree {
				t.Fatalf("verdict %s with %d agreeing, want %s with %d: %s", got.Verdict, got.Agree, tc.want, tc.agree, got.Evidence())
			}
			if !strings.Contains(got.Evidence(), fmt.Sprintf("%d of %d", got.Agree, got.Needed)) {
				t.Fatalf("evidence line: %s", got.Evidence())
			}
		})
	}
}

func TestCasesAndRemovable(t *testing.T) {
	a, b, c := voter("a", true), voter("b", true), voter("c", false)
	c.Raft = &RaftLinks{Asked: 2, leaderRead: true}   // raft lost it too
	v := view(a, b, c, Member{ID: 99, Learner: true}) // and an added member that never started
	v.Reports = []Report{report("b", seen{c, time.Minute}), report("a", seen{c, time.Hour})}
	self := report("a", seen{c, 10 * time.Second})
	fresh := func(string) bool { return true }

	cs := v.Cases(PruneConfig{MinDown: 30 * time.Second, Fresh: fresh})
	if len(cs) != 1 || cs[0].Member.ID != c.ID || cs[0].Verdict != Agreed {
		t.Fatalf("cases from the published reports: %+v", cs)
	}
	if !cs[0].Removable(PruneConfig{MinDown: 30 * time.Second}) {
		t.Fatal("agreed case not removable")
	}
	// vigil run's own view replaces its published one, and must itself
	// show the member down for the whole period.
	pc := PruneConfig{MinDown: 30 * time.Second, Fresh: fresh, Self: &self}
	cs = v.Cases(pc)
	if cs[0].Verdict != NotYet || cs[0].Removable(pc) || cs[0].SelfDownMillis != 10000 {
		t.Fatalf("with a short own view: %+v", cs[0])
	}
	self = report("a", seen{c, time.Minute})
	if cs = v.Cases(pc); !cs[0].Removable(pc) {
		t.Fatalf("with a long own view: %+v", cs[0])
	}
	// Self is always fresh; others only when Fresh says so.
	pc.Fresh = func(string) bool { return false }
	if cs = v.Cases(pc); cs[0].Agree != 1 || cs[0].Removable(pc) {
		t.Fatalf("with the peer's report stale: %+v", cs[0])
	}
	// Force acts on one-sided evidence.
	if !cs[0].Removable(PruneConfig{Force: true}) {
		t.Fatal("--force case not removable")
	}
}

func TestBookJudgesFreshnessByChange(t *testing.T) {
	b := NewBook(5 * time.Second)
	t0 := time.Now()
	r := Report{Observer: "a", Seq: 1}
	b.Note([]Report{r}, t0)
	if b.Fresh("a", t0) {
		t.Fatal("a report seen once is fresh: nothing shows it is being renewed")
	}
	r.Seq = 2
	b.Note([]Report{r}, t0.Add(time.Second))
	if !b.Fresh("a", t0.Add(2*time.Second)) {
		t.Fatal("a report that just changed is not fresh")
	}
	b.Note([]Report{r}, t0.Add(5*time.Second))
	if b.Fresh("a", t0.Add(6100*time.Millisecond)) {
		t.Fatal("a report unchanged for 5.1 s is fresh")
	}
	b.Note(nil, t0.Add(7*time.Second))
	if b.Fresh("a", t0.Add(7*time.Second)) || b.Fresh("zz", t0) {
		t.Fatal("a withdrawn or unknown report is fresh")
	}
}

// Agreed evidence and even --force do not remove a member while raft may
// still have it: a working link from an answering member, links that
// could not be read, or links never read.
func TestRaftHoldsBack(t *testing.T) {
	a, b, c := voter("a", true), voter("b", true), voter("c", false)
	reports := []Report{report("a", seen{c, time.Hour}), report("b", seen{c, time.Hour})}
	fresh := func(string) bool { return true }
	for _, tc := range []struct {
		name string
		raft *RaftLinks
		says string
	}{
		{"linked", &RaftLinks{LinkedFrom: []string{"b"}, Asked: 2}, "linked from b (1 of 2 asked)"},
		{"unreadable", &RaftLinks{Error: "connection refused"}, "cannot tell"},
		{"no leader's counts", &RaftLinks{Asked: 1, Error: "the raft leader's counts were not read"}, "leader's counts were not read"},
		{"not read", nil, "not read"},
	} {
		c.Raft = tc.raft
		v := view(a, b, c)
		v.Reports = reports
		cs := v.Cases(PruneConfig{MinDown: time.Minute, Fresh: fresh})
		if len(cs) != 1 || cs[0].Verdict != Agreed {
			t.Fatalf("%s: cases %+v, want c agreed down", tc.name, cs)
		}
		if cs[0].Removable(PruneConfig{MinDown: time.Minute}) || cs[0].Removable(PruneConfig{Force: true}) {
			t.Errorf("%s: removable", tc.name)
		}
		if h := cs[0].RaftHolds(); !strings.Contains(h, tc.says) {
			t.Errorf("%s: RaftHolds = %q, want it to say %q", tc.name, h, tc.says)
		}
	}
	c.Raft = &RaftLinks{Asked: 2, leaderRead: true}
	v := view(a, b, c)
	v.Reports = reports
	if cs := v.Cases(PruneConfig{MinDown: time.Minute, Fresh: fresh}); !cs[0].Removable(PruneConfig{MinDown: time.Minute}) || cs[0].RaftHolds() != "" {
		t.Errorf("raft lost it, evidence agreed: not removable (%s)", cs[0].RaftHolds())
	}
	if e := v.Cases(PruneConfig{MinDown: time.Minute, Fresh: fresh})[0].Evidence(); !strings.Contains(e, "raft: silent (2 asked)") {
		t.Errorf("evidence %q does not say what raft said", e)
	}
}
