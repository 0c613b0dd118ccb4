package membership

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// A member is pruned only when the cluster agrees it is gone, not when one
// observer lost it. The evidence is each vigil's own view of every member:
//
//   - Every vigil run observes every member (View) about once a second and
//     keeps, per member, how long it has seen the member unreachable
//     without a break, on its own monotonic clock (Tracker). A gap in its
//     observations (a paused or stopped process, etcd unreachable from
//     here) restarts every count: a gap is never read as downtime.
//   - It publishes that view as a Report in etcd. Readers tell a fresh
//     report from a stale one by seeing its sequence number change on
//     their own clock, never by comparing another node's clock with theirs.
//   - A prune needs a majority of the voters (quorum) to report the member
//     unreachable for the whole period: Judge.

// Sighting is what one observer saw of one member.
type Sighting struct {
	Name      string `json:"name"`
	Reachable bool   `json:"reachable"`
	// DownMillis is how long the observer has seen the member unreachable
	// without a break (0 when reachable), on its own monotonic clock.
	DownMillis int64 `json:"downMs,omitempty"`
}

// Down is DownMillis as a duration.
func (s Sighting) Down() time.Duration { return time.Duration(s.DownMillis) * time.Millisecond }

// Report is one observer's view of every member, published in etcd.
type Report struct {
	// Observer is the node name of the vigil that wrote it.
	Observer string `json:"observer"`
	// Member is the observer's own etcd member: its view counts as a
	// voter's view only while that member is a healthy voter.
	Member string `json:"member"`
	// Seq grows with every report; readers judge freshness by it.
	Seq uint64 `json:"seq"`
	// WatchingMillis is how long the observer has observed without a gap.
	WatchingMillis int64 `json:"watchingMs"`
	// Members maps member IDs (hexadecimal) to sightings.
	Members map[string]Sighting `json:"members"`
	// Format is vigil.RecordFormat, set by Publish (0: vigil 0.3.0 or
	// before). Readers ignore fields they do not know.
	Format int `json:"format,omitempty"`
}

// Tracker keeps, per member, since when this process has seen it
// unreachable without a break, on the monotonic clock.
type Tracker struct {
	// MaxGap is the longest time between two observations that still
	// counts as continuous.
	MaxGap time.Duration

	last    time.Time            // the latest observation (monotonic)
	start   time.Time            // the start of the current run of observations without a gap
	since   map[uint64]time.Time // start of each member's current unreachable run
	reached map[uint64]bool      // last observation of each member
	names   map[uint64]string
}

// NewTracker returns a tracker that restarts every count after a gap
// longer than maxGap.
func NewTracker(maxGap time.Duration) *Tracker {
	return &Tracker{MaxGap: maxGap, since: map[uint64]time.Time{}, reached: map[uint64]bool{}, names: map[uint64]string{}}
}

// Observe records v, observed from start to end: a member unreachable in
// v did not answer at any time in between.
func (t *Tracker) Observe(v View, start, end time.Time) {
	if t.last.IsZero() || start.Sub(t.last) > t.MaxGap {
		// Nothing is known of the time in between: every count starts
		// again, now.
		t.start = start
		clear(t.since)
	}
	at := start
	t.last = end
	seen := map[uint64]bool{}
	for _, m := range v.Members {
		seen[m.ID] = true
		t.names[m.ID] = m.Name
		t.reached[m.ID] = m.Reachable
		if m.Reachable {
			delete(t.since, m.ID)
		} else if _, ok := t.since[m.ID]; !ok {
			t.since[m.ID] = at
		}
	}
	for id := range t.reached {
		if !seen[id] {
			delete(t.reached, id)
			delete(t.since, id)
			delete(t.names, id)
		}
	}
}

// Down tells how long member id has been seen unreachable without a break,
// up to the latest observation; 0 when it was reachable then.
func (t *Tracker) Down(id uint64) time.Duration {
	s, ok := t.since[id]
	if !ok {
		return 0
	}
	return t.last.Sub(s)
}

// Watching is how long this tracker has observed without a gap.
func (t *Tracker) Watching() time.Duration { return t.last.Sub(t.start) }

// Report is the tracker's view as a report of observer, whose own etcd
// member is member.
func (t *Tracker) Report(observer, member string, seq uint64) Report {
	r := Report{Observer: observer, Member: member, Seq: seq, WatchingMillis: t.Watching().Milliseconds(), Members: map[string]Sighting{}}
	for id, up := range t.reached {
		r.Members[fmt.Sprintf("%x", id)] = Sighting{Name: t.names[id], Reachable: up, DownMillis: t.Down(id).Milliseconds()}
	}
	return r
}

// Witness is one observer's testimony about one member, as Judge weighed it.
type Witness struct {
	Observer string `json:"observer"`
	Member   string `json:"member"`
	// Counted: the report is fresh and its observer's member is a healthy
	// voter (the first such report per voter).
	Counted bool `json:"counted"`
	// Why is why it was not counted.
	Why string `json:"why,omitempty"`
	// Seen: the report has a sighting of the member at all.
	Seen       bool  `json:"seen"`
	Reachable  bool  `json:"reachable"`
	DownMillis int64 `json:"downMs,omitempty"`
}

// Verdicts of Judge.
const (
	// Agreed: a majority of the voters have seen the member unreachable
	// for the whole period.
	Agreed = "agreed"
	// NotYet: a majority see it unreachable, not yet for the whole period.
	NotYet = "not-yet"
	// OneSided: fewer than a majority of the voters see it unreachable.
	OneSided = "one-sided"
)

// Case is the evidence about one unreachable member.
type Case struct {
	Member    Member    `json:"member"`
	Witnesses []Witness `json:"witnesses"`
	// Agree counts the voters that saw it unreachable for the whole period,
	// Down those that see it unreachable at all, Needed is the quorum.
	Agree   int    `json:"agree"`
	Down    int    `json:"down"`
	Needed  int    `json:"needed"`
	Verdict string `json:"verdict"`
	// SelfDownMillis is how long this process itself has seen it
	// unreachable (vigil run only).
	SelfDownMillis int64 `json:"selfDownMs,omitempty"`
}

// Judge weighs the reports about member m (unreachable in v) for a prune
// after minDown. fresh tells whether an observer's report is fresh. A
// report counts only when it is fresh and its observer's own member is a
// voter that is reachable in v; each voter counts once.
func (v View) Judge(m Member, minDown time.Duration, reports []Report, fresh func(observer string) bool) Case {
	voters, _ := v.counts()
	c := Case{Member: m, Needed: quorum(voters)}
	healthyVoter := map[string]bool{}
	for _, x := range v.Members {
		if !x.Learner && x.Reachable && x.Name != "" {
			healthyVoter[x.Name] = true
		}
	}
	counted := map[string]bool{}
	slices.SortFunc(reports, func(a, b Report) int { return strings.Compare(a.Observer, b.Observer) })
	for _, r := range reports {
		w := Witness{Observer: r.Observer, Member: r.Member}
		s, ok := r.Members[m.IDString()]
		if ok {
			w.Seen, w.Reachable, w.DownMillis = true, s.Reachable, s.DownMillis
		}
		switch {
		case !fresh(r.Observer):
			w.Why = "report not renewed lately (vigil stopped or stuck there)"
		case !healthyVoter[r.Member]:
			w.Why = fmt.Sprintf("its member %q is not a healthy voter", r.Member)
		case counted[r.Member]:
			w.Why = fmt.Sprintf("member %q has a report already", r.Member)
		case !ok:
			w.Why = "no sighting of this member yet"
		default:
			w.Counted = true
			counted[r.Member] = true
			if !s.Reachable {
				c.Down++
				if s.Down() >= minDown {
					c.Agree++
				}
			}
		}
		c.Witnesses = append(c.Witnesses, w)
	}
	switch {
	case c.Agree >= c.Needed:
		c.Verdict = Agreed
	case c.Down >= c.Needed:
		c.Verdict = NotYet
	default:
		c.Verdict = OneSided
	}
	return c
}

// Evidence says in one line who saw what, e.g.
// "2 of 3 needed: cp1 down 12s, cp2 down 11s, cp3 (not counted: …)".
func (c Case) Evidence() string {
	var parts []string
	for _, w := range c.Witnesses {
		var s string
		switch {
		case !w.Seen:
			s = "no sighting"
		case w.Reachable:
			s = "reaches it"
		default:
			s = "down " + (time.Duration(w.DownMillis) * time.Millisecond).Round(100*time.Millisecond).String()
		}
		if !w.Counted {
			s += " (not counted: " + w.Why + ")"
		}
		parts = append(parts, w.Observer+" "+s)
	}
	if len(parts) == 0 {
		parts = append(parts, "no vigil has reported")
	}
	out := fmt.Sprintf("%d of %d voters needed agree: %s", c.Agree, c.Needed, strings.Join(parts, ", "))
	if c.Member.Raft != nil {
		out += "; raft: " + c.Member.Raft.String()
	}
	return out
}

// Book tells fresh reports from stale ones on the reader's own clock: a
// report is fresh while its sequence number was last seen to change within
// Stale. A report seen for the first time is not fresh until it changes.
type Book struct {
	Stale time.Duration
	seen  map[string]bookEntry
}

type bookEntry struct {
	seq     uint64
	changed time.Time // monotonic; zero until a change was seen
}

// NewBook returns a book that calls a report stale after stale without a
// change.
func NewBook(stale time.Duration) *Book { return &Book{Stale: stale, seen: map[string]bookEntry{}} }

// Note records the reports read at now.
func (b *Book) Note(reports []Report, now time.Time) {
	present := map[string]bool{}
	for _, r := range reports {
		present[r.Observer] = true
		e, ok := b.seen[r.Observer]
		switch {
		case !ok:
			b.seen[r.Observer] = bookEntry{seq: r.Seq}
		case e.seq != r.Seq:
			b.seen[r.Observer] = bookEntry{seq: r.Seq, changed: now}
		}
	}
	for o := range b.seen {
		if !present[o] {
			delete(b.seen, o)
		}
	}
}

// Fresh tells whether observer's report changed within Stale of now.
func (b *Book) Fresh(observer string, now time.Time) bool {
	e, ok := b.seen[observer]
	return ok && !e.changed.IsZero() && now.Sub(e.changed) <= b.Stale
}
