package lab

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vigil-ha/vigil/internal/clock"
)

// kubeadmRecoverBound is the most the API may take to answer through the
// VIP again, from the start of vigil members recover --kubeadm (issue 33's
// goal for the kubeadm lab): the kubelet stops and starts etcd's static pod.
const kubeadmRecoverBound = 120 * time.Second

// recoverMachines runs kubeadm-recover: holder and one more node are
// powered off, the third recovers, and two new machines join.
func (l *Lab) recoverMachines(ctx context.Context, holder *Node, d *drillRun, k *KubeadmResult, phase func(string, string)) error {
	survivor := l.otherNode(holder.Name)
	var lost []*Node
	for _, n := range l.st.Nodes {
		if n != survivor {
			lost = append(lost, n)
		}
	}
	x := &RecoveryResult{Survivor: survivor.Name, BoundMillis: millis(kubeadmRecoverBound), Keys: recoverKeys}
	for _, n := range lost {
		x.Lost = append(x.Lost, n.Name)
	}
	k.Recovery = x

	// Keys the survivor has applied: what the recovery must keep.
	all, err := l.kubeadmEtcdClient()
	if err != nil {
		return err
	}
	defer all.Close()
	own, err := l.kubeadmEtcdClientOf([]*Node{survivor})
	if err != nil {
		return err
	}
	defer own.Close()
	if err := writeKeysApplied(ctx, all, own); err != nil {
		return fmt.Errorf("lab: %s: %w", survivor.Name, err)
	}
	phase(fmt.Sprintf("%d keys written, applied by %s", recoverKeys, survivor.Name), "")

	k.faultAt = time.Now()
	for _, n := range lost {
		d.setDead(n.Name, true)
		if err := l.powerOff(ctx, n); err != nil {
			return err
		}
	}
	phase("power off "+strings.Join(x.Lost, ", "), "")
	// No quorum: the survivor's vigil cannot take the lock, and the VIP
	// stays dark. A few lease durations show it.
	for range 30 {
		if !clock.Sleep(ctx, 100*time.Millisecond) {
			return ctx.Err()
		}
		h, err := d.w.holders([]*Node{survivor})
		if err != nil {
			return err
		}
		if len(h) > 0 {
			return fmt.Errorf("%s took the VIP on an etcd without quorum", survivor.Name)
		}
	}
	phase("quorum lost, VIP dark", "")

	// The operator looks first: a dry run, etcd still running.
	dctx, cancel := context.WithTimeout(ctx, time.Minute)
	dry, err := l.machineRun(dctx, survivor, l.vigilBin, "members", "recover", "--kubeadm", "--name", survivor.Name, "--dry-run")
	cancel()
	if err != nil || !strings.Contains(dry, "dry run: nothing changed") {
		return fmt.Errorf("vigil members recover --kubeadm --dry-run, etcd running: %v\n%s", err, dry)
	}
	phase("vigil members recover --kubeadm --dry-run", lastLine(dry))

	start := time.Now()
	x.DarkMillis = millis(start.Sub(k.faultAt))
	cctx, cancel := context.WithTimeout(ctx, 4*time.Minute)
	out, err := l.machineRun(cctx, survivor, l.vigilBin, "members", "recover", "--kubeadm", "--name", survivor.Name)
	cancel()
	x.Output = strings.Split(strings.TrimSpace(out), "\n")
	if err != nil {
		return fmt.Errorf("vigil members recover --kubeadm: %w", err)
	}
	phase("vigil members recover --kubeadm", lastLine(out))

	// The two machines that join later are made while the survivor's
	// control plane comes back (about 10 s each: containerd, images,
	// kubelet); the wait below touches nothing else of the lab.
	machines := make(chan newMachines, 1)
	go func() {
		var m newMachines
		for range 2 {
			n, err := l.newMachineNode(ctx)
			if err != nil {
				m.err = err
				break
			}
			m.nodes = append(m.nodes, n)
		}
		machines <- m
	}()
	made := func() (newMachines, error) {
		m := <-machines
		machines <- newMachines{err: errors.New("lab: new machines taken twice")}
		return m, m.err
	}
	defer func() { _, _ = made() }()

	// The API through the VIP: a Node list, as kubectl get nodes.
	c, err := l.kubeClient()
	if err != nil {
		return err
	}
	for {
		lctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		_, err := c.CoreV1().Nodes().List(lctx, metav1.ListOptions{})
		cancel()
		if err == nil {
			break
		}
		if time.Since(start) > kubeadmRecoverBound {
			return fmt.Errorf("the API did not answer through the VIP within %v of vigil members recover: %w", kubeadmRecoverBound, err)
		}
		if !clock.Sleep(ctx, 200*time.Millisecond) {
			return ctx.Err()
		}
	}
	k.movedAt = time.Now()
	x.BackMillis = millis(k.movedAt.Sub(start))
	phase("Node list through the VIP", "")
	m, err := made()
	if err != nil {
		return err
	}
	phase("new machines "+m.nodes[0].Name+", "+m.nodes[1].Name, "containerd, images, kubelet; made while the API came back")

	// Every key is back (a new client: the first one's connection to the
	// restarted member may be waiting out gRPC's reconnect backoff).
	if err := func() error {
		cli, err := l.kubeadmEtcdClientOf([]*Node{survivor})
		if err != nil {
			return err
		}
		defer cli.Close()
		gctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		resp, err := cli.Get(gctx, recoverPrefix, clientv3.WithPrefix())
		if err != nil {
			return fmt.Errorf("lab: read the keys back: %w", err)
		}
		x.KeysBack = countRecoverKeys(resp)
		return nil
	}(); err != nil {
		return err
	}
	if x.KeysBack != x.Keys {
		return fmt.Errorf("after recover %d of the %d keys the survivor had applied are back", x.KeysBack, x.Keys)
	}
	phase(fmt.Sprintf("%d keys read back", x.KeysBack), "")

	// The lost machines' Nodes go, as the runbook says; then two new
	// machines join (kubeadm adds each as a learner and promotes it).
	for _, name := range x.Lost {
		dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := c.CoreV1().Nodes().Delete(dctx, name, metav1.DeleteOptions{})
		cancel()
		if err != nil {
			return fmt.Errorf("lab: kubectl delete node %s: %w", name, err)
		}
	}
	for _, n := range m.nodes {
		if _, err := l.kubeadmJoinOutput(ctx, n, true); err != nil {
			k.JoinFailed, k.JoinError = true, joinFailure(err)
			return fmt.Errorf("kubeadm join --control-plane of %s after the recovery: %w", n.Name, err)
		}
		k.NewNodes = append(k.NewNodes, n.Name)
		if err := l.waitBackendUp(ctx, n, 2*time.Minute); err != nil {
			return err
		}
		phase("kubeadm join "+n.Name, "")
	}
	ms, err := l.kubeadmMembers(ctx)
	if err != nil {
		return err
	}
	k.MembersAfterJoin = len(ms)
	for _, n := range l.st.Nodes {
		if _, ok := ms[n.Name]; !ok {
			return fmt.Errorf("after the joins etcd has %v, not %s", ms, n.Name)
		}
	}
	if len(ms) != 3 || len(l.st.Nodes) != 3 || !slices.Contains(l.st.Nodes, survivor) {
		return fmt.Errorf("after the joins etcd has %d members, the lab %d nodes", len(ms), len(l.st.Nodes))
	}
	if err := l.waitEtcdMembersHealthy(ctx, 2*time.Minute); err != nil {
		return err
	}
	if err := l.waitNodesReady(ctx, 3*time.Minute); err != nil {
		return err
	}
	phase("3 voters, Nodes Ready", "")
	return nil
}

// newMachines is what the goroutine that makes new machines returns.
type newMachines struct {
	nodes []*Node
	err   error
}

// writeKeysApplied writes the recover drills' keys through all, then waits
// until own's member has applied the last of them (a serializable read
// answered by that member alone).
func writeKeysApplied(ctx context.Context, all, own *clientv3.Client) error {
	cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if _, err := all.Delete(cctx, recoverPrefix, clientv3.WithPrefix()); err != nil {
		return fmt.Errorf("clear %s: %w", recoverPrefix, err)
	}
	var rev int64
	for i := range recoverKeys {
		resp, err := all.Put(cctx, recoverKey(i), recoverValue(i))
		if err != nil {
			return fmt.Errorf("write %s: %w", recoverKey(i), err)
		}
		rev = resp.Header.Revision
	}
	for {
		resp, err := own.Get(cctx, recoverKey(recoverKeys-1), clientv3.WithSerializable())
		if err == nil && resp.Header.Revision >= rev {
			return nil
		}
		if !clock.Sleep(cctx, 50*time.Millisecond) {
			return fmt.Errorf("did not apply revision %d: %v", rev, err)
		}
	}
}

// countRecoverKeys counts the drill's keys in resp that have their values.
func countRecoverKeys(resp *clientv3.GetResponse) int {
	want := map[string]string{}
	for i := range recoverKeys {
		want[recoverKey(i)] = recoverValue(i)
	}
	n := 0
	for _, kv := range resp.Kvs {
		if v, ok := want[string(kv.Key)]; ok && v == string(kv.Value) {
			n++
		}
	}
	return n
}
