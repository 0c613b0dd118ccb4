package main

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/vigil-ha/vigil/internal/lab"
)

func newChaosCmd(g *globals) *cobra.Command {
	var (
		s        lab.Settings
		cfg      lab.ChaosConfig
		faults   []string
		asJSON   bool
		seedFlag int64
	)
	cmd := &cobra.Command{
		Use:   "chaos --duration D --seed N [--faults kill,pause,...]",
		Short: "Inject random faults into a fresh lab for a while and check that the VIP never has two holders",
		Long: `Build a vigil lab (each node with a second link, vip0, that carries only the
VIP), inject faults at random times with random durations until --duration has
passed, judge the invariants around every fault, print a table, and remove the
lab. Before each fault the lab settles: every etcd member follows one leader
and one node holds the VIP, so that each fault is judged on its own.

With --announce bgp the lab is the routed one (a BIRD router between the
nodes and the client, docs/bgp.md): the VIP sits on lo, there is no VIP link,
and the default faults leave out vip-link-down and flap.

Faults (--faults, default all):
  kill              power the holder off (links cut, every process SIGKILLed) for
                    1-3 s, then boot it
  graceful          SIGTERM the holder's vigil; start it again 0.2-2 s later
  partition         cut the holder's links for 1-5 s
  kill-daemon       SIGKILL the holder's vigil only (its guard stays)
  kill-etcd-leader  SIGKILL the etcd raft leader (not the holder) for 1-3 s
  pause             SIGSTOP the holder's vigil for 2 s to --max-pause
  freeze            SIGSTOP the holder's vigil and its guard together for
                    0.5-3 s (a frozen cgroup, a paused container)
  guard-stop        SIGSTOP the holder's guard, 1-2.5 s later its vigil too,
                    for 1-3 s (the holder must notice the silent guard first)
  impostor-etcd     a fresh one-member etcd at a non-holder's member address
                    for 3-8 s (see vigil-lab drill --help)
  stray-vip         add the VIP on a non-holder, as re-applied network config does
  stray-prefix      the same with another prefix length (/32 beside a /24)
  stray-lo          the same on lo (Linux answers ARP for it on any interface)
  vip-link-down     take the holder's VIP link down for 1-4 s (etcd's stays up)
  flap              VIP link down and up again within 0.1-0.9 s
  duplicate-name    start a second vigil with the holder's --node-name on
                    another node (a cloned VM)
  latency           every etcd answer late by 100-700 ms (jitter up to 50 ms)
                    for 2-6 s, to every client or to the holder only; raft
                    stays healthy
  loss              drop 5-30 % of the packets on every path between the
                    nodes for 2-6 s
  one-way           the holder hears nothing from its peers, or they hear
                    nothing from it, for 1-5 s
  slow-process      SIGSTOP/SIGCONT cycling (stopped 20-150 ms, running
                    20-100 ms) of the holder's vigil or of an etcd member
                    for 2-6 s

Invariants, sampled at the source: every node's addresses are read through
netlink every 20 ms; the client probes the VIP every 10 ms. A fault breaks an
invariant when two nodes hold the VIP in any sample (for freeze: longer than
--freeze-bound, since nothing on the frozen node runs and the kernel lifetime
is the fence), when the lab has no single holder 30 s after the heal, when a
stray VIP lives over 1 s, when a thawed node keeps the VIP over 100 ms, or when
a duplicate name is not refused. The nodes' logs of such a fault, and of any
fault whose outage exceeded --slow, are kept in --logs. Exits non-zero if any fault broke an invariant.

The seed fixes the sequence of faults, targets and durations; timings on a
real machine vary from run to run.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) (err error) {
			if seedFlag < 0 {
				return fmt.Errorf("--seed %d: must not be negative", seedFlag)
			}
			cfg.Seed = uint64(seedFlag)
			for _, f := range faults {
				if f = strings.TrimSpace(f); f != "" {
					cfg.Faults = append(cfg.Faults, f)
				}
			}
			// A second link carrying only the VIP, for the link faults;
			// the routed lab's VIP sits on lo and has none.
			s.VIPLink = s.Announce != lab.AnnounceBGP
			if len(cfg.Faults) == 0 {
				cfg.Faults = lab.DefaultFaults(s)
			}
			if err := cfg.Validate(s); err != nil {
				return err
			}
			if err := s.Validate(); err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if !asJSON {
				if s.VIPLink {
					fmt.Fprintf(out, "building a %d-node lab with a separate VIP link per node...\n", s.Nodes)
				} else {
					fmt.Fprintf(out, "building a %d-node routed lab (--announce %s)...\n", s.Nodes, s.Announce)
				}
			}
			l, down, err := upLab(cmd, g, s, asJSON)
			if err != nil {
				return err
			}
			defer func() { err = errors.Join(err, down()) }()
			if !asJSON {
				fmt.Fprintf(out, "chaos for %v, seed %d, faults %s\n", cfg.Duration, cfg.Seed, strings.Join(orAll(cfg.Faults), ","))
				cfg.Progress = func(r lab.FaultResult) { fmt.Fprintln(out, r) }
			}
			start := time.Now()
			rs, err := l.Chaos(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			return chaosReport(out, rs, cfg, time.Since(start), asJSON)
		},
	}
	addSettingsFlags(cmd, &s)
	f := cmd.Flags()
	f.DurationVar(&cfg.Duration, "duration", 3*time.Minute, "how long to inject faults (the last one is finished after this)")
	f.Int64Var(&seedFlag, "seed", 1, "random seed: the sequence of faults, targets and durations")
	f.StringSliceVar(&faults, "faults", nil, "comma-separated fault kinds to draw from (default: all): "+strings.Join(lab.ChaosFaults, ","))
	f.DurationVar(&cfg.MaxPause, "max-pause", 10*time.Second, "longest SIGSTOP of the pause fault (at least 2s)")
	f.DurationVar(&cfg.FreezeBound, "freeze-bound", lab.DefaultFreezeBound, "longest time two nodes may hold the VIP while vigil and its guard are frozen together")
	f.StringVar(&cfg.LogDir, "logs", "vigil-chaos-logs", "directory for the nodes' logs of every fault that broke an invariant (or was slow, see --slow)")
	f.DurationVar(&cfg.SlowOutage, "slow", time.Second, "also keep the logs of faults whose outage was longer than this (0: only failed faults)")
	f.BoolVar(&asJSON, "json", false, "print every fault and the summary as JSON")
	return cmd
}

func orAll(f []string) []string {
	if len(f) == 0 {
		return lab.ChaosFaults
	}
	return f
}

// chaosReport prints the summary (or everything as JSON) and fails if any
// fault broke an invariant.
func chaosReport(out io.Writer, rs []lab.FaultResult, cfg lab.ChaosConfig, took time.Duration, asJSON bool) error {
	sum := lab.SummarizeChaos(rs)
	bad, dual := 0, 0
	for _, r := range rs {
		if !r.OK() {
			bad++
		}
		if r.Kind != lab.FaultFreeze {
			dual += r.DualSamples
		}
	}
	if asJSON {
		if err := writeJSON(out, map[string]any{"seed": cfg.Seed, "durationSeconds": took.Seconds(), "faults": rs, "summary": sum}); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(out, "\nsummary: %d faults in %v, seed %d (outage = longest gap between the client's answers; samples of every node's addresses every 20 ms):\n",
			len(rs), took.Round(time.Second), cfg.Seed)
		for _, s := range sum {
			fmt.Fprintln(out, " ", s)
		}
		fmt.Fprintf(out, "dual-holder samples outside freeze: %d; faults that broke an invariant: %d\n", dual, bad)
	}
	if bad > 0 {
		return fmt.Errorf("%d of %d faults broke an invariant (logs in %s)", bad, len(rs), cfg.LogDir)
	}
	return nil
}
