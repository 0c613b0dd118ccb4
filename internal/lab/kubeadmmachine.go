package lab

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/vigil-ha/vigil/internal/clock"
)

// waitHolderOther waits until a node other than not holds the VIP.
func (l *Lab) waitHolderOther(ctx context.Context, w *vipWatch, not string, d time.Duration) (string, error) {
	others := slices.DeleteFunc(slices.Clone(l.st.Nodes), func(m *Node) bool { return m.Name == not })
	h, err := waitAnyHolder(ctx, w, others, d)
	if err != nil && ctx.Err() == nil {
		return "", fmt.Errorf("no other node took the VIP within %v", d)
	}
	return h, err
}

// replaceMachine powers victim off for good and joins a new control-plane
// node in its place with kubeadm join, through the VIP.
func (l *Lab) replaceMachine(ctx context.Context, victim *Node, w *vipWatch, k *KubeadmResult, phase func(string, string)) error {
	if err := l.powerOff(ctx, victim); err != nil {
		return err
	}
	phase("power off", victim.Name)
	holder, err := l.waitHolderOther(ctx, w, victim.Name, 30*time.Second)
	if err != nil {
		return err
	}
	k.movedAt = time.Now()
	phase("failover", "VIP on "+holder)
	// What an operator asks before joining a replacement: with a member
	// powered off, the answer must be no, naming it and the fix.
	pf, err := l.preflight(ctx, "after the power-off", "")
	if err != nil {
		return err
	}
	k.Preflights = append(k.Preflights, pf)
	phase("vigil members preflight", preflightLine(pf))
	if pf.Join || !slices.ContainsFunc(pf.Failed, func(f string) bool { return strings.Contains(f, victim.Name) }) || len(pf.Fixes) == 0 {
		return fmt.Errorf("preflight after %s was powered off said %+v; want no, naming it, with a fix", victim.Name, pf)
	}
	// The replacement machine is made while vigil waits out --prune-after
	// (it is not joined until the preflight below).
	n, err := l.newMachineNode(ctx)
	if err != nil {
		return err
	}
	k.NewNode = n.Name
	phase("new machine "+n.Name, "containerd, images, kubelet")
	if k.Pruning {
		bound := l.st.Settings.PruneAfter + 90*time.Second
		if err := l.waitMemberGone(ctx, victim.Name, bound); err != nil {
			return err
		}
		phase("vigil pruned "+victim.Name, "")
	}
	// Pruned: the join will pass, and preflight must say so. Not pruned:
	// the dead member is still there, and preflight must say no.
	pf, err = l.preflight(ctx, "before kubeadm join", n.Name)
	if err != nil {
		return err
	}
	k.Preflights = append(k.Preflights, pf)
	phase("vigil members preflight --for-join "+n.Name, preflightLine(pf))
	if pf.Join != k.Pruning {
		return fmt.Errorf("preflight before the join (pruning %v) said %+v", k.Pruning, pf)
	}
	out, err := l.kubeadmJoinOutput(ctx, n, true)
	if err != nil {
		k.JoinFailed = true
		k.JoinError = joinFailure(err)
		phase("kubeadm join (failed)", k.JoinError)
		return fmt.Errorf("kubeadm join --control-plane failed: %w", err)
	}
	k.EtcdUnhealthyAtJoin = strings.Contains(out, "some members are not healthy")
	ms, err := l.kubeadmMembers(ctx)
	if err != nil {
		return err
	}
	_, k.DeadMemberLeft = ms[victim.Name]
	k.MembersAfterJoin = len(ms)
	phase("kubeadm join", fmt.Sprintf("passed; etcd has %d members", len(ms)))
	switch {
	case k.Pruning && (k.DeadMemberLeft || k.EtcdUnhealthyAtJoin):
		return fmt.Errorf("with pruning on, the join still met the dead member (unhealthy at join: %v, left in etcd: %v)", k.EtcdUnhealthyAtJoin, k.DeadMemberLeft)
	case !k.Pruning && !(k.DeadMemberLeft && k.EtcdUnhealthyAtJoin):
		return fmt.Errorf("without pruning the lab did not reproduce the dead member problem (unhealthy at join: %v, left in etcd: %v)", k.EtcdUnhealthyAtJoin, k.DeadMemberLeft)
	}
	if k.DeadMemberLeft {
		// What the seed's user did by hand, so that the lab is whole
		// again for the next run.
		if err := l.removeMemberByHand(ctx, victim.Name); err != nil {
			return err
		}
		phase("dead member removed by hand", "")
	}
	if err := l.waitBackendUp(ctx, n, 2*time.Minute); err != nil {
		return err
	}
	phase("new API server is a VIP backend", "")
	if err := l.waitNodesReady(ctx, 3*time.Minute); err != nil {
		return err
	}
	phase("Node Ready", n.Name)
	return nil
}

// joinFailure is the line of kubeadm's output that says why a join failed.
func joinFailure(err error) string {
	lines := strings.Split(err.Error(), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], "error") || strings.Contains(lines[i], "etcd") {
			return strings.TrimSpace(lines[i])
		}
	}
	return strings.TrimSpace(lines[0])
}

// powerOff cuts n's link and kills every process of the machine, as a
// power loss would, and forgets the node: its index is not reused.
func (l *Lab) powerOff(ctx context.Context, n *Node) error {
	if err := l.setNodePorts(ctx, n, false); err != nil {
		return err
	}
	if err := l.killNode(ctx, n); err != nil {
		return err
	}
	if err := l.destroyMachine(n); err != nil {
		return err
	}
	return l.retireNode(ctx, n)
}

// destroyMachine releases the mount and UTS namespaces and the cgroup root
// of a node whose processes are gone.
func (l *Lab) destroyMachine(n *Node) error {
	return errors.Join(unmountUnder(l.nsDir(n)), removeCgroupRoots(cgroupRoot(n)))
}

// newMachineNode adds a control-plane machine with the next free index.
func (l *Lab) newMachineNode(ctx context.Context) (*Node, error) {
	in, err := l.kubeadmInputs()
	if err != nil {
		return nil, err
	}
	idx := 0
	for _, n := range l.st.Nodes {
		idx = max(idx, n.Index)
	}
	for _, i := range l.st.Retired {
		idx = max(idx, i)
	}
	idx++
	if idx > maxNodeIndex {
		return nil, errors.New("lab: no free node index; run vigil-lab down and up again")
	}
	n := &Node{Name: "n" + itoa(idx), Index: idx, IP: nodeIP(idx), PIDs: map[string]int{}}
	l.editNodes(appendNode(n))
	if err := l.save(); err != nil {
		return nil, err
	}
	return n, l.addMachine(ctx, n, in)
}

// waitBackendUp waits until the VIP holder's load balancer has n's API
// server up.
func (l *Lab) waitBackendUp(ctx context.Context, n *Node, d time.Duration) error {
	want := fmt.Sprintf("%s:%d", n.IP, APIServerPort)
	deadline := time.Now().Add(d)
	var last string
	for time.Now().Before(deadline) {
		holders, err := l.vipHolders()
		if err == nil && len(holders) == 1 {
			rep, err := l.vigilStatus(ctx, holders[0])
			if err == nil {
				for _, b := range rep.Backends {
					if b.Address == want && b.State == "up" {
						return nil
					}
				}
				last = fmt.Sprintf("%s is not up on %s's load balancer", want, holders[0])
			} else {
				last = err.Error()
			}
		}
		if !clock.Sleep(ctx, 200*time.Millisecond) {
			return ctx.Err()
		}
	}
	return fmt.Errorf("lab: %s after %v", last, d)
}
