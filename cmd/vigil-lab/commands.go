package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"go.etcd.io/etcd/server/v3/etcdmain"

	"github.com/vigil-ha/vigil/internal/lab"
)

func addSettingsFlags(cmd *cobra.Command, s *lab.Settings) {
	f := cmd.Flags()
	f.IntVar(&s.Nodes, "nodes", 3, "control-plane nodes (1-9)")
	f.StringVar(&s.Impl, "impl", lab.ImplVigil, "what holds the VIP: vigil, keepalived (kubeadm's recipe) or keepalived-tuned (VRRPv3, 0.1 s adverts)")
	f.DurationVar(&s.LeaseDuration, "lease-duration", 0, "vigil --lease-duration on every node (default: vigil's)")
	f.DurationVar(&s.RenewDeadline, "renew-deadline", 0, "vigil --renew-deadline on every node (default: vigil's)")
	f.DurationVar(&s.RetryPeriod, "retry-period", 0, "vigil --retry-period on every node (default: vigil's)")
	f.IntVar(&s.LBPort, "lb-port", lab.APIServerPort, "vigil --lb-port: the load balancer on the VIP (0: none)")
	f.IntVar(&s.BackendPort, "backend-port", lab.APIServerPort, "vigil --backend-port (the stand-in API servers listen on 6443, the benchmark backends on 7000)")
	f.IntVar(&s.HealthPort, "health-port", 0, "vigil --health-port (0: the backend port)")
	f.DurationVar(&s.HealthGrace, "health-grace", 0, "vigil --health-grace (default: vigil's)")
	f.IntVar(&s.LBEventLoops, "lb-event-loops", 0, "vigil --lb-event-loops on every node (0: vigil's default, one per CPU; -1: none, every connection on goroutines), to compare the balancer's two data paths")
	f.IntVar(&s.LBMaxConns, "lb-max-conns", 0, fmt.Sprintf("vigil --lb-max-conns on every node (0: vigil's default, -1: no limit); the reconnect-storm drill opens %d connections through the VIP and needs at least that", lab.StormClients))
	f.StringVar(&s.APIServer, "apiserver", lab.APIServerStandIn, "each node's API server: standin (the lab's, with drillable modes) or kube (the real kube-apiserver from bin/, built by hack/build-kube-apiserver.sh)")
	f.StringVar(&s.Election, "election", lab.ElectionEtcd, "vigil --election on every node: etcd, or kubernetes (a Lease through the node's own kube-apiserver; needs --apiserver kube)")
	f.IntVar(&s.Workers, "workers", 0, "worker nodes running vigil-agent and long-lived etcd and API clients through it (vigil labs; scale-workers-unaffected adds 2 if there are none)")
	f.BoolVar(&s.VIPLink, "vip-link", false, "give every node a second link (vip0) on the bridge that carries only the VIP, so the VIP's link can fail while etcd's stays up (chaos turns it on)")
	f.StringVar(&s.EtcdLogLevel, "etcd-log-level", "warn", "etcd's --log-level (debug, info, warn, error); info shows raft leader changes and peer removals in each node's etcd.log")
	f.DurationVar(&s.PruneAfter, "prune-after", 0, "vigil --prune-after; the prune-* drills need it, and replace-node then waits for vigil to prune instead of running vigil members prune")
	f.StringVar(&s.Announce, "announce", lab.AnnounceARP, "how vigil announces the VIP: arp (on the nodes' segment, with the client) or bgp (a router namespace running BIRD 2 between the nodes and the client, which reaches the VIP only by the holder's BGP route; docs/bgp.md)")
	f.StringVar(&s.IPFamily, "ip-family", lab.IPv4, "the VIP's address family: ipv4, ipv6 (fd00:250::100; every host gets an IPv6 address too, etcd stays on IPv4) or dual (one VIP of each family, held as one: vigil run --vip twice); the client probes every VIP address and drills report the outage per family")
	f.StringVar(&s.BGPMode, "bgp-mode", "", "with --announce bgp: ecmp runs vigil run --bgp-mode ecmp, every node advertising the VIP and the router (BIRD, merge paths) spreading flows across them; its drill is ecmp-node-killed (default: one holder)")
	f.StringVar(&s.RouterHash, "router-hash", "", "with --bgp-mode ecmp: how the router spreads flows across the nodes: resilient (default; a resilient next-hop group, so flows to the survivors stay where they are when a node goes) or threshold (BIRD's plain multipath route: hash-threshold, which moves some of them)")
	f.BoolVar(&s.BGPBFD, "bgp-bfd", false, "with --announce bgp: run BFD (100ms x 3, or --bfd-interval x 3) between the nodes and the router, which then drops a dead node's route within 300 ms instead of its 9 s hold time")
	f.DurationVar(&s.BFDInterval, "bfd-interval", 0, "with --bgp-bfd: BFD's interval on the nodes and the router, 50ms to 1s (multiplier 3; default 100ms)")
	f.IntVar(&s.LBListenPort, "lb-listen-port", 0, "with --kubeadm: leave kube-apiserver on kubeadm's default 0.0.0.0:6443 and run vigil with --lb-listen-port PORT (the balancer on VIP:PORT, VIP:6443 sent to it by the holder's nftables rule); 0 binds each API server to its node's address instead")
	f.BoolVar(&s.Kubeadm, "kubeadm", false, "build a real kubeadm cluster: every node runs containerd and a kubelet, kubeadm init and join run through the VIP, and etcd, the control plane and vigil (written by vigil manifest pod) run as static pods from local images (hack/build-kube-images.sh builds them; --workers N adds kubeadm workers); docs/kubeadm.md")
}

func newUpCmd(g *globals) *cobra.Command {
	var s lab.Settings
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Build the lab and wait until the VIP has a holder",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			l, err := g.open()
			if err != nil {
				return err
			}
			if err := l.Up(cmd.Context(), s); err != nil {
				return err
			}
			return printStatus(cmd, l, false)
		},
	}
	addSettingsFlags(cmd, &s)
	return cmd
}

func newDownCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "down",
		Short: "Remove every namespace, process and file of the lab (also after a crash)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			l, err := g.open()
			if err != nil {
				return err
			}
			return l.Down(cmd.Context())
		},
	}
}

func newStatusCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show nodes, etcd leader and VIP holder",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			l, err := g.open()
			if err != nil {
				return err
			}
			if err := l.Open(); err != nil {
				return err
			}
			return printStatus(cmd, l, asJSON)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func printStatus(cmd *cobra.Command, l *lab.Lab, asJSON bool) error {
	r, err := l.Status(cmd.Context())
	if err != nil {
		return err
	}
	out := cmd.OutOrStdout()
	if asJSON {
		return writeJSON(out, r)
	}
	answering := dash(r.Answering)
	if len(r.AnsweringByVIP) > 0 {
		var by []string
		for vip, who := range r.AnsweringByVIP {
			by = append(by, vip+": "+dash(who))
		}
		sort.Strings(by)
		answering = strings.Join(by, ", ")
	}
	fmt.Fprintf(out, "impl %s  vip %s  holder %s  answering %s\n", r.Impl, r.VIP, strings.Join(r.Holders, ","), answering)
	if r.Router != nil {
		to := r.Router.NextHop
		if len(r.Router.NextHops) > 0 {
			to = strings.Join(r.Router.NextHops, ",") + " (ECMP)"
		}
		fmt.Fprintf(out, "router: forwards the VIP to %s; BGP routes from %s\n", dash(to), dash(strings.Join(r.Router.Learned, ",")))
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tIP\tLINK\tPROCESSES\tETCD FOLLOWS")
	for i, n := range r.NodeStates {
		link := "up"
		if n.Cut {
			link = "CUT"
		}
		follows := "-"
		if r.Etcd != nil && i < len(r.Etcd.Members) && r.Etcd.Members[i].Reachable {
			follows = dash(r.Etcd.Members[i].Leader)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", n.Name, n.IP, link, processes(n.Running), follows)
	}
	for _, n := range r.Workers {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", n.Name, n.IP, "up", processes(n.Running), "(worker)")
	}
	return tw.Flush()
}

// processes lists roles, sorted, each dead one marked.
func processes(running map[string]bool) string {
	var procs []string
	for role, ok := range running {
		if !ok {
			role += "(dead)"
		}
		procs = append(procs, role)
	}
	slices.Sort(procs)
	return strings.Join(procs, ",")
}

func newDrillCmd(g *globals) *cobra.Command {
	var (
		count      int
		asJSON     bool
		from, repo string
	)
	cmd := &cobra.Command{
		Use:   "drill " + strings.Join(lab.Drills, "|") + "|mixed",
		Short: "Break the running lab, measure the outage, heal it",
		Long: `Run a drill against the lab that "vigil-lab up" built.

  kill-leader        cut the VIP holder's link and SIGKILL its processes (power
                     loss); afterwards the node "reboots" and rejoins
  graceful           SIGTERM the holder's daemon; afterwards restart it
  partition-leader   cut the holder's link, leave it running; then reconnect it
  kill-etcd-leader   SIGKILL the etcd member leading raft (not on the VIP
                     holder); then restart it
  kill-daemon        SIGKILL the holder's vigil (or keepalived) only; the node
                     and its link stay up; then restart it
  impostor-etcd      SIGKILL a non-holder's etcd member and start a fresh
                     one-member etcd with the same name and URLs (a rebuilt
                     machine, a wrong snapshot restore) for 5 s, then stop it
                     and, 2 s later, bring the real member back: the VIP must
                     stay on its holder, and every vigil must refuse the
                     impostor (its /status names it) and keep following the
                     real cluster
  apiserver-down     stop the holder's (stand-in) API server listening; node
                     and vigil stay up. The VIP must leave the node within
                     --health-grace + 1 s, and requests through the load
                     balancer may fail only around that move
  apiserver-slow     the same with an API server that answers after 3 s
  backend-paused     open 30 watches through the VIP, SIGSTOP another node's
                     (stand-in) API server for 1.5 s, SIGCONT it: none of
                     the watches may be reset, and the VIP must not move
  backend-killed     the same, but SIGKILL that API server: every watch it
                     served must end within 1 s; then restart it
  reconnect-storm    open 5,000 watches, drop them all at once and reopen
                     them at once, straight to the API servers and then
                     through the VIP: every client must get a new watch,
                     and the VIP must not move (needs up --lb-max-conns
                     10000)
  replace-node       power the holder off for good, vigil members prune, a
                     new node joins etcd as kubeadm join does, runs vigil;
                     prints each phase (the lab gets a new node: n4, n5...)
  replace-healthy    vigil members replace a healthy non-holder with a new
                     node (learner, promote, remove); the VIP must not move
  scale              3 -> 5 nodes (kubeadm-style joins) -> 3 (vigil members
                     remove --force of two non-holders); the VIP must not
                     move and the load balancer follows every change
  prune-one-sided    (needs up --prune-after) on the holder only, drop packets
                     to another member's etcd client port for 25 s; that
                     member must stay
  prune-cold-start   (needs up --prune-after) stop vigil everywhere for 60 s,
                     block one member's client port, start vigil, unblock
                     2 s after a holder is elected; no member may go
  prune-real-death   (needs up --prune-after) power off a member that does
                     not hold the VIP; it must be pruned within
                     --prune-after + 5 s (not before), then a new node joins
  prune-client-port  (needs up --prune-after) on a member that does not hold
                     the VIP, drop what arrives for its client port for 5
                     periods (25 s at least) while raft replicates to it as
                     before; it must stay
  kubeadm-vigil-killed  (kubeadm lab) SIGKILL the holder's vigil container
                     process, PID 1 of its container: its guard, a container
                     of its own, must remove the VIP at once; kubelet
                     restarts vigil; never two holders
  kubeadm-vigil-oom  (kubeadm lab) the same, but the kernel's OOM killer kills
                     vigil: its container's memory limit is lowered below
                     its use. The VIP must leave within a lease + 1 s, and
                     kubelet must report the container OOMKilled
  kubeadm-vigil-restart  (kubeadm lab) change the holder's vigil manifest (an
                     annotation), as an upgrade does: kubelet stops the pod,
                     vigil hands the VIP over, the new pod starts; never two
                     holders
  kubeadm-certs-renew  (kubeadm lab) kubeadm certs renew all on every
                     control-plane node, then restart etcd and kube-apiserver
                     node by node: vigil must run on, unrestarted, with one
                     holder throughout and every backend up again
  kubeadm-replace    (kubeadm lab) power the holder off for good, then a new
                     node runs kubeadm join --control-plane through the VIP.
                     With up --prune-after, vigil prunes the dead member
                     first and the join must meet a healthy etcd; without,
                     the join must meet the dead member (as in the seed)
                     and the drill removes it by hand afterwards. Prints
                     each phase
  kubeadm-lease      (kubeadm lab) move the cluster to the Lease election, as
                     docs/kubeadm.md says: vigil manifest rbac, a kubeconfig
                     per node for its own API server, every manifest
                     rewritten with --election kubernetes, the holder's last.
                     The VIP moves once, to the Lease's holder; the etcd
                     election is retired; never two holders. One-way: a lab
                     that moved is refused, and the other drills then run
                     under the Lease election
  prometheus         a real Prometheus (Debian's) scrapes every vigil with the
                     rules of vigil manifest monitoring; kill-leader under
                     it: the holder series must move and VigilNoVIPHolder
                     stay silent; then every etcd is stopped: it must fire
  rolling-upgrade    (needs --from REV) every node restarted on vigil built
                     from REV of this git repository, then node by node
                     onto the lab's vigil: a non-holder first (the mixed
                     state), then SIGKILL to the old holder, then the rest
                     by SIGTERM; prints each step's outage; never two
                     holders
  mixed              the failover, API server and watch drills in turn,
                     --count drills in all

The client namespace probes the VIP every 10 ms (UDP), and for the API server
drills sends HTTPS GET /version through VIP:--lb-port every 20 ms on a new
connection. Each drill prints the longest gap between answers (the outage),
which node answered before and after, and whether two nodes ever held or
answered on the VIP at once (split brain). Exits non-zero if any drill failed
or saw a split brain.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if count < 1 {
				return fmt.Errorf("--count %d: must be at least 1", count)
			}
			if (from != "") != (args[0] == lab.DrillRollingUpgrade) {
				return fmt.Errorf("--from goes with the drill %s, and %s needs it: the revision to upgrade from (a commit of --repo)", lab.DrillRollingUpgrade, lab.DrillRollingUpgrade)
			}
			l, err := g.open()
			if err != nil {
				return err
			}
			if err := l.Open(); err != nil {
				return err
			}
			if from != "" {
				cache, err := os.UserCacheDir()
				if err != nil {
					return err
				}
				dir := filepath.Join(cache, "vigil-lab", "upgrade-from")
				if err := os.MkdirAll(dir, 0o755); err != nil {
					return err
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "building vigil at %s (from %s) ...\n", from, repo)
				bin, err := lab.BuildRevision(cmd.Context(), repo, from, dir, "")
				if err != nil {
					return err
				}
				l.SetUpgradeFrom(bin)
			}
			kinds := []string{args[0]}
			if args[0] == "mixed" {
				kinds = lab.DrillsFor(l.Settings())
			}
			var rs []lab.Result
			for i := 1; i <= count; i++ {
				r := l.Drill(cmd.Context(), kinds[(i-1)%len(kinds)], i)
				rs = append(rs, r)
				if !asJSON {
					fmt.Fprintln(cmd.OutOrStdout(), r)
				}
				if cmd.Context().Err() != nil {
					break
				}
			}
			return report(cmd.OutOrStdout(), rs, asJSON)
		},
	}
	cmd.Flags().IntVar(&count, "count", 1, "how many times to run the drill")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print results as JSON")
	cmd.Flags().StringVar(&from, "from", "", "rolling-upgrade: the git revision of vigil to upgrade from (hack/previous-release names the previous release's)")
	cmd.Flags().StringVar(&repo, "repo", ".", "rolling-upgrade: the git repository --from is a revision of")
	return cmd
}

func newDemoCmd(g *globals) *cobra.Command {
	var (
		s      lab.Settings
		count  int
		full   bool
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Up, every failover drill, the replacement of a dead holder, a summary table, down",
		Long: `Builds a lab, runs every failover drill once, two load balancer drills
(apiserver-down, backend-killed) and the replacement of a dead VIP holder
(the membership story), prints what each cost and a summary table, and
removes the lab: about a minute and a half.

With --full, every drill runs --count times (3), the load balancer drills
apiserver-slow and backend-paused too, and every membership drill once
(scale, replace-healthy, replace-node, scale-workers-unaffected, and the
prune drills with --prune-after): about eight minutes.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) (err error) {
			if !cmd.Flags().Changed("count") && full {
				count = 3
			}
			if count < 1 {
				return fmt.Errorf("--count %d: must be at least 1", count)
			}
			drills, membership := lab.DrillsFor(s), lab.MembershipDrills(s)
			if !full {
				// The first minutes: one load balancer drill of each
				// kind (a dead API server, a dead backend's watches)
				// and the seed's story, a dead holder replaced.
				drills = slices.DeleteFunc(drills, func(d string) bool {
					return d == lab.DrillAPIServerSlow || d == lab.DrillBackendPaused
				})
				if slices.Contains(membership, lab.DrillReplaceNode) {
					membership = []string{lab.DrillReplaceNode}
				}
			}
			out := cmd.OutOrStdout()
			if !asJSON {
				fmt.Fprintf(out, "building a %d-node %s lab (etcd + vigil per node, client probing the VIP every 10 ms)...\n", s.Nodes, s.Impl)
			}
			l, down, err := upLab(cmd, g, s, asJSON)
			if err != nil {
				return err
			}
			defer func() { err = errors.Join(err, down()) }()
			if !asJSON {
				if err := printStatus(cmd, l, false); err != nil {
					return err
				}
			}
			var rs []lab.Result
			for _, kind := range drills {
				for i := 1; i <= count; i++ {
					r := l.Drill(cmd.Context(), kind, i)
					rs = append(rs, r)
					if !asJSON {
						fmt.Fprintln(out, r)
					}
					if cmd.Context().Err() != nil {
						return cmd.Context().Err()
					}
				}
			}
			// Then the membership story once each: with --full, nodes
			// added, removed and swapped; always, a dead holder replaced.
			for _, kind := range membership {
				r := l.Drill(cmd.Context(), kind, 1)
				rs = append(rs, r)
				if !asJSON {
					fmt.Fprintln(out, r)
				}
				if cmd.Context().Err() != nil {
					return cmd.Context().Err()
				}
			}
			return report(out, rs, asJSON)
		},
	}
	addSettingsFlags(cmd, &s)
	cmd.Flags().IntVar(&count, "count", 1, "runs of each failover drill (3 with --full)")
	cmd.Flags().BoolVar(&full, "full", false, "every drill: failover drills --count times, every membership drill once")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print results as JSON")
	return cmd
}

// upLab builds a lab for a one-shot command (demo, chaos) and returns the
// function that removes it, saying so unless the output is JSON.
func upLab(cmd *cobra.Command, g *globals, s lab.Settings, asJSON bool) (*lab.Lab, func() error, error) {
	l, err := g.open()
	if err != nil {
		return nil, nil, err
	}
	if err := l.Up(cmd.Context(), s); err != nil {
		return nil, nil, err
	}
	down := func() error {
		if err := l.Down(cmd.Context()); err != nil {
			return fmt.Errorf("lab down: %w", err)
		}
		if !asJSON {
			fmt.Fprintln(cmd.OutOrStdout(), "lab removed.")
		}
		return nil
	}
	return l, down, nil
}

// report prints the summary (or everything as JSON) and fails if any drill
// did.
func report(out io.Writer, rs []lab.Result, asJSON bool) error {
	sum := lab.Summarize(rs)
	if asJSON {
		if err := writeJSON(out, map[string]any{"results": rs, "summary": sum}); err != nil {
			return err
		}
	} else {
		fmt.Fprintln(out, "\nsummary (outage = longest gap between answers on the VIP, probed every 10 ms):")
		for _, s := range sum {
			fmt.Fprintln(out, " ", s)
		}
	}
	bad := 0
	for _, r := range rs {
		if !r.OK() {
			bad++
		}
	}
	if bad > 0 {
		return fmt.Errorf("%d of %d drills failed or saw a split brain", bad, len(rs))
	}
	return nil
}

func newEtcdCmd() *cobra.Command {
	return &cobra.Command{
		Use:                "etcd [etcd flags]",
		Short:              "Run an etcd server (used inside the lab's node namespaces)",
		Hidden:             true,
		DisableFlagParsing: true,
		Run: func(_ *cobra.Command, args []string) {
			etcdmain.Main(append([]string{"etcd"}, args...))
		},
	}
}

func newWorkerClientCmd() *cobra.Command {
	var cfg lab.WorkerClientConfig
	cmd := &cobra.Command{
		Use:    "worker-client",
		Short:  "Run a worker's long-lived etcd watch client and API poller (inside the lab's worker namespaces)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cfg.Name == "" || cfg.Stats == "" || cfg.CA == "" {
				return errors.New("--name, --stats and --ca are required")
			}
			return lab.RunWorkerClient(cmd.Context(), cfg)
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Name, "name", "", "worker name")
	f.StringVar(&cfg.Etcd, "etcd", "http://127.0.0.1:2379", "etcd URL (the agent's local endpoint)")
	f.StringVar(&cfg.API, "api", "https://127.0.0.1:6443", "API server URL (the agent's local endpoint)")
	f.StringVar(&cfg.CA, "ca", "", "CA of the API servers")
	f.StringVar(&cfg.Stats, "stats", "", "file to write the counters to")
	f.DurationVar(&cfg.Interval, "interval", 100*time.Millisecond, "interval between puts and between API requests")
	return cmd
}

func newResponderCmd() *cobra.Command {
	var (
		name string
		port int
	)
	cmd := &cobra.Command{
		Use:    "responder",
		Short:  "Answer the lab's probes with this node's name",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if name == "" {
				return errors.New("--name is required")
			}
			return lab.Respond(cmd.Context(), name, port)
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "node name to answer with")
	cmd.Flags().IntVar(&port, "port", lab.ResponderPort, "UDP port")
	return cmd
}

func newBenchLBCmd(g *globals) *cobra.Command {
	var (
		cfg    lab.LBBenchConfig
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "bench-lb",
		Short: "Compare vigil's load balancer with HAProxy (kubeadm's recipe) on the running lab",
		Long: `Measure vigil's load balancer and HAProxy side by side on the same lab.

Needs a lab built for it:
  vigil-lab up --lb-port 7443 --backend-port 7000 --health-port 6443

vigil then balances VIP:7443 over every node's bench backend (TCP 7000) and
health-checks the stand-in API server beside it. HAProxy is started on the VIP
holder with kubeadm's recommended haproxy.cfg on VIP:8443 over the same
backends. Like vigil, it runs in a session of its own, so where the kernel
groups tasks by session for CPU fairness (sched_autogroup_enabled), each
balancer gets the same share; the run is refused if vigil, HAProxy and the
load generator do not each have a group of their own (see schedGroups in the
JSON). From the client namespace, for each of direct (one backend, no
balancer), vigil and haproxy, in rotating order each round:
  rtt         round trips on one connection: p50/p99 latency
  connect     new connection + one round trip: p50/p99 latency
  conns       --workers clients opening connections for --duration: per second
  throughput  --streams connections reading for --duration: MiB/s
Then --ejections times: SIGKILL a non-holder's backend while a client
connects through each balancer, and time until each balancer marks it down.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cfg.Validate(); err != nil {
				return err
			}
			l, err := g.open()
			if err != nil {
				return err
			}
			if err := l.Open(); err != nil {
				return err
			}
			progress := cmd.OutOrStdout()
			if asJSON {
				progress = cmd.ErrOrStderr()
			}
			res, err := l.BenchLB(cmd.Context(), cfg, progress)
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), res)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&cfg.Rounds, "rounds", 3, "rounds of measurements per target")
	f.DurationVar(&cfg.Duration, "duration", 5*time.Second, "length of each conns and throughput measurement")
	f.IntVar(&cfg.Workers, "workers", 8, "parallel clients in the conns measurement")
	f.IntVar(&cfg.Streams, "streams", 4, "parallel connections in the throughput measurement")
	f.IntVar(&cfg.Samples, "samples", 2000, "samples of the rtt and connect measurements")
	f.IntVar(&cfg.Ejections, "ejections", 3, "backends to kill and time the ejection of")
	f.IntVar(&cfg.Flood, "flood", 0, "end with this many connection attempts from --flood-sources source addresses through vigil (each sends a byte and then nothing), while another client keeps connecting; reports what was held and reset, the other client's latency, whether the VIP stayed, and the holder's RSS")
	f.IntVar(&cfg.FloodSources, "flood-sources", 1, fmt.Sprintf("source addresses the flood comes from, 1 to %d (10.250.0.3 onward): 1 meets vigil's per-source limit, 5 or more its total limit (--lb-max-conns 3072, 768 per source)", lab.MaxFloodSources))
	f.BoolVar(&asJSON, "json", false, "print the result as JSON (progress goes to stderr)")
	return cmd
}

func newLoadgenCmd() *cobra.Command {
	var cfg lab.LoadConfig
	cmd := &cobra.Command{
		Use:    "loadgen",
		Short:  "Generate load for bench-lb (run inside the client namespace)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			r, err := lab.RunLoad(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			return writeJSON(cmd.OutOrStdout(), r)
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Mode, "mode", lab.LoadRTT, "rtt, connect, conns, throughput or flood")
	f.StringVar(&cfg.Target, "target", "", "HOST:PORT")
	f.DurationVar(&cfg.Duration, "duration", 5*time.Second, "duration of conns and throughput")
	f.IntVar(&cfg.Samples, "samples", 1000, "samples of rtt and connect")
	f.IntVar(&cfg.Workers, "workers", 4, "parallel clients")
	f.StringVar(&cfg.Source, "source", "", "local addresses to connect from, comma-separated, taken in turn (flood)")
	return cmd
}

func newStormCmd() *cobra.Command {
	var raw string
	cmd := &cobra.Command{
		Use:    "storm",
		Short:  "The reconnect-storm drill's clients (run inside the client namespace)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var cfg lab.StormConfig
			if raw == "" {
				return errors.New("--config is required: the storm's configuration, JSON (lab.StormConfig)")
			}
			if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
				return fmt.Errorf("--config: %w", err)
			}
			r, err := lab.RunStorm(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			return writeJSON(cmd.OutOrStdout(), r)
		},
	}
	cmd.Flags().StringVar(&raw, "config", "", "the storm's configuration, JSON (lab.StormConfig)")
	return cmd
}

func newAPIServerCmd() *cobra.Command {
	var cfg lab.APIServerConfig
	cmd := &cobra.Command{
		Use:    "apiserver",
		Short:  "Run a node's stand-in kube-apiserver (HTTPS /readyz, /version)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cfg.Name == "" || cfg.Listen == "" || cfg.Control == "" {
				return errors.New("--name, --listen and --control are required")
			}
			return lab.ServeAPIServer(cmd.Context(), cfg, slog.New(slog.NewTextHandler(os.Stderr, nil)))
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Name, "name", "", "node name, served on /version")
	f.StringVar(&cfg.Listen, "listen", "", "HTTPS address, NODEIP:6443")
	f.StringVar(&cfg.CertFile, "cert", "", "serving certificate")
	f.StringVar(&cfg.KeyFile, "key", "", "serving key")
	f.StringVar(&cfg.Control, "control", "", "unix socket that switches the mode")
	f.StringVar(&cfg.BulkListen, "bulk-listen", "", "raw TCP address for the load balancer benchmark")
	return cmd
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
