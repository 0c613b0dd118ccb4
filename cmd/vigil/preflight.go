package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/vigil-ha/vigil/internal/election"
	"github.com/vigil-ha/vigil/internal/etcdcluster"
	"github.com/vigil-ha/vigil/internal/kube"
	"github.com/vigil-ha/vigil/internal/membership"
)

// errNotReadyToJoin is the preflight's "no": the findings say why.
var errNotReadyToJoin = errors.New("a control-plane node would not join cleanly now")

func newMembersPreflightCmd(ef *etcdFlags) *cobra.Command {
	var (
		joining, kubeconfig, lockKey, output string
	)
	cmd := &cobra.Command{
		Use:   "preflight [--for-join NAME]",
		Short: "Tell whether a new control-plane node would join cleanly now, and what to fix if not",
		Long: `Check, before kubeadm join --control-plane, what makes such joins fail:

  - etcd quorum, and every member healthy: kubeadm checks every member, not
    only a quorum, so one dead member fails the join;
  - the learner slot: kubeadm adds the new member as a learner, and etcd
    allows one learner at a time;
  - with --for-join NAME: no etcd member left under that name, and, with
    --kubeconfig, no Ready Node of that name (kubeadm refuses to join over a
    Ready Node; a NotReady one is taken over);
  - the VIP holder: some vigil holds the VIP and renews its lock, so the
    control-plane endpoint answers.

Each failed check says why and prints the commands that fix it. Exit status 0
when the join would pass, 1 when not (or when the checks cannot run).`,
		Example: `  vigil members preflight --for-join cp4 --kubeconfig /etc/kubernetes/admin.conf \
    --etcd-endpoints https://10.0.0.11:2379 --etcd-cacert /etc/kubernetes/pki/etcd/ca.crt \
    --etcd-cert /etc/kubernetes/pki/apiserver-etcd-client.crt \
    --etcd-key /etc/kubernetes/pki/apiserver-etcd-client.key`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "table" && output != "json" {
				return fmt.Errorf("-o %q: use table or json", output)
			}
			var cs kubernetes.Interface
			if kubeconfig != "" {
				var err error
				if cs, err = kube.NewClient(kubeconfig); err != nil {
					return err
				}
			}
			cl, err := ef.cluster()
			if err != nil {
				return err
			}
			defer cl.Close()
			ctx := cmd.Context()
			v, err := cl.View(ctx)
			if err != nil {
				return err
			}
			fs := v.Preflight(joining, ef.fixFlags())
			if joining != "" {
				fs = append(fs, nodeFinding(ctx, cs, joining))
			}
			fs = append(fs, holderFinding(ctx, cl.Etcd(), lockKey))
			if output == "json" {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				if err := enc.Encode(struct {
					Join     bool                 `json:"join"`
					Findings []membership.Finding `json:"findings"`
				}{membership.Passed(fs), fs}); err != nil {
					return err
				}
			} else {
				printFindings(cmd.OutOrStdout(), fs)
			}
			if !membership.Passed(fs) {
				failed := 0
				for _, f := range fs {
					if !f.OK && !f.Skip {
						failed++
					}
				}
				return fmt.Errorf("%w: %d check(s) failed; fix them as printed, then run preflight again", errNotReadyToJoin, failed)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&joining, "for-join", "", "name of the node about to join (kubeadm's node name, which is also its etcd member's)")
	cmd.Flags().StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig to look for a Node named --for-join (optional; the check is skipped without it)")
	cmd.Flags().StringVar(&lockKey, "lock-key", election.DefaultEtcdKey, "etcd key of vigil's lock record (vigil run --lock-key)")
	cmd.Flags().StringVarP(&output, "output", "o", "table", "table or json")
	return cmd
}

// fixFlags are the connection flags a printed fix must repeat.
func (f *etcdFlags) fixFlags() string {
	var parts []string
	if !slices.Equal(f.endpoints, []string{"https://127.0.0.1:2379"}) {
		parts = append(parts, "--etcd-endpoints "+strings.Join(f.endpoints, ","))
	}
	for _, fv := range [][2]string{{"--etcd-cacert", f.ca}, {"--etcd-cert", f.cert}, {"--etcd-key", f.key}} {
		if fv[1] != "" {
			parts = append(parts, fv[0]+" "+fv[1])
		}
	}
	return strings.Join(parts, " ")
}

// nodeFinding looks for a Node named name: kubeadm join refuses to join
// over a Ready one.
func nodeFinding(ctx context.Context, cs kubernetes.Interface, name string) membership.Finding {
	f := membership.Finding{Check: "no Ready Node named " + name}
	if cs == nil {
		f.Skip, f.Detail = true, "not checked: no --kubeconfig"
		return f
	}
	gctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	n, err := cs.CoreV1().Nodes().Get(gctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		f.OK, f.Detail = true, "no Node has this name"
	case err != nil:
		f.Skip, f.Detail = true, "not checked: "+err.Error()
	default:
		ready := false
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
				ready = true
			}
		}
		if ready {
			f.Detail = "Node " + name + " exists and its kubelet reports it Ready: kubeadm join refuses to take it over"
			f.Fix = []string{"if the old machine is really gone: kubectl delete node " + name + "; else give the new node another name"}
		} else {
			f.OK, f.Detail = true, "Node "+name+" exists but is not Ready (left by the old machine): the joining kubelet takes it over"
		}
	}
	return f
}

// holderFinding checks that some vigil holds the VIP: its lock record
// names a holder, and the record changes within the holder's lease
// duration (each renewal rewrites it).
func holderFinding(ctx context.Context, cl *etcdcluster.Cluster, key string) membership.Finding {
	f := membership.Finding{Check: "VIP holder renewing"}
	lock := election.NewEtcdLockOn(cl, key, slog.New(slog.DiscardHandler))
	read := func() (election.Observation, error) {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		return lock.Get(rctx)
	}
	first, err := read()
	switch {
	case err != nil:
		f.Detail = "cannot read the lock " + key + ": " + err.Error()
		f.Fix = []string{"restore etcd quorum first (the checks above)"}
		return f
	case first.Record == nil:
		f.Detail = "no lock record at " + key + ": no vigil run has held the VIP with this --lock-key"
		f.Fix = []string{"start vigil run on the control-plane nodes (vigil manifest pod), or give the --lock-key they use"}
		return f
	case first.Record.MovedTo != "":
		f.Skip, f.Detail = true, "not checked: the election moved to "+first.Record.MovedTo+" (kubectl -n kube-system get lease shows its holder)"
		return f
	case first.Holder() == "":
		f.Detail = "nobody holds the VIP now (the last holder released it)"
		f.Fix = []string{"check vigil run on the control-plane nodes: vigil status, and its log"}
		return f
	}
	wait := first.Record.LeaseDuration() + 200*time.Millisecond
	select {
	case <-ctx.Done():
		f.Skip, f.Detail = true, "not checked: "+ctx.Err().Error()
		return f
	case <-time.After(wait):
	}
	second, err := read()
	switch {
	case err != nil:
		f.Detail = "cannot read the lock " + key + " again: " + err.Error()
	case second.Revision == first.Revision:
		f.Detail = fmt.Sprintf("%s holds the lock but has not renewed it for %v (its lease): its vigil is stopped or cut off", first.Holder(), wait.Round(time.Millisecond))
		f.Fix = []string{"check vigil run on " + first.Holder() + "; a peer takes the VIP over once the lease has expired"}
	case second.Holder() == "":
		f.Detail = first.Holder() + " released the VIP and nobody holds it yet"
		f.Fix = []string{"run preflight again in a second; if it stays so, check vigil run on the control-plane nodes"}
	default:
		f.OK, f.Detail = true, second.Holder()+" holds the VIP and renews its lock"
	}
	return f
}

func printFindings(w io.Writer, fs []membership.Finding) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CHECK\tRESULT\tDETAIL")
	for _, f := range fs {
		res := "ok"
		switch {
		case f.Skip:
			res = "skipped"
		case !f.OK:
			res = "FAIL"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", f.Check, res, f.Detail)
		for _, fix := range f.Fix {
			fmt.Fprintf(tw, "\t\tfix: %s\n", fix)
		}
	}
	_ = tw.Flush()
	if membership.Passed(fs) {
		fmt.Fprintln(w, "yes: a control-plane node can join now")
	} else {
		fmt.Fprintln(w, "no: fix the failed checks, then run preflight again")
	}
}
