package membership

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// TestRaftLinksOfTwoReads checks the judgement of one member from two reads
// of the others' per-peer counts: the cases CheckRaft meets between
// observer rounds, a restart between the two reads among them.
func TestRaftLinksOfTwoReads(t *testing.T) {
	leader, follower, victim := Member{ID: 1, Name: "a"}, Member{ID: 2, Name: "b"}, Member{ID: 3, Name: "c"}
	asked := []Member{leader, follower}
	t0 := time.Now()
	read := func(at time.Time, fromVictim float64) traffic {
		return traffic{at: at, bytes: map[uint64]float64{victim.ID: fromVictim}}
	}
	for _, tc := range []struct {
		name        string
		before, now map[uint64]traffic
		leader      uint64
		linked      []string
		asked       int
		known       bool
		err         string
	}{
		{
			name:   "both still hear it",
			before: map[uint64]traffic{1: read(t0, 100), 2: read(t0, 50)},
			now:    map[uint64]traffic{1: read(t0.Add(time.Second), 180), 2: read(t0.Add(time.Second), 60)},
			leader: 1, linked: []string{"a", "b"}, asked: 2, known: true,
		},
		{
			name:   "only the follower hears it",
			before: map[uint64]traffic{1: read(t0, 100), 2: read(t0, 50)},
			now:    map[uint64]traffic{1: read(t0.Add(time.Second), 100), 2: read(t0.Add(time.Second), 60)},
			leader: 1, linked: []string{"b"}, asked: 2, known: true,
		},
		{
			name:   "raft lost it",
			before: map[uint64]traffic{1: read(t0, 100), 2: read(t0, 50)},
			now:    map[uint64]traffic{1: read(t0.Add(time.Second), 100), 2: read(t0.Add(time.Second), 50)},
			leader: 1, asked: 2, known: true,
		},
		{
			// The leader restarted between the reads: its counts start
			// again from zero, lower than before. Its reads compare
			// nothing, and without the leader's counts silence is not
			// known to be loss.
			name:   "the leader restarted between the reads",
			before: map[uint64]traffic{1: read(t0, 100), 2: read(t0, 50)},
			now:    map[uint64]traffic{1: read(t0.Add(time.Second), 3), 2: read(t0.Add(time.Second), 50)},
			leader: 1, asked: 1, known: false, err: "no counts from a",
		},
		{
			// A follower's restart leaves the leader's reads, which still
			// show the link.
			name:   "a follower restarted, the leader hears it",
			before: map[uint64]traffic{1: read(t0, 100), 2: read(t0, 50)},
			now:    map[uint64]traffic{1: read(t0.Add(time.Second), 150), 2: read(t0.Add(time.Second), 0)},
			leader: 1, linked: []string{"a"}, asked: 1, known: true, err: "no counts from b",
		},
		{
			name:   "the leader did not answer the second read",
			before: map[uint64]traffic{1: read(t0, 100), 2: read(t0, 50)},
			now:    map[uint64]traffic{2: read(t0.Add(time.Second), 50)},
			leader: 1, asked: 1, known: false, err: "no counts from a",
		},
		{
			name:   "no raft leader known",
			before: map[uint64]traffic{1: read(t0, 100), 2: read(t0, 50)},
			now:    map[uint64]traffic{1: read(t0.Add(time.Second), 100), 2: read(t0.Add(time.Second), 50)},
			leader: 0, asked: 2, known: false, err: "leader's counts were not read",
		},
		{
			// The victim is the leader: every follower's count of it
			// is the leader's read.
			name:   "the member judged is the leader",
			before: map[uint64]traffic{2: read(t0, 50)},
			now:    map[uint64]traffic{2: read(t0.Add(time.Second), 50)},
			leader: 3, asked: 1, known: true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			askedHere := asked
			if tc.leader == victim.ID {
				askedHere = []Member{follower}
			}
			r := raftLinksOf(victim, askedHere, tc.before, tc.now, tc.leader)
			if !slices.Equal(r.LinkedFrom, tc.linked) || r.Asked != tc.asked || r.Known() != tc.known {
				t.Fatalf("got linked from %v, %d asked, known %v; want %v, %d, %v (%+v)", r.LinkedFrom, r.Asked, r.Known(), tc.linked, tc.asked, tc.known, r)
			}
			if tc.err == "" && r.Error != "" || tc.err != "" && !strings.Contains(r.Error, tc.err) {
				t.Fatalf("error %q, want %q", r.Error, tc.err)
			}
			// Whatever else is wrong, a member some transport still
			// hears is never removable on raft's word.
			if r.Linked() != (len(tc.linked) > 0) {
				t.Fatalf("Linked() = %v with %v", r.Linked(), r.LinkedFrom)
			}
		})
	}
}
