package lab

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/vigil-ha/vigil/internal/clock"
	"github.com/vigil-ha/vigil/internal/netfault"
)

// SweepConfig configures `vigil-lab gray sweep`: every step holds one gray
// fault on the whole lab for Each, then heals it.
type SweepConfig struct {
	// Latencies are delays put on every etcd answer, to every client.
	Latencies []time.Duration
	// Losses are shares (%) of packets dropped on every path between the
	// nodes, in both directions (each packet once, by its receiver).
	Losses []int
	// Each is how long every step holds its fault.
	Each time.Duration
	// Progress, when set, is called after every step.
	Progress func(SweepRow)
}

// Validate refuses a sweep that could not run, before any lab is touched.
func (cfg SweepConfig) Validate() error {
	if cfg.Each <= 0 {
		return fmt.Errorf("lab: gray sweep --each %v must be positive", cfg.Each)
	}
	if len(cfg.Latencies)+len(cfg.Losses) == 0 {
		return errors.New("lab: gray sweep needs latencies or losses")
	}
	for _, d := range cfg.Latencies {
		if err := (netfault.Delay{Latency: d}).Validate(); err != nil {
			return err
		}
	}
	for _, p := range cfg.Losses {
		if err := (Loss{Pct: p, Dir: DirBoth}).Validate(); err != nil {
			return err
		}
	}
	return nil
}

// SweepRow is one step of the sweep and what the lab saw during it.
type SweepRow struct {
	Fault         string  `json:"fault"`
	LatencyMillis float64 `json:"latencyMillis,omitempty"`
	LossPct       int     `json:"lossPct,omitempty"`
	HeldMillis    float64 `json:"heldMillis"`
	// OutageMillis is the longest gap in the client's answers from the
	// VIP (every 10 ms) while the fault held, and until it had healed.
	OutageMillis float64 `json:"outageMillis"`
	// VIPMoves counts changes of the node holding the VIP (sampled on
	// every node every 20 ms).
	VIPMoves int `json:"vipMoves"`
	// DualSamples are samples with the VIP on two nodes at once.
	DualSamples    int     `json:"dualSamples"`
	NoHolderMillis float64 `json:"noHolderMillis"`
	// MinMarginMillis is the least renewal margin the holder reported
	// (time left to its deadline when a renewal was answered); -1 when
	// no holder reported one.
	MinMarginMillis float64 `json:"minMarginMillis"`
	// BackMillis is how long after the fault was healed the client was
	// answered again (0 when it never stopped).
	BackMillis float64 `json:"backMillis"`
	// EtcdTerms is how far etcd's raft term moved during the step: 0 when
	// etcd elected no leader (-1 when it could not be read).
	EtcdTerms int `json:"etcdTerms"`
}

func (r SweepRow) String() string {
	margin := "-"
	if r.MinMarginMillis >= 0 {
		margin = fmt.Sprintf("%.0fms", r.MinMarginMillis)
	}
	return fmt.Sprintf("%-14s held %5.1fs  outage %7.0fms  VIP moves %2d  dual-holder samples %d  no holder %7.0fms  least renewal margin %6s  back %5.0fms after heal  etcd elections %d",
		r.Fault, r.HeldMillis/1000, r.OutageMillis, r.VIPMoves, r.DualSamples, r.NoHolderMillis, margin, r.BackMillis, r.EtcdTerms)
}

// GraySweep runs every step of cfg against the lab, in order: latencies,
// then losses. It stops early only when the lab cannot be used.
func (l *Lab) GraySweep(ctx context.Context, cfg SweepConfig) ([]SweepRow, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if l.st.Settings.Impl != ImplVigil || l.st.Settings.Kubeadm {
		return nil, errors.New("lab: the gray sweep needs a vigil lab with its own etcd (not --kubeadm)")
	}
	c, err := l.newChaos(ChaosConfig{})
	if err != nil {
		return nil, err
	}
	defer c.close()
	// Whatever happens, leave the lab as it was.
	defer func() {
		cctx := context.WithoutCancel(ctx)
		_ = l.SetEtcdLatency(cctx, nil, netfault.Delay{})
		_ = l.ClearGray(cctx)
	}()
	var rows []SweepRow
	step := func(row SweepRow, inject, heal func() error) error {
		if _, err := l.waitStable(ctx, recoverTimeout); err != nil {
			return fmt.Errorf("lab not stable before %s: %w", row.Fault, err)
		}
		termBefore := l.raftTerm(ctx)
		begin := time.Now()
		if err := inject(); err != nil {
			return fmt.Errorf("%s: %w", row.Fault, err)
		}
		row.MinMarginMillis = l.watchMargins(ctx, cfg.Each)
		healed := time.Now()
		if err := heal(); err != nil {
			return fmt.Errorf("heal %s: %w", row.Fault, err)
		}
		row.HeldMillis = millis(healed.Sub(begin))
		back, err := waitAnswering(ctx, c.pr, "", healed)
		if err != nil {
			return fmt.Errorf("after %s: %w", row.Fault, err)
		}
		if _, err := l.waitStable(ctx, recoverTimeout); err != nil {
			return fmt.Errorf("after %s: %w", row.Fault, err)
		}
		end := time.Now()
		row.EtcdTerms = -1
		if after := l.raftTerm(ctx); termBefore > 0 && after > 0 {
			row.EtcdTerms = int(after - termBefore)
		}
		samples := c.smp.between(begin, end)
		dual, _, none := judgeSamples(samples)
		row.DualSamples, row.NoHolderMillis = dual, millis(none)
		row.VIPMoves = holderMoves(samples)
		row.OutageMillis = millis(longestGap(c.pr.snapshot(), begin, end))
		if back.After(healed) {
			row.BackMillis = millis(back.Sub(healed))
		}
		rows = append(rows, row)
		if cfg.Progress != nil {
			cfg.Progress(row)
		}
		return nil
	}
	for _, d := range cfg.Latencies {
		row := SweepRow{Fault: "latency " + d.String(), LatencyMillis: millis(d)}
		err := step(row,
			func() error { return l.SetEtcdLatency(ctx, nil, netfault.Delay{Latency: d}) },
			func() error { return l.SetEtcdLatency(context.WithoutCancel(ctx), nil, netfault.Delay{}) })
		if err != nil {
			return rows, err
		}
	}
	for _, p := range cfg.Losses {
		row := SweepRow{Fault: fmt.Sprintf("loss %d%%", p), LossPct: p}
		err := step(row,
			func() error {
				for _, n := range l.st.Nodes {
					// On input only: each packet between two nodes is
					// dropped with probability p once, by its receiver.
					if err := l.SetLoss(ctx, Loss{Node: n.Name, Pct: p, Dir: DirIn}); err != nil {
						return err
					}
				}
				return nil
			},
			func() error { return l.ClearGray(context.WithoutCancel(ctx)) })
		if err != nil {
			return rows, err
		}
	}
	return rows, nil
}

// raftTerm is etcd's highest raft term now, 0 when it cannot be read.
func (l *Lab) raftTerm(ctx context.Context) uint64 {
	st, err := l.etcdStatus(ctx)
	if err != nil {
		return 0
	}
	return st.RaftTerm
}

// watchMargins reads the holders' renewal margins every 250 ms for d and
// returns the least, in ms (-1 when none was reported).
func (l *Lab) watchMargins(ctx context.Context, d time.Duration) float64 {
	least := math.Inf(1)
	end := time.Now().Add(d)
	for time.Now().Before(end) && ctx.Err() == nil {
		for _, n := range l.st.Nodes {
			rep, err := l.vigilStatus(ctx, n.Name)
			if err == nil && rep.Leader && rep.Renewal != nil {
				least = math.Min(least, rep.Renewal.MinMarginMillis)
			}
		}
		clock.Sleep(ctx, 250*time.Millisecond)
	}
	if math.IsInf(least, 1) {
		return -1
	}
	return least
}

// holderMoves counts how often the single holder changed across samples;
// samples with no holder or two are passed over.
func holderMoves(ss []sample) int {
	moves, last := 0, ""
	for _, s := range ss {
		if len(s.holders) != 1 {
			continue
		}
		if last != "" && s.holders[0] != last {
			moves++
		}
		last = s.holders[0]
	}
	return moves
}
