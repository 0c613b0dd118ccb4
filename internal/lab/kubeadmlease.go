package lab

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vigil-ha/vigil/internal/clock"
	"github.com/vigil-ha/vigil/internal/election"
)

// leaseKubeconfig is where each node's kubeconfig for vigil's Lease
// election lives, on the node (docs/kubeadm.md, "Moving to the Lease
// election").
const leaseKubeconfig = "/etc/kubernetes/vigil.conf"

// leaseMovedTo is what the retired etcd record names, for vigil run's
// default Lease.
const leaseMovedTo = "lease " + election.DefaultLeaseNamespace + "/" + election.DefaultLeaseName

// moveToLease moves the cluster to the Lease election, the holder's node
// last, and checks the outcome: the VIP on the Lease's holder, the etcd
// election retired.
func (l *Lab) moveToLease(ctx context.Context, holder *Node, w *vipWatch, k *KubeadmResult, phase func(string, string)) error {
	rec, err := l.etcdLockRecord(ctx)
	if err != nil {
		return err
	}
	if rec != nil && rec.MovedTo != "" {
		return fmt.Errorf("this lab moved to the Lease election already (etcd's lock record names %q); the move is one-way", rec.MovedTo)
	}
	c, err := l.kubeClient()
	if err != nil {
		return err
	}
	rbac, err := exec.CommandContext(ctx, l.vigilBin, "manifest", "rbac").Output()
	if err != nil {
		return fmt.Errorf("lab: vigil manifest rbac: %w", err)
	}
	if err := applyYAML(ctx, c, rbac); err != nil {
		return fmt.Errorf("lab: apply vigil manifest rbac: %w", err)
	}
	phase("vigil manifest rbac applied", "")
	for _, n := range l.st.Nodes {
		if err := l.writeLeaseKubeconfig(ctx, n); err != nil {
			return err
		}
	}
	phase("kubeconfigs written", "kubeadm kubeconfig user --client-name vigil on every node, each for its own API server")

	// The other nodes first, in a random order: their new vigils wait
	// until the etcd election's holder lets go.
	var order []*Node
	for _, i := range rand.Perm(len(l.st.Nodes)) {
		if n := l.st.Nodes[i]; n != holder {
			order = append(order, n)
		}
	}
	order = append(order, holder)
	for _, n := range order {
		k.Order = append(k.Order, n.Name)
	}
	// Their manifests are rewritten together, as a rollout to the
	// stand-bys would: kubelet takes about 15 s to replace a static pod.
	standbys := order[:len(order)-1]
	olds := map[*Node]int{}
	for _, n := range standbys {
		old, err := vigilProcess(ctx, n, "run")
		if err != nil {
			return err
		}
		olds[n] = old
	}
	for _, n := range standbys {
		if err := l.writeVigilManifest(ctx, n, "--election", "kubernetes", "--kubeconfig", leaseKubeconfig); err != nil {
			return err
		}
	}
	for _, n := range standbys {
		if err := waitLeaseVigil(ctx, n, olds[n]); err != nil {
			return err
		}
		if on, err := w.has(holder.Name); err != nil || !on {
			return fmt.Errorf("the VIP left %s when %s moved to the Lease election (err %v): a vigil waiting for the etcd election must not move it", holder.Name, n.Name, err)
		}
		phase(n.Name+" on the Lease election", "its vigil waits: the etcd election's holder is live")
	}

	// The holder last: its vigil hands the VIP over as it stops, the
	// first waiting vigil retires the etcd election, and the Lease decides.
	old, err := vigilProcess(ctx, holder, "run")
	if err != nil {
		return err
	}
	k.faultAt = time.Now()
	if err := l.writeVigilManifest(ctx, holder, "--election", "kubernetes", "--kubeconfig", leaseKubeconfig); err != nil {
		return err
	}
	gone, err := waitVIPGone(ctx, w, holder.Name, 60*time.Second)
	if err != nil {
		return err
	}
	k.VIPGoneMs = millis(gone.Sub(k.faultAt))
	// The old pod's logs go with it once kubelet removes it: kept in the
	// node's directory for a failure's report (savedPodLogs).
	l.savePodLogs(holder)
	phase("kubelet stopped the holder's pod, VIP gone from "+holder.Name, "")
	// The next holder is another node: the holder's own vigil on the Lease
	// election starts only after its old pod is gone, seconds later. (A VIP
	// back on the holder meanwhile, while two nodes hold it, is what the
	// samples judge as a split brain.)
	others := slices.DeleteFunc(slices.Clone(l.st.Nodes), func(m *Node) bool { return m == holder })
	next, err := waitAnyHolder(ctx, w, others, 30*time.Second)
	l.savePodLogs(holder)
	if err != nil {
		return err
	}
	k.movedAt = time.Now()
	phase("VIP on "+next, "the first vigil on the Lease election to hold it")
	if back, err := w.has(holder.Name); err == nil && back {
		return fmt.Errorf("the VIP is on %s and on %s, whose old vigil is stopping", next, holder.Name)
	}
	if err := waitLeaseVigil(ctx, holder, old); err != nil {
		return err
	}
	phase(holder.Name+" on the Lease election", "")

	lease, err := c.CoordinationV1().Leases(election.DefaultLeaseNamespace).Get(ctx, election.DefaultLeaseName, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("lab: read the Lease: %w", err)
	}
	if lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity != next {
		named := "nobody"
		if lease.Spec.HolderIdentity != nil {
			named = strconv.Quote(*lease.Spec.HolderIdentity)
		}
		return fmt.Errorf("the VIP is on %s but the Lease names %s", next, named)
	}
	k.LeaseHolder = next
	if rec, err = l.etcdLockRecord(ctx); err != nil {
		return err
	}
	if rec == nil || rec.MovedTo != leaseMovedTo {
		return fmt.Errorf("the etcd election was not retired: its record is %+v", rec)
	}
	phase("checked", fmt.Sprintf("the Lease names %s; etcd's record says the election moved to %s", next, rec.MovedTo))
	_, err = l.waitStable(ctx, recoverTimeout)
	return err
}

// writeLeaseKubeconfig makes leaseKubeconfig on n with kubeadm kubeconfig
// user, for the user vigil, pointing at n's own API server: kubeadm's
// configuration names n's address and no controlPlaneEndpoint.
func (l *Lab) writeLeaseKubeconfig(ctx context.Context, n *Node) error {
	version, err := l.kubeadmVersion(ctx)
	if err != nil {
		return err
	}
	etc := filepath.Join(l.machineDir(n), "etc-kubernetes")
	cfg := "vigil-kubeconfig.yaml"
	doc := fmt.Sprintf("apiVersion: kubeadm.k8s.io/v1beta4\nkind: InitConfiguration\nlocalAPIEndpoint:\n  advertiseAddress: %s\n---\napiVersion: kubeadm.k8s.io/v1beta4\nkind: ClusterConfiguration\nkubernetesVersion: %s\n", n.IP, version)
	if err := os.WriteFile(filepath.Join(etc, cfg), []byte(doc), 0o600); err != nil {
		return err
	}
	defer os.Remove(filepath.Join(etc, cfg))
	argv := l.machineArgv(n, filepath.Join(filepath.Dir(l.selfBin), "kubeadm"), "kubeconfig", "user", "--client-name", "vigil", "--config", "/etc/kubernetes/"+cfg)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("lab: kubeadm kubeconfig user on %s: %w: %s", n.Name, err, strings.TrimSpace(stderr.String()))
	}
	if want := fmt.Sprintf("server: https://%s:%d", n.IP, APIServerPort); !strings.Contains(string(out), want) {
		return fmt.Errorf("lab: kubeadm kubeconfig user on %s does not say %q", n.Name, want)
	}
	tmp := filepath.Join(etc, ".vigil.conf.tmp")
	if err := os.WriteFile(tmp, out, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(etc, filepath.Base(leaseKubeconfig)))
}

// waitLeaseVigil waits until kubelet runs, on n, a vigil other than old, on
// the Lease election.
func waitLeaseVigil(ctx context.Context, n *Node, old int) error {
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if p, err := vigilProcess(ctx, n, "run"); err == nil && p != old {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p))
			if err == nil && slices.Contains(strings.Split(string(b), "\x00"), "kubernetes") {
				return nil
			}
		}
		if !clock.Sleep(ctx, 100*time.Millisecond) {
			return ctx.Err()
		}
	}
	return fmt.Errorf("kubelet did not start vigil with the Lease election on %s within 60s", n.Name)
}

// waitAnyHolder waits until exactly one of nodes holds the VIP.
func waitAnyHolder(ctx context.Context, w *vipWatch, nodes []*Node, d time.Duration) (string, error) {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if h, err := w.holders(nodes); err == nil && len(h) == 1 {
			return h[0], nil
		}
		if !clock.Sleep(ctx, 5*time.Millisecond) {
			return "", ctx.Err()
		}
	}
	return "", fmt.Errorf("no node took the VIP within %v", d)
}

// etcdLockRecord reads vigil's etcd lock record (nil when absent).
func (l *Lab) etcdLockRecord(ctx context.Context) (*election.Record, error) {
	var resp *clientv3.GetResponse
	err := l.withKubeadmEtcd(ctx, func(ctx context.Context, cli *clientv3.Client) (err error) {
		resp, err = cli.Get(ctx, election.DefaultEtcdKey)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("lab: read etcd's lock record: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return nil, nil
	}
	var rec election.Record
	if err := json.Unmarshal(resp.Kvs[0].Value, &rec); err != nil {
		return nil, fmt.Errorf("lab: etcd's lock record: %w", err)
	}
	return &rec, nil
}

// savePodLogs copies the log files of n's vigil pods (both containers,
// every pod directory kubelet still has) into n's directory, under the
// same relative paths: a failure's report then shows the pods kubelet has
// removed since (the tests' vigilPodLogs).
func (l *Lab) savePodLogs(n *Node) {
	dst := filepath.Join(l.nodeDir(n), "saved-pod-logs")
	files, _ := filepath.Glob(filepath.Join(l.nodeDir(n), "machine", "var-log-pods", "kube-system_vigil-*", "*", "*.log"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		rel, err := filepath.Rel(filepath.Join(l.nodeDir(n), "machine", "var-log-pods"), f)
		if err != nil {
			continue
		}
		out := filepath.Join(dst, rel)
		_ = os.MkdirAll(filepath.Dir(out), 0o755)
		_ = os.WriteFile(out, b, 0o644)
	}
}
