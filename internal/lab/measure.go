package lab

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// longestGap is the longest time between consecutive answers, counted from
// the last answer before from, up to to.
func longestGap(rs []reply, from, to time.Time) time.Duration {
	var prev time.Time
	var gap time.Duration
	for _, r := range rs {
		if r.at.Before(from) {
			prev = r.at
			continue
		}
		if r.at.After(to) {
			break
		}
		if !prev.IsZero() {
			gap = max(gap, r.at.Sub(prev))
		}
		prev = r.at
	}
	if !prev.IsZero() && to.Sub(prev) > gap {
		gap = max(gap, to.Sub(prev))
	}
	return gap
}

// judgeSplit looks for two holders at once, and for answers that alternate
// between nodes (two switches within a second).
func judgeSplit(doubles []doubleHold, rs []reply, since time.Time) (bool, string) {
	var details []string
	if len(doubles) > 0 {
		first, last := doubles[0], doubles[len(doubles)-1]
		details = append(details, fmt.Sprintf("VIP on %s at once in %d samples, %+.0fms to %+.0fms after the fault",
			strings.Join(first.holders, "+"), len(doubles), millis(first.at.Sub(since)), millis(last.at.Sub(since))))
	}
	type change struct {
		at       time.Time
		from, to string
	}
	var changes []change
	for i := 1; i < len(rs); i++ {
		if rs[i].at.After(since) && rs[i].node != rs[i-1].node {
			changes = append(changes, change{rs[i].at, rs[i-1].node, rs[i].node})
		}
	}
	for i := 1; i < len(changes); i++ {
		a, b := changes[i-1], changes[i]
		if b.at.Sub(a.at) < time.Second {
			details = append(details, fmt.Sprintf("answers went %s -> %s -> %s within %.0fms, %+.0fms after the fault",
				a.from, a.to, b.to, millis(b.at.Sub(a.at)), millis(a.at.Sub(since))))
			break
		}
	}
	return len(details) > 0, strings.Join(details, "; ")
}

func lastBefore(rs []reply, t time.Time) string {
	s := ""
	for _, r := range rs {
		if r.at.After(t) {
			break
		}
		s = r.node
	}
	return s
}

func nodeAt(rs []reply, t time.Time) string {
	for _, r := range rs {
		if !r.at.Before(t) {
			return r.node
		}
	}
	return ""
}

// Summary aggregates results of one drill kind.
type Summary struct {
	Drill        string  `json:"drill"`
	Impl         string  `json:"impl"`
	Runs         int     `json:"runs"`
	Failed       int     `json:"failed"`
	SplitBrains  int     `json:"splitBrains"`
	MinMillis    float64 `json:"minMillis"`
	MedianMillis float64 `json:"medianMillis"`
	MaxMillis    float64 `json:"maxMillis"`
	// Families are the outages per VIP family, in labs with IPv6.
	Families []FamilySummary `json:"families,omitempty"`
	// MaxSkewMillis, in a dual-stack lab, is the furthest apart the two
	// families switched in any run.
	MaxSkewMillis float64 `json:"maxSkewMillis,omitempty"`
}

// FamilySummary is one family's outages over the runs of a drill.
type FamilySummary struct {
	Family       string  `json:"family"`
	MedianMillis float64 `json:"medianMillis"`
	MaxMillis    float64 `json:"maxMillis"`
}

// Summarize groups results by drill, in first-seen order.
func Summarize(rs []Result) []Summary {
	var order []string
	by := map[string][]Result{}
	for _, r := range rs {
		if _, ok := by[r.Drill]; !ok {
			order = append(order, r.Drill)
		}
		by[r.Drill] = append(by[r.Drill], r)
	}
	var out []Summary
	for _, k := range order {
		s := Summary{Drill: k, Impl: by[k][0].Impl, Runs: len(by[k])}
		var o []float64
		for _, r := range by[k] {
			if !r.OK() {
				s.Failed++
			}
			if r.SplitBrain {
				s.SplitBrains++
			}
			if r.Error == "" {
				o = append(o, r.OutageMillis)
			}
		}
		if len(o) > 0 {
			sort.Float64s(o)
			s.MinMillis, s.MaxMillis = o[0], o[len(o)-1]
			s.MedianMillis = median(o)
		}
		s.summarizeFamilies(by[k])
		out = append(out, s)
	}
	return out
}

func (s *Summary) summarizeFamilies(rs []Result) {
	var order []string
	by := map[string][]float64{}
	for _, r := range rs {
		if r.Error != "" {
			continue
		}
		s.MaxSkewMillis = max(s.MaxSkewMillis, r.SkewMillis)
		for _, f := range r.Families {
			if _, ok := by[f.Family]; !ok {
				order = append(order, f.Family)
			}
			by[f.Family] = append(by[f.Family], f.OutageMillis)
		}
	}
	for _, fam := range order {
		o := by[fam]
		sort.Float64s(o)
		s.Families = append(s.Families, FamilySummary{Family: fam, MedianMillis: median(o), MaxMillis: o[len(o)-1]})
	}
}

func median(sorted []float64) float64 {
	n := len(sorted)
	if n%2 == 1 {
		return sorted[n/2]
	}
	return (sorted[n/2-1] + sorted[n/2]) / 2
}

func (s Summary) String() string {
	out := fmt.Sprintf("%-17s %-16s runs %3d  outage min %6.0fms  median %6.0fms  max %6.0fms  split-brain %d  failed %d",
		s.Drill, s.Impl, s.Runs, s.MinMillis, s.MedianMillis, s.MaxMillis, s.SplitBrains, s.Failed)
	for _, f := range s.Families {
		out += fmt.Sprintf("\n%-17s   %s: median %6.0fms  max %6.0fms", "", f.Family, f.MedianMillis, f.MaxMillis)
	}
	if len(s.Families) > 1 {
		out += fmt.Sprintf("\n%-17s   families switched at most %.0fms apart", "", s.MaxSkewMillis)
	}
	return out
}

func millis(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func yesNo(b bool) string {
	if b {
		return "YES"
	}
	return "no"
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
