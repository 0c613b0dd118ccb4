package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/spf13/cobra"

	"github.com/vigil-ha/vigil/internal/recovery"
	"github.com/vigil-ha/vigil/internal/validate"
)

// kubeadm's paths: etcd's static pod manifest and data directory, and the
// client certificate kubeadm makes for etcd health checks.
const (
	kubeadmEtcdManifest = "/etc/kubernetes/manifests/etcd.yaml"
	kubeadmEtcdDataDir  = "/var/lib/etcd"
	kubeadmEtcdCA       = "/etc/kubernetes/pki/etcd/ca.crt"
	kubeadmEtcdCert     = "/etc/kubernetes/pki/etcd/healthcheck-client.crt"
	kubeadmEtcdKey      = "/etc/kubernetes/pki/etcd/healthcheck-client.key"
)

func newMembersRecoverCmd(ef *etcdFlags) *cobra.Command {
	var (
		dataDir, name, peerURL, manifest string
		dryRun, kubeadm, force           bool
		timeout                          time.Duration
	)
	cmd := &cobra.Command{
		Use:   "recover",
		Short: "Bring etcd back from the loss of its quorum, on a surviving member: make it a one-member cluster that keeps what it committed",
		Long: `Run on a surviving control-plane node when a majority of the etcd members
are lost for good (2 of 3, 3 of 5): the API server is down and no membership
change can commit. recover turns this member's data directory into a
one-member cluster that keeps every entry the member had committed; start
its etcd, and vigil run takes the VIP again. Replacements then join with
kubeadm join or vigil members replace, as for any dead member.

How: etcd's own --force-new-cluster, run once, in-process, on the data
directory: etcd replays the member's write-ahead log (so entries its
database had not written yet are kept too), commits the removal of every
other member, and stops. The cluster ID, member ID and peer URL stay, so
clients and vigil keep following the same cluster.

It refuses, with one line and nothing changed, when: the directory is not an
etcd data directory; etcd runs on it (stop it first, or use --kubeadm); the
member named is not in it, or advertises another peer URL than --peer-url;
the cluster has not lost its quorum (the other members are asked at the
client URLs the data directory lists, with the --etcd-* certificates). The
data directory is copied beside itself first (DATA_DIR.vigil-backup-TIME).

Of several survivors, recover the one that knows the most committed: run on
another, recover refuses and names it (the raft index each has committed:
this member's from its write-ahead log, the others' from etcd's Status).
--force overrides that, and the quorum check, saying what it overrides.

Other members that still answer, without making a quorum, are named: stop
them and wipe their data directories before they come back.

--kubeadm stops etcd and this node's API server by moving their static pod
manifests out of /etc/kubernetes/manifests, waits for the kubelet to stop
etcd, recovers, and moves the manifests back; its defaults are kubeadm's
paths and certificates. (The API server serves nothing without etcd, and
while it runs the kubelet waits about 35 s for it before starting etcd
again.)`,
		Example: `  # kubeadm, on the surviving control-plane node:
  vigil members recover --kubeadm --name cp1 --dry-run
  vigil members recover --kubeadm --name cp1

  # etcd as a service:
  systemctl stop etcd
  vigil members recover --data-dir /var/lib/etcd --name cp1 --peer-url https://10.0.0.11:2380
  systemctl start etcd`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if name == "" {
				h, err := os.Hostname()
				if err != nil {
					return fmt.Errorf("--name not given and no hostname: %w", err)
				}
				name = h
			}
			if kubeadm {
				if !cmd.Flags().Changed("data-dir") {
					dataDir = kubeadmEtcdDataDir
				}
				for _, f := range []struct {
					flag string
					v    *string
					def  string
				}{{"etcd-cacert", &ef.ca, kubeadmEtcdCA}, {"etcd-cert", &ef.cert, kubeadmEtcdCert}, {"etcd-key", &ef.key, kubeadmEtcdKey}} {
					if !cmd.Flags().Changed(f.flag) {
						*f.v = f.def
					}
				}
			} else if cmd.Flags().Changed("manifest") {
				return fmt.Errorf("--manifest is only used with --kubeadm")
			}
			if dataDir == "" {
				return fmt.Errorf("--data-dir is required (kubeadm: /var/lib/etcd, or pass --kubeadm)")
			}
			tc, err := validate.EtcdClientTLS(ef.ca, ef.cert, ef.key)
			if err != nil {
				return err
			}
			say := sayTo{cmd.OutOrStdout()}
			rcfg := recovery.Config{DataDir: dataDir, Name: name, PeerURL: peerURL, TLS: tc, DryRun: dryRun, Force: force, Timeout: timeout}
			if kubeadm && dryRun {
				say.line("would move the static pod manifests of the API server and etcd out of %s, and wait for the kubelet to stop etcd", filepath.Dir(manifest))
			}
			if !kubeadm || dryRun {
				_, err := recovery.Recover(cmd.Context(), rcfg, say.line)
				return err
			}
			return recoverKubeadm(cmd, rcfg, manifest, timeout, say)
		},
	}
	f := cmd.Flags()
	f.StringVar(&dataDir, "data-dir", "", "the stopped member's etcd data directory (with --kubeadm: "+kubeadmEtcdDataDir+")")
	f.StringVar(&name, "name", "", "the member's name, etcd's --name (default: the host name, as kubeadm names members)")
	f.StringVar(&peerURL, "peer-url", "", "if set, must be the member's peer URL: a check that this is the node meant")
	f.BoolVar(&dryRun, "dry-run", false, "check and say what would be done; change nothing")
	f.BoolVar(&force, "force", false, "recover although the members that answer could still make a quorum with this one, or one of them has committed more (it loses what only they have, and they must be stopped and wiped); the other refusals stand")
	f.BoolVar(&kubeadm, "kubeadm", false, "stop and start etcd's static pod around the recovery, with kubeadm's paths and certificates as defaults")
	f.StringVar(&manifest, "manifest", kubeadmEtcdManifest, "with --kubeadm: etcd's static pod manifest")
	f.DurationVar(&timeout, "timeout", 2*time.Minute, "how long to wait for etcd to stop (--kubeadm) and for the one-member start")
	return cmd
}

// recoverKubeadm moves the static pod manifests of the API server (when
// there is one beside etcd's) and of etcd out of the kubelet's manifest
// directory, waits until etcd has let go of its data directory, recovers,
// and puts the manifests back whatever happened: a refusal or a failure
// leaves the node as it was (with the backup beside the data directory
// after a failure).
//
// Why the API server too: without etcd it serves nothing, and while it
// runs the kubelet's last step for the stopped etcd pod (deleting its
// mirror pod through that API server) waits for the server's request
// timeout, about 35 s in the kubeadm lab, before the kubelet starts etcd
// again. With the API server stopped, the request fails at once.
func recoverKubeadm(cmd *cobra.Command, cfg recovery.Config, manifest string, timeout time.Duration, say sayTo) error {
	if _, err := os.Stat(manifest); err != nil {
		return fmt.Errorf("--kubeadm: etcd's static pod manifest: %w", err)
	}
	// What can be checked while etcd runs is checked before it is stopped.
	if _, err := os.Stat(filepath.Join(cfg.DataDir, "member", "snap", "db")); err != nil {
		return fmt.Errorf("%w: %s is not an etcd data directory (no member/snap/db in it)", recovery.ErrRefused, cfg.DataDir)
	}
	type pod struct{ manifest, parked, what string }
	var pods []pod
	apiserver := filepath.Join(filepath.Dir(manifest), "kube-apiserver.yaml")
	if _, err := os.Stat(apiserver); err == nil {
		pods = append(pods, pod{manifest: apiserver, what: "the API server"})
	}
	pods = append(pods, pod{manifest: manifest, what: "etcd"})
	for i := range pods {
		pods[i].parked = filepath.Join(filepath.Dir(filepath.Dir(pods[i].manifest)), filepath.Base(pods[i].manifest)+".vigil-recover")
		if _, err := os.Stat(pods[i].parked); err == nil {
			return fmt.Errorf("%s exists: an earlier recover was interrupted; put it back in %s, or remove it, first", pods[i].parked, filepath.Dir(pods[i].manifest))
		}
	}
	var moved []pod
	// Back in the reverse order: etcd first, then the API server.
	defer func() {
		for _, p := range slices.Backward(moved) {
			if err := os.Rename(p.parked, p.manifest); err != nil {
				say.line("could not put %s back (%v): move it to %s by hand to start %s", p.parked, err, p.manifest, p.what)
				continue
			}
			say.line("moved %s back: the kubelet starts %s", p.manifest, p.what)
		}
	}()
	for _, p := range pods {
		if err := os.Rename(p.manifest, p.parked); err != nil {
			return fmt.Errorf("--kubeadm: stop %s: %w", p.what, err)
		}
		moved = append(moved, p)
		say.line("moved %s to %s: the kubelet stops %s", p.manifest, p.parked, p.what)
	}
	if err := recovery.WaitStopped(cmd.Context(), cfg.DataDir, timeout); err != nil {
		return err
	}
	_, err := recovery.Recover(cmd.Context(), cfg, say.line)
	return err
}
