package main

import (
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/vigil-ha/vigil/internal/announce"
	"github.com/vigil-ha/vigil/internal/daemon"
	"github.com/vigil-ha/vigil/internal/election"
	"github.com/vigil-ha/vigil/internal/vip"
)

func newRunCmd() *cobra.Command {
	var (
		cfg       daemon.Config
		vipFlag   string
		logLevel  string
		logFormat string
		guard     bool
	)
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run the control-plane daemon: elect a leader and hold the VIP",
		Long: `Run the control-plane node daemon.

Every control-plane node runs "vigil run" with the same --vip. The nodes elect
one leader through etcd (a compare-and-swap lock record, no consensus of our
own); the leader adds the VIP to --interface, announces it with gratuitous ARP
(IPv4) or unsolicited neighbour advertisements (IPv6), and re-announces it
periodically. A node joins or leaves the election by starting or stopping this
command; there is no peer list.

Safety: a leader that cannot renew its lease for --renew-deadline removes the
VIP, and a candidate waits a whole --lease-duration, on its own clock, before
it takes an unrenewed lock. --lease-duration minus --renew-deadline (at least
100ms) is the margin that keeps two nodes from holding the VIP at once. While
etcd itself is electing a raft leader nobody can take the lock, so the holder
keeps the VIP through etcd elections.

On SIGTERM or SIGINT the VIP is removed first, then the lock is released so a
peer takes over at once. If vigil is killed outright, a guard child process
removes the VIP at once (--guard), and the kernel drops it when its refreshed
lifetime runs out (--vip-lifetime). etcd being unreachable at start is not an error (with
kubeadm it starts after vigil): vigil retries with backoff and never holds the
VIP meanwhile.`,
		Example: `  vigil run --vip 10.250.0.100/24 --interface eth0 --node-name cp1 \
    --election etcd --etcd-endpoints https://10.250.0.11:2379,https://10.250.0.12:2379 \
    --etcd-cacert /etc/kubernetes/pki/etcd/ca.crt \
    --etcd-cert /etc/kubernetes/pki/apiserver-etcd-client.crt \
    --etcd-key /etc/kubernetes/pki/apiserver-etcd-client.key`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := newLogger(logLevel, logFormat)
			if err != nil {
				return err
			}
			if cfg.VIP, err = daemon.ParseVIP(vipFlag); err != nil {
				return err
			}
			if guard {
				if cfg.GuardBinary, err = os.Executable(); err != nil {
					return fmt.Errorf("find own executable for the VIP guard: %w", err)
				}
			}
			return daemon.Run(cmd.Context(), cfg, log)
		},
	}
	f := cmd.Flags()
	f.StringVar(&vipFlag, "vip", "", "virtual IP with prefix length, e.g. 10.250.0.100/24 (a bare address means /32 or /128)")
	f.StringVar(&cfg.Interface, "interface", "", "interface that carries the VIP, e.g. eth0")
	host, _ := os.Hostname() // "" if unknown; Validate then asks for --node-name
	f.StringVar(&cfg.NodeName, "node-name", host, "this node's name in the election; unique per control-plane node")
	f.StringVar(&cfg.Election, "election", "etcd", "election backend: etcd")
	f.StringSliceVar(&cfg.EtcdEndpoints, "etcd-endpoints", nil, "comma-separated etcd client URLs to start from; vigil then follows the client URLs the members advertise")
	f.StringVar(&cfg.EtcdCACert, "etcd-cacert", "", "CA bundle that signed the etcd server certificates")
	f.StringVar(&cfg.EtcdCert, "etcd-cert", "", "etcd client certificate")
	f.StringVar(&cfg.EtcdKey, "etcd-key", "", "etcd client key")
	f.StringVar(&cfg.LockKey, "lock-key", election.DefaultEtcdKey, "etcd key that holds the lock record")
	f.StringVar(&cfg.EtcdMemberName, "etcd-member-name", "", "this node's etcd member name (default: --node-name)")
	f.BoolVar(&cfg.ShedRaftLeadership, "shed-etcd-leadership", true, "while holding the VIP, move etcd raft leadership to another member, so one crash never costs both a VIP failover and an etcd election")
	f.DurationVar(&cfg.LeaseDuration, "lease-duration", election.DefaultLeaseDuration, "how long candidates wait, on their own clock, before taking an unrenewed lock; failover takes about this long")
	f.DurationVar(&cfg.RenewDeadline, "renew-deadline", election.DefaultRenewDeadline, "the leader removes the VIP when no renewal succeeded for this long; must be at least 100ms below --lease-duration")
	f.DurationVar(&cfg.RetryPeriod, "retry-period", election.DefaultRetryPeriod, "interval between renewals and between candidate reads")
	f.DurationVar(&cfg.AnnounceInterval, "announce-interval", announce.DefaultInterval, "interval between periodic gratuitous ARP / neighbour advertisements")
	f.DurationVar(&cfg.VIPLifetime, "vip-lifetime", vip.DefaultLifetime, "kernel lifetime of the VIP, refreshed every second by the holder: if vigil is killed outright the kernel drops the VIP after this; 0 disables")
	f.BoolVar(&guard, "guard", true, "run a small guard process that removes the VIP the moment vigil dies, even by SIGKILL")
	f.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	f.StringVar(&logFormat, "log-format", "text", "text or json")
	return cmd
}

func newGuardCmd() *cobra.Command {
	var cfg daemon.GuardConfig
	cmd := &cobra.Command{
		Use:    "guard",
		Short:  "Remove the VIP when standard input closes (started by vigil run)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(_ *cobra.Command, _ []string) error {
			// Only the death of vigil run, which closes our stdin, may end
			// the guard; a signal meant for the whole group must not.
			signal.Ignore(syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
			log := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("component", "guard")
			return daemon.Guard(cfg, os.Stdin, log)
		},
	}
	cmd.Flags().StringVar(&cfg.VIP, "vip", "", "VIP to remove")
	cmd.Flags().StringVar(&cfg.Interface, "interface", "", "interface that carries it")
	return cmd
}
