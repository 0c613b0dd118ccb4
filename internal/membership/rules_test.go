package membership

import (
	"errors"
	"testing"
)

func view(ms ...Member) View { return View{Members: ms} }

func voter(name string, up bool) Member {
	return Member{ID: uint64(len(name)) + uint64(name[len(name)-1]), Name: name, Reachable: up}
}

func learner(name string, up bool) Member {
	m := voter(name, up)
	m.Learner = true
	return m
}

func TestCheckRemove(t *testing.T) {
	cases := []struct {
		name   string
		v      View
		target string
		force  bool
		ok     bool
	}{
		{"dead voter of 3", view(voter("a", true), voter("b", true), voter("c", false)), "c", false, true},
		{"healthy voter needs force", view(voter("a", true), voter("b", true), voter("c", true)), "c", false, false},
		{"healthy voter with force", view(voter("a", true), voter("b", true), voter("c", true)), "c", true, true},
		{"2-member cluster, one dead: no quorum to commit", view(voter("a", true), voter("b", false)), "b", false, false},
		{"2-member cluster, both up, force", view(voter("a", true), voter("b", true)), "b", true, true},
		{"1 of 3 healthy", view(voter("a", true), voter("b", false), voter("c", false)), "c", false, false},
		{"healthy voter while another is dead", view(voter("a", true), voter("b", true), voter("c", false)), "b", true, false},
		{"learners do not count as healthy voters", view(voter("a", true), voter("b", true), voter("c", false), learner("d", true)), "b", true, false},
		{"dead learner", view(voter("a", true), voter("b", true), voter("c", true), learner("d", false)), "d", false, true},
		{"healthy learner needs force", view(voter("a", true), voter("b", true), learner("d", true)), "d", false, false},
		{"last voter", view(voter("a", true)), "a", true, false},
		{"dead voter of 5 with 2 dead", view(voter("a", true), voter("b", true), voter("c", true), voter("d", false), voter("e", false)), "e", false, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m, err := tc.v.Find(tc.target)
			if err != nil {
				t.Fatal(err)
			}
			err = tc.v.CheckRemove(m, tc.force)
			if tc.ok && err != nil {
				t.Fatalf("refused: %v", err)
			}
			if !tc.ok && !errors.Is(err, ErrRefused) {
				t.Fatalf("CheckRemove = %v, want a refusal", err)
			}
			if err != nil {
				t.Log(err)
			}
		})
	}
}

func TestFind(t *testing.T) {
	v := view(Member{ID: 0xabc, Name: "n1"})
	if m, err := v.Find("abc"); err != nil || m.Name != "n1" {
		t.Fatalf("Find by ID: %v %v", m, err)
	}
	if _, err := v.Find("n9"); !errors.Is(err, ErrUnknownMember) {
		t.Fatalf("Find unknown: %v", err)
	}
}

func TestTransferTarget(t *testing.T) {
	at := func(m Member, index uint64) Member { m.RaftIndex = index; return m }
	a, b, c := at(voter("a", true), 10), at(voter("b", true), 12), at(voter("c", true), 11)
	cases := []struct {
		name  string
		v     View
		avoid []uint64
		want  string // "" for none
	}{
		{"furthest along", view(a, b, c), nil, "b"},
		{"never the member removed, however far along", view(at(a, 20), b, c), nil, "b"},
		{"an avoided member only when nothing else is left", view(a, b, c), []uint64{b.ID}, "c"},
		{"two avoided", view(a, b, c), []uint64{b.ID, c.ID}, "b"},
		{"avoided, and the others are down or learners", view(a, b, voter("c", false), learner("d", true)), []uint64{b.ID}, "b"},
		{"nobody", view(a, voter("b", false), learner("c", true)), nil, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := tc.v.transferTarget(a, tc.avoid...)
			switch {
			case tc.want == "" && ok:
				t.Fatalf("transferTarget = %s, want none", got.Name)
			case tc.want != "" && (!ok || got.Name != tc.want):
				t.Fatalf("transferTarget = %s (%v), want %s", got.Name, ok, tc.want)
			}
		})
	}
}
