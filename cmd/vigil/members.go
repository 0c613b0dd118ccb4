package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/vigil-ha/vigil/internal/election"
	"github.com/vigil-ha/vigil/internal/kube"
	"github.com/vigil-ha/vigil/internal/membership"
	"github.com/vigil-ha/vigil/internal/validate"
)

// etcdFlags are the connection flags every members subcommand shares with
// vigil run.
type etcdFlags struct {
	endpoints        []string
	ca, cert, key    string
	logLevel, format string
	// lockKey, for the commands that may move raft leadership (remove,
	// replace: addLockKey), is where they read which node holds the VIP.
	lockKey string
}

// addLockKey adds --lock-key to a command that may move raft leadership
// off a member it removes: it then keeps leadership off the VIP holder's
// member, whose vigil would move it off again.
func (f *etcdFlags) addLockKey(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.lockKey, "lock-key", election.DefaultEtcdKey, "etcd key of vigil's lock record (vigil run --lock-key): raft leadership moved off a member being removed goes to a member other than the VIP holder's")
}

func (f *etcdFlags) add(cmd *cobra.Command) {
	fs := cmd.PersistentFlags()
	fs.StringSliceVar(&f.endpoints, "etcd-endpoints", []string{"https://127.0.0.1:2379"}, "etcd client URLs, comma-separated")
	fs.StringVar(&f.ca, "etcd-cacert", "", "CA bundle that signed the etcd server certificates")
	fs.StringVar(&f.cert, "etcd-cert", "", "etcd client certificate")
	fs.StringVar(&f.key, "etcd-key", "", "etcd client key")
	fs.StringVar(&f.logLevel, "log-level", "warn", "debug, info, warn or error")
}

func (f *etcdFlags) cluster() (*membership.Cluster, error) {
	tc, err := validate.EtcdClientTLS(f.ca, f.cert, f.key)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", validate.ErrInvalid, err)
	}
	log, err := newLogger(f.logLevel, "text")
	if err != nil {
		return nil, err
	}
	cfg := membership.Config{Endpoints: f.endpoints, TLS: tc}
	var cl *membership.Cluster
	if f.lockKey != "" {
		cfg.VIPHolder = func(ctx context.Context) (string, error) { return election.EtcdHolder(ctx, cl.Etcd(), f.lockKey) }
	}
	cl, err = membership.New(cfg, log)
	return cl, err
}

// sayTo prints each step with the time it happened: a membership
// operation's events (as a Reporter), and the command's own lines.
type sayTo struct{ w io.Writer }

func (s sayTo) line(format string, a ...any) {
	fmt.Fprintf(s.w, "%s  %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, a...))
}

func (s sayTo) event(e membership.Event) { s.line("%s", e.Text) }

func newMembersCmd() *cobra.Command {
	var ef etcdFlags
	cmd := &cobra.Command{
		Use:   "members",
		Short: "Inspect and safely change etcd membership (list, remove, prune, replace, preflight, recover)",
		Long: `Inspect and change the control plane's etcd membership without risking quorum.

Every change first reads the member list and asks each member for its status
(a member is healthy when its client URL answers within a second), then
refuses anything that would leave fewer healthy voters than the quorum of
the remaining ones, or that needs a quorum the cluster does not have.
Refusals say why and what to do instead; nothing is changed.

A member that does not answer is not necessarily gone: before a prune, and
in list, every member that answers is asked, twice, what its raft transport
has received from each peer. A member whose raft messages still arrive
(its client port filtered or stalled, its peer port working) is never
pruned.

Every vigil run observes every member once a second and publishes its view
in etcd under /vigil/member-views/: how long it has seen each member
unreachable without a break, on its own clock. list shows these views, and
prune removes a member only when a majority of the voters' views agree it
has been unreachable for --min-down.

The connection flags are those of vigil run. With kubeadm:
  --etcd-endpoints https://127.0.0.1:2379 --etcd-cacert /etc/kubernetes/pki/etcd/ca.crt
  --etcd-cert /etc/kubernetes/pki/apiserver-etcd-client.crt
  --etcd-key /etc/kubernetes/pki/apiserver-etcd-client.key`,
	}
	ef.add(cmd)
	cmd.AddCommand(newMembersListCmd(&ef), newMembersRemoveCmd(&ef), newMembersPruneCmd(&ef), newMembersReplaceCmd(&ef), newMembersPreflightCmd(&ef), newMembersRecoverCmd(&ef))
	return cmd
}

func newMembersListCmd(ef *etcdFlags) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List members with health, role, raft lag, DB size and what each vigil sees of them",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "table" && output != "json" && output != "yaml" {
				return fmt.Errorf("-o %q: use table, json or yaml", output)
			}
			cl, err := ef.cluster()
			if err != nil {
				return err
			}
			defer cl.Close()
			v, err := cl.View(cmd.Context())
			if err != nil {
				return err
			}
			cl.CheckRaft(cmd.Context(), &v)
			w := cmd.OutOrStdout()
			switch output {
			case "json":
				enc := json.NewEncoder(w)
				enc.SetIndent("", "  ")
				return enc.Encode(v.Members)
			case "yaml":
				b, err := yaml.Marshal(v.Members)
				if err != nil {
					return err
				}
				_, err = w.Write(b)
				return err
			}
			tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tID\tROLE\tLEADER\tHEALTHY\tRAFT LINKS\tLAG\tDB\tSEEN BY VIGIL\tPEER URLS\tCLIENT URLS")
			for _, m := range v.Members {
				role := "voter"
				if m.Learner {
					role = "learner"
				}
				name := m.Name
				if name == "" {
					name = "(not started)"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", name, m.IDString(), role, yesNo(m.Leader), yesNo(m.Reachable),
					raftLinks(m.Raft), m.Lag, size(m.DBSize), seenBy(m), strings.Join(m.PeerURLs, ","), strings.Join(m.ClientURLs, ","))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "table", "table, json or yaml")
	return cmd
}

// nodeFlags are --delete-node and --kubeconfig of remove and prune.
type nodeFlags struct {
	deleteNode bool
	kubeconfig string
}

func (n *nodeFlags) add(cmd *cobra.Command) {
	cmd.Flags().BoolVar(&n.deleteNode, "delete-node", false, "also delete the Node named like each removed member, unless that Node is Ready (needs --kubeconfig)")
	cmd.Flags().StringVar(&n.kubeconfig, "kubeconfig", "", "kubeconfig whose user may delete Nodes (with --delete-node)")
}

// client checks the flags and the permission before anything is changed,
// so a refusal leaves the members as they were. nil without --delete-node.
func (n *nodeFlags) client(ctx context.Context) (kubernetes.Interface, error) {
	if !n.deleteNode {
		if n.kubeconfig != "" {
			return nil, fmt.Errorf("--kubeconfig is only used with --delete-node")
		}
		return nil, nil
	}
	if n.kubeconfig == "" {
		return nil, fmt.Errorf("--delete-node needs --kubeconfig")
	}
	cs, err := kube.NewClient(n.kubeconfig)
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := kube.CheckCanDeleteNodes(cctx, cs); err != nil {
		return nil, fmt.Errorf("refusing before any change: %w", err)
	}
	return cs, nil
}

// forChange opens what a change of membership needs: the Kubernetes
// client of --delete-node (nil without), its permission checked first, then
// the cluster.
func forChange(ctx context.Context, nf *nodeFlags, ef *etcdFlags) (kubernetes.Interface, *membership.Cluster, error) {
	kc, err := nf.client(ctx)
	if err != nil {
		return nil, nil, err
	}
	cl, err := ef.cluster()
	if err != nil {
		return nil, nil, err
	}
	return kc, cl, nil
}

// deleteNodes deletes the Nodes of removed members. A Ready Node is left
// with a note (its machine is alive); an API error is returned.
func deleteNodes(ctx context.Context, cs kubernetes.Interface, names []string, say sayTo) error {
	var errs []error
	for _, name := range names {
		if name == "" {
			continue
		}
		got, err := kube.DeleteDeadNode(ctx, cs, name)
		switch {
		case errors.Is(err, kube.ErrNodeReady):
			say.line("Node %s left in place: its kubelet still reports it Ready", name)
		case err != nil:
			errs = append(errs, fmt.Errorf("member %s was removed, but: %w", name, err))
		case got == kube.NodeAbsent:
			say.line("no Node named %s", name)
		default:
			say.line("deleted Node %s", name)
		}
	}
	return errors.Join(errs...)
}

func newMembersRemoveCmd(ef *etcdFlags) *cobra.Command {
	var (
		force bool
		nf    nodeFlags
	)
	cmd := &cobra.Command{
		Use:   "remove NAME|ID",
		Short: "Remove one member, if the cluster keeps a healthy quorum",
		Long: `Remove one member by name or hexadecimal ID.

Refused when the cluster has no quorum now, when the removal would leave
fewer healthy voters than the quorum of the remaining voters, and for a
healthy member unless --force is given. A member that leads raft hands
leadership to the most up-to-date healthy voter first, one other than the
VIP holder's member where it can (the holder's vigil would move it off
again); the raft leader itself is never removed.

With --delete-node the Node of the same name is deleted too, unless it is
Ready; permission to delete Nodes is checked before the member is touched.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			kc, cl, err := forChange(cmd.Context(), &nf, ef)
			if err != nil {
				return err
			}
			defer cl.Close()
			say := sayTo{cmd.OutOrStdout()}
			name := args[0]
			if kc != nil {
				// The Node is named after the member; find its name
				// before it goes (args may be an ID).
				v, err := cl.View(cmd.Context())
				if err != nil {
					return err
				}
				m, err := v.Find(args[0])
				if err != nil {
					return err
				}
				name = m.Name
			}
			if err := cl.Remove(cmd.Context(), args[0], force, say.event); err != nil {
				return err
			}
			if kc == nil {
				return nil
			}
			return deleteNodes(cmd.Context(), kc, []string{name}, say)
		},
	}
	cmd.Flags().BoolVar(&force, "force", false, "also remove a member that is healthy")
	ef.addLockKey(cmd)
	nf.add(cmd)
	return cmd
}

// raftLinks sums up what the other answering members' raft transports
// say of a member: "2/2" (linked from 2 of the 2 asked), "0/2", or "?"
// when none could be read.
func raftLinks(r *membership.RaftLinks) string {
	switch {
	case r == nil:
		return "-"
	case !r.Known():
		return "?"
	}
	return fmt.Sprintf("%d/%d", len(r.LinkedFrom), r.Asked)
}

// seenBy sums up the vigils' views of m: "cp1 up, cp2 down 12s".
func seenBy(m membership.Member) string {
	if len(m.SeenBy) == 0 {
		return "-"
	}
	var parts []string
	for _, o := range slices.Sorted(maps.Keys(m.SeenBy)) {
		s := m.SeenBy[o]
		if s.Reachable {
			parts = append(parts, o+" up")
		} else {
			parts = append(parts, o+" down "+s.Down().Round(time.Second).String())
		}
	}
	return strings.Join(parts, ", ")
}

func newMembersPruneCmd(ef *etcdFlags) *cobra.Command {
	var (
		dryRun, force bool
		minDown       time.Duration
		nf            nodeFlags
	)
	cmd := &cobra.Command{
		Use:   "prune",
		Short: "Remove members that a majority of the vigils agree have been unreachable for --min-down",
		Long: `Remove, one at a time, every member that is unreachable from here and that a
majority of the voters' vigils report unreachable, without a break, for at
least --min-down. Each vigil run publishes that view once a second; prune
first waits up to ` + membership.ReportStale.String() + ` to see which views are being renewed, and
ignores stale ones and views of nodes whose own member is not a healthy
voter. It prints the evidence for each member.

A member only some vigils lose (a one-sided firewall rule, an asymmetric
partition) is refused, with a non-zero exit: the evidence is one-sided.
--force removes every member unreachable from here whatever the views say.

Nor is a member pruned while raft may still have it, even with --force:
before each removal every member that answers is asked, twice, a second
apart, how much its raft transport has received from each peer
(etcd_network_peer_received_bytes_total on its client URL). A member whose
client port is filtered, or too busy to answer, still sends raft messages
and is refused with a non-zero exit; one that is powered off, partitioned
or stopped sends nothing. If its silence cannot be shown (no counts, or
not the raft leader's), nothing is pruned. remove --force removes a member
regardless.

Before each removal the cluster is read again and the quorum rules of
remove apply, so prune never goes below a healthy majority and two prunes
at once are safe. A member that never started (added, no name yet) is
never pruned; remove it by ID.

With --delete-node the Node named like each pruned member is deleted too,
unless it is Ready (kubeadm names etcd members after their nodes);
permission to delete Nodes is checked before anything is removed.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if minDown < 0 {
				return fmt.Errorf("--min-down %v must not be negative", minDown)
			}
			kc, cl, err := forChange(cmd.Context(), &nf, ef)
			if err != nil {
				return err
			}
			defer cl.Close()
			say := sayTo{cmd.OutOrStdout()}
			fresh, err := cl.FreshReports(cmd.Context(), membership.ReportStale)
			if err != nil {
				return err
			}
			removed, cases, err := cl.Prune(cmd.Context(), membership.PruneConfig{MinDown: minDown, DryRun: dryRun, Force: force, Fresh: fresh}, say.event)
			if err != nil {
				return err
			}
			gone := map[uint64]bool{}
			for _, m := range removed {
				gone[m.ID] = true
			}
			var refused, held []string
			for _, cs := range cases {
				switch {
				case gone[cs.Member.ID] || dryRun && cs.Removable(membership.PruneConfig{MinDown: minDown, Force: force}):
				case cs.RaftHolds() != "":
					say.line("%s does not answer on its client URL, but %s", cs.Member.Label(), cs.RaftHolds())
					held = append(held, cs.Member.Name)
				case cs.Verdict == membership.OneSided:
					say.line("%s is unreachable from here, but the evidence is one-sided: %s", cs.Member.Label(), cs.Evidence())
					refused = append(refused, cs.Member.Name)
				default:
					say.line("%s is unreachable, not yet for %v by a majority: %s", cs.Member.Label(), minDown, cs.Evidence())
				}
			}
			if len(cases) == 0 {
				say.line("nothing to prune: every member answers")
			}
			if kc != nil && !dryRun {
				var names []string
				for _, m := range removed {
					names = append(names, m.Name)
				}
				if err := deleteNodes(cmd.Context(), kc, names, say); err != nil {
					return err
				}
			}
			if len(held) > 0 {
				return fmt.Errorf("%w: not pruning %s: raft may still have it (see RAFT LINKS in vigil members list); if it must go, vigil members remove --force", membership.ErrRefused, strings.Join(held, ", "))
			}
			if len(refused) > 0 {
				return fmt.Errorf("%w: not pruning %s: fewer than a majority of the voters' vigils see it down; check what cuts this node off, or pass --force to remove it on this node's view alone", membership.ErrRefused, strings.Join(refused, ", "))
			}
			return nil
		},
	}
	nf.add(cmd)
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "say what would be removed, remove nothing")
	cmd.Flags().BoolVar(&force, "force", false, "remove every member unreachable from here, whatever the other vigils report (the quorum rules still apply, and a member raft still links is kept)")
	cmd.Flags().DurationVar(&minDown, "min-down", 5*time.Minute, "how long a majority of the voters' vigils must have seen a member unreachable")
	return cmd
}

func newMembersReplaceCmd(ef *etcdFlags) *cobra.Command {
	var (
		with    string
		timeout time.Duration
	)
	cmd := &cobra.Command{
		Use:   "replace OLD --with NAME=PEER_URL",
		Short: "Replace a member: remove-then-add when OLD is dead, learner-promote-remove when healthy",
		Long: `Replace member OLD (name or ID) with a new member NAME at PEER_URL.

  OLD dead:    remove OLD, add NAME as a learner, wait until it has caught
               up, promote it.
  OLD healthy: add NAME as a learner, wait until it has caught up, promote
               it, then remove OLD (moving raft leadership off it first).

After adding, it prints the flags the new member's etcd must start with
(--initial-cluster ... --initial-cluster-state existing) and waits up to
--timeout for it. Every step checks what is already done, so the command can
be run again after an interruption at any point.`,
		Example: `  vigil members replace cp1 --with cp4=https://10.0.0.14:2380`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name, peer, err := membership.ParseNewMember(with)
			if err != nil {
				return err
			}
			cl, err := ef.cluster()
			if err != nil {
				return err
			}
			defer cl.Close()
			return cl.Replace(cmd.Context(), membership.ReplaceConfig{Old: args[0], NewName: name, NewPeer: peer, Timeout: timeout}, sayTo{cmd.OutOrStdout()}.event)
		},
	}
	cmd.Flags().StringVar(&with, "with", "", "the new member, NAME=PEER_URL (required)")
	cmd.Flags().DurationVar(&timeout, "timeout", 10*time.Minute, "how long to wait for the new member to start and catch up")
	ef.addLockKey(cmd)
	_ = cmd.MarkFlagRequired("with")
	return cmd
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func size(b int64) string {
	if b == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1fMiB", float64(b)/(1<<20))
}
