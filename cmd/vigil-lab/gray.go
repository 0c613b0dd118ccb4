package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/vigil-ha/vigil/internal/lab"
	"github.com/vigil-ha/vigil/internal/netfault"
)

func newGrayCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "gray latency|loss|one-way|clear|sweep",
		Short: "Make the running lab slow, lossy or one-sided, and measure what vigil does",
		Long: `Gray faults on the lab that "vigil-lab up" built: nothing dies, something
gets slow, lossy or one-sided.

  latency D   every etcd answer late by D (a proxy in front of each member's
              client port, which the member advertises; raft is untouched)
  loss PCT    drop PCT % of the packets between nodes (nftables numgen random)
  one-way     drop one direction between a node and its peers
  clear       remove every gray fault
  sweep       hold each latency and loss in turn on the whole lab and print
              the client outage, VIP moves, dual-holder samples and the
              holder's least renewal margin of each (bench/gray/run.sh)

Every value is checked before the lab is touched.`,
		Args: cobra.NoArgs,
	}
	cmd.AddCommand(newGrayLatencyCmd(g), newGrayLossCmd(g), newGrayOneWayCmd(g), newGrayClearCmd(g), newGraySweepCmd(g))
	return cmd
}

// openUp opens the lab that is up.
func openUp(g *globals) (*lab.Lab, error) {
	l, err := g.open()
	if err != nil {
		return nil, err
	}
	return l, l.Open()
}

func newGrayLatencyCmd(g *globals) *cobra.Command {
	var (
		nodes []string
		from  []string
		d     netfault.Delay
	)
	cmd := &cobra.Command{
		Use:   "latency D",
		Short: "Delay every etcd answer by D (0 to clear)",
		Long: `Delay every answer of the etcd members on --nodes (default all) by D, plus
a uniform 0..--jitter, to the clients on --from (default every client: a
per-path delay otherwise). D is a Go duration: 250ms, 1s; 0 clears it.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var err error
			if d.Latency, err = time.ParseDuration(args[0]); err != nil {
				return fmt.Errorf("latency %q: %w", args[0], err)
			}
			if err := d.Validate(); err != nil {
				return err
			}
			l, err := openUp(g)
			if err != nil {
				return err
			}
			for _, name := range from {
				ip, err := l.NodeIP(name)
				if err != nil {
					return err
				}
				d.From = append(d.From, ip)
			}
			return l.SetEtcdLatency(cmd.Context(), nodes, d)
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&nodes, "nodes", nil, "nodes whose etcd answers late (default: all)")
	f.StringSliceVar(&from, "from", nil, "only the answers to these nodes are late (default: every client)")
	f.DurationVar(&d.Jitter, "jitter", 0, "a further uniform random delay, 0 to this, per chunk; order is kept")
	return cmd
}

func newGrayLossCmd(g *globals) *cobra.Command {
	var (
		nodes []string
		peers []string
		dir   string
	)
	cmd := &cobra.Command{
		Use:   "loss PCT",
		Short: "Drop PCT % of the packets between nodes",
		Long: `Drop PCT % (0-100) of the IP packets between each of --nodes (default
all) and its --peers (default every other node), in --dir (in, out or both),
with nftables' numgen random. Loopback is never touched. With every node and
--dir in (the defaults) each packet between two nodes is dropped with
probability PCT % once, by its receiver: PCT % loss on every path, both
ways. --dir both on every node would drop it twice (at the sender and at the
receiver).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			pct, err := strconv.Atoi(strings.TrimSuffix(args[0], "%"))
			if err != nil {
				return fmt.Errorf("loss %q: not a whole percentage", args[0])
			}
			if err := (lab.Loss{Pct: pct, Dir: dir}).Validate(); err != nil {
				return err
			}
			l, err := openUp(g)
			if err != nil {
				return err
			}
			targets, err := l.NodeNames(nodes)
			if err != nil {
				return err
			}
			for _, n := range targets {
				if err := l.SetLoss(cmd.Context(), lab.Loss{Node: n, Pct: pct, Dir: dir, Peers: peers}); err != nil {
					return err
				}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&nodes, "nodes", nil, "nodes to put the rule on (default: all)")
	f.StringSliceVar(&peers, "peers", nil, "the other ends of the lossy paths (default: every other node)")
	f.StringVar(&dir, "dir", lab.DirIn, "in, out or both, seen from each of --nodes")
	return cmd
}

func newGrayOneWayCmd(g *globals) *cobra.Command {
	var (
		node  string
		peers []string
		dir   string
	)
	cmd := &cobra.Command{
		Use:   "one-way --node N --dir in|out",
		Short: "Cut one direction between a node and its peers",
		Long: `Drop every IP packet in one direction between --node and --peers (default
every other node): with --dir in the node hears nothing from them while they
still hear it; with --dir out the reverse. ARP still flows.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if node == "" {
				return errors.New("--node is required")
			}
			if dir != lab.DirIn && dir != lab.DirOut {
				return fmt.Errorf("--dir %q: in or out", dir)
			}
			l, err := openUp(g)
			if err != nil {
				return err
			}
			return l.SetOneWay(cmd.Context(), node, dir, peers)
		},
	}
	f := cmd.Flags()
	f.StringVar(&node, "node", "", "the node whose traffic is cut one way")
	f.StringSliceVar(&peers, "peers", nil, "the other ends (default: every other node)")
	f.StringVar(&dir, "dir", "", "in (the node hears nothing) or out (nothing it sends arrives)")
	return cmd
}

func newGrayClearCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "clear",
		Short: "Remove every gray fault: latency, loss and one-way rules",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			l, err := openUp(g)
			if err != nil {
				return err
			}
			return errors.Join(l.SetEtcdLatency(cmd.Context(), nil, netfault.Delay{}), l.ClearGray(cmd.Context()))
		},
	}
}

func newGraySweepCmd(g *globals) *cobra.Command {
	var (
		cfg       lab.SweepConfig
		latencies []time.Duration
		losses    []int
		asJSON    bool
	)
	cmd := &cobra.Command{
		Use:   "sweep [--latencies 0s,100ms,...] [--losses 1,5,20] [--each 30s]",
		Short: "Hold each latency and each loss on the whole lab in turn, and measure",
		Long: `For each of --latencies, delay every etcd answer to every client by it;
then for each of --losses, drop that share of the packets on every path
between the nodes, both ways. Each is held for --each, then healed. For each
step it prints the longest gap in the client's answers from the VIP (probed
every 10 ms), how often the VIP moved and how many 20 ms samples found it on
two nodes (read on every node), how long no node held it, the least renewal
margin the holder reported (time left to its deadline when a renewal was
answered), and how soon after the heal the client was answered again.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg.Latencies, cfg.Losses = latencies, losses
			if err := cfg.Validate(); err != nil {
				return err
			}
			l, err := openUp(g)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if !asJSON {
				cfg.Progress = func(r lab.SweepRow) { fmt.Fprintln(out, r) }
			}
			rows, err := l.GraySweep(cmd.Context(), cfg)
			if asJSON {
				if jerr := writeJSON(out, rows); jerr != nil {
					return errors.Join(err, jerr)
				}
			}
			return err
		},
	}
	f := cmd.Flags()
	f.DurationSliceVar(&latencies, "latencies", []time.Duration{0, 50 * time.Millisecond, 100 * time.Millisecond, 150 * time.Millisecond, 200 * time.Millisecond, 300 * time.Millisecond, 400 * time.Millisecond, 500 * time.Millisecond, 700 * time.Millisecond}, "etcd answer delays to hold, in turn")
	f.IntSliceVar(&losses, "losses", []int{1, 5, 20}, "packet loss percentages to hold, in turn")
	f.DurationVar(&cfg.Each, "each", 30*time.Second, "how long to hold each")
	f.BoolVar(&asJSON, "json", false, "print the rows as JSON")
	return cmd
}

func newEtcdFrontCmd() *cobra.Command {
	var cfg lab.EtcdFrontConfig
	cmd := &cobra.Command{
		Use:    "etcd-front",
		Short:  "Run a node's etcd front proxy (delays etcd's answers on request)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cfg.Listen == "" || cfg.To == "" || cfg.Control == "" {
				return errors.New("--listen, --to and --control are required")
			}
			for _, a := range []string{cfg.Listen, cfg.To} {
				if _, err := netip.ParseAddrPort(a); err != nil {
					return fmt.Errorf("%q: %w", a, err)
				}
			}
			return lab.ServeEtcdFront(cmd.Context(), cfg, slog.New(slog.NewTextHandler(os.Stderr, nil)))
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Listen, "listen", "", "address to serve, NODEIP:2379 (what etcd advertises)")
	f.StringVar(&cfg.To, "to", "", "etcd's own client address, NODEIP:2378")
	f.StringVar(&cfg.Control, "control", "", "unix socket that sets the delay")
	return cmd
}

func newRouterFIBCmd() *cobra.Command {
	var (
		cfg    lab.RouterFIBConfig
		prefix string
	)
	cmd := &cobra.Command{
		Use:    "router-fib",
		Short:  "Copy BIRD's multipath route into a resilient next-hop group (the ECMP lab's router)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			p, err := netip.ParsePrefix(prefix)
			if err != nil {
				return fmt.Errorf("--prefix: %w", err)
			}
			if cfg.Table <= 0 || cfg.Table == 254 || cfg.Table == 255 {
				return fmt.Errorf("--table %d: want BIRD's own table, not main or local", cfg.Table)
			}
			cfg.Prefix = p
			return lab.ServeRouterFIB(cmd.Context(), cfg, slog.New(slog.NewTextHandler(os.Stderr, nil)))
		},
	}
	f := cmd.Flags()
	f.IntVar(&cfg.Table, "table", 0, "kernel table BIRD installs its routes in")
	f.StringVar(&prefix, "prefix", "", "the route to copy (the VIP's /32)")
	return cmd
}
