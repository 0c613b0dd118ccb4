package lab

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// sample is which live nodes had the VIP at one moment, read through
// netlink in every node's namespace.
type sample struct {
	at      time.Time
	holders []string
}

// sampler reads the VIP's presence on every live node every interval, for
// the whole chaos run: the one-holder invariant is checked at its source,
// not inferred from what the client saw.
type sampler struct {
	w    *vipWatch
	live func() []*Node
	wg   sync.WaitGroup
	stop chan struct{}

	mu      sync.Mutex // guards samples and skip
	samples []sample
	skip    string // a node left out (a stray the fault put there on purpose)
}

func startSampler(nodes []*Node, live func() []*Node, interval time.Duration) (*sampler, error) {
	w, err := newVIPWatch(nodes)
	if err != nil {
		return nil, err
	}
	s := &sampler{w: w, live: live, stop: make(chan struct{})}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			s.mu.Lock()
			skip := s.skip
			s.mu.Unlock()
			var nodes []*Node
			for _, n := range s.live() {
				if n.Name != skip {
					nodes = append(nodes, n)
				}
			}
			// A read error leaves a gap in the samples; the next one counts.
			if h, err := w.holders(nodes); err == nil {
				s.mu.Lock()
				s.samples = append(s.samples, sample{at: time.Now(), holders: h})
				s.mu.Unlock()
			}
			select {
			case <-s.stop:
				return
			case <-t.C:
			}
		}
	}()
	return s, nil
}

// exclude leaves node out of the samples ("" for none).
func (s *sampler) exclude(node string) {
	s.mu.Lock()
	s.skip = node
	s.mu.Unlock()
}

// between returns the samples taken in [from, to].
func (s *sampler) between(from, to time.Time) []sample {
	s.mu.Lock()
	defer s.mu.Unlock()
	i := sort.Search(len(s.samples), func(i int) bool { return !s.samples[i].at.Before(from) })
	var out []sample
	for ; i < len(s.samples) && !s.samples[i].at.After(to); i++ {
		out = append(out, s.samples[i])
	}
	return out
}

// count returns how many samples were taken.
func (s *sampler) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.samples)
}

// close stops sampling. Safe to call twice.
func (s *sampler) close() {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	s.wg.Wait()
	s.w.close()
}

// childPIDs lists the processes whose parent is pid (vigil's guard).
func childPIDs(pid int) []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) > 1 && f[1] == strconv.Itoa(pid) {
			out = append(out, p)
		}
	}
	return out
}

// logMarks records the size of every node's logs, so the part a fault wrote
// can be kept.
func (l *Lab) logMarks() map[string]int64 {
	marks := map[string]int64{}
	for _, n := range l.st.Nodes {
		files, _ := filepath.Glob(filepath.Join(l.nodeDir(n), "*.log"))
		for _, f := range files {
			if fi, err := os.Stat(f); err == nil {
				marks[f] = fi.Size()
			}
		}
	}
	return marks
}

// keepLogs copies what every node logged since marks into dir/name and
// returns that directory ("" if nothing could be kept).
func (l *Lab) keepLogs(dir, name string, marks map[string]int64) string {
	out := filepath.Join(dir, name)
	if err := os.MkdirAll(out, 0o755); err != nil {
		l.log.Warn("cannot keep logs", "err", err)
		return ""
	}
	for _, n := range l.st.Nodes {
		files, _ := filepath.Glob(filepath.Join(l.nodeDir(n), "*.log"))
		for _, f := range files {
			if err := copyFrom(f, marks[f], filepath.Join(out, n.Name+"-"+filepath.Base(f))); err != nil {
				l.log.Warn("cannot keep a log", "file", f, "err", err)
			}
		}
	}
	return out
}

func copyFrom(src string, off int64, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	if _, err := in.Seek(off, io.SeekStart); err != nil {
		return err
	}
	outf, err := os.Create(dst)
	if err != nil {
		return err
	}
	_, err = io.Copy(outf, in)
	return errors.Join(err, outf.Close())
}

// runWithTimeout runs bin in node's namespace, waits up to limit for it to
// exit (killing it then) and returns its output and exit code. err is set
// only when it could not start or had to be killed.
func (l *Lab) runWithTimeout(ctx context.Context, n *Node, limit time.Duration, bin string, args ...string) (string, int, error) {
	cctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	var out bytes.Buffer
	cmd := exec.CommandContext(cctx, "ip", append([]string{"netns", "exec", nodeNS(n.Name), bin}, args...)...)
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if cctx.Err() != nil {
		return out.String(), -1, fmt.Errorf("still running after %v", limit)
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return out.String(), ee.ExitCode(), nil
	}
	if err != nil {
		return out.String(), -1, err
	}
	return out.String(), 0, nil
}

// ChaosSummary aggregates the faults of one kind.
type ChaosSummary struct {
	Kind                 string  `json:"kind"`
	Count                int     `json:"count"`
	Failed               int     `json:"failed"`
	OutageMedianMillis   float64 `json:"outageMedianMillis"`
	OutageWorstMillis    float64 `json:"outageWorstMillis"`
	DualSamples          int     `json:"dualSamples"`
	DualWorstMillis      float64 `json:"dualWorstMillis"`
	NoHolderMedianMillis float64 `json:"noHolderMedianMillis"`
	NoHolderWorstMillis  float64 `json:"noHolderWorstMillis"`
	// ExtraWorstMillis is the worst stray lifetime (stray-vip) or the
	// worst time a thawed node kept the VIP (freeze), over ExtraCount
	// measurements (a node whose VIP the kernel had already dropped at the
	// thaw gives none).
	ExtraWorstMillis float64 `json:"extraWorstMillis,omitempty"`
	ExtraCount       int     `json:"extraCount,omitempty"`
}

// SummarizeChaos groups fault results by kind, in ChaosFaults order.
func SummarizeChaos(rs []FaultResult) []ChaosSummary {
	var out []ChaosSummary
	for _, kind := range ChaosFaults {
		var outages, none []float64
		s := ChaosSummary{Kind: kind}
		for _, r := range rs {
			if r.Kind != kind {
				continue
			}
			s.Count++
			if !r.OK() {
				s.Failed++
			}
			s.DualSamples += r.DualSamples
			s.DualWorstMillis = max(s.DualWorstMillis, r.DualMillis)
			extra, measured := r.StrayGoneMillis, isStray(kind)
			if kind == FaultFreeze {
				extra, measured = r.ThawDropMillis, r.ThawDropMillis >= 0
			}
			if measured {
				s.ExtraWorstMillis = max(s.ExtraWorstMillis, extra)
				s.ExtraCount++
			}
			outages = append(outages, r.OutageMillis)
			none = append(none, r.NoHolderMillis)
		}
		if s.Count == 0 {
			continue
		}
		sort.Float64s(outages)
		sort.Float64s(none)
		s.OutageMedianMillis, s.OutageWorstMillis = median(outages), outages[len(outages)-1]
		s.NoHolderMedianMillis, s.NoHolderWorstMillis = median(none), none[len(none)-1]
		out = append(out, s)
	}
	return out
}

func (s ChaosSummary) String() string {
	extra := ""
	switch {
	case isStray(s.Kind):
		extra = fmt.Sprintf("  stray lived at most %.1fms", s.ExtraWorstMillis)
	case s.Kind == FaultFreeze:
		extra = fmt.Sprintf("  two holders at most %.0fms; a thawed node kept the VIP at most %.1fms (%d of %d thawed with the VIP still on)",
			s.DualWorstMillis, s.ExtraWorstMillis, s.ExtraCount, s.Count)
	}
	return fmt.Sprintf("%-16s faults %4d  outage median %5.0fms  worst %6.0fms  no holder median %5.0fms  worst %6.0fms  dual-holder samples %3d  failed %d%s",
		s.Kind, s.Count, s.OutageMedianMillis, s.OutageWorstMillis, s.NoHolderMedianMillis, s.NoHolderWorstMillis, s.DualSamples, s.Failed, extra)
}
