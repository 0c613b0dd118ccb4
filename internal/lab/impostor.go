package lab

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"syscall"
	"time"

	"github.com/vigil-ha/vigil/internal/clock"
)

// impostorEtcd replaces node n's etcd member by an impostor for hold: the
// member is SIGKILLed and a fresh one-member etcd starts with the same
// name and URLs (a machine rebuilt with the member's address before the
// member was removed; a wrong snapshot restore). It answers at the URL the
// real member advertises, with an empty store and a member list of its
// own. Then the impostor goes and the real member comes back.
//
// Judged here, beside the samples: the VIP stays on holder the whole time,
// every running vigil refuses the impostor (its /status names it), and
// after the impostor is gone every vigil still follows the real cluster.
//
// vigil promises no VIP move only while etcd answers within storePromise:
// a store watch writes through the real members meanwhile, as the holder's
// renewals do, and the VIP leaving holder is excused when such a write
// just before leaves room for that promise to have been broken
// (storeDoubt, slowStoreBefore): then storeSlow is that write's time, and
// any one holder will do at the end.
func (l *Lab) impostorEtcd(ctx context.Context, n *Node, holder string, hold time.Duration) (storeSlow time.Duration, err error) {
	if l.st.Settings.Impl != ImplVigil {
		return 0, errors.New("impostor-etcd needs etcd and vigil")
	}
	ids, err := l.clusterIDs(ctx)
	if err != nil {
		return 0, fmt.Errorf("before the impostor: %w", err)
	}
	stw, stopStore, err := l.startLabStoreWatch(n) // through the real members, not n's address
	if err != nil {
		return 0, err
	}
	defer stopStore()
	// left is when the VIP was first seen off holder, and where it was.
	var left time.Time
	var leftTo []string
	offHolder := func(h []string) bool {
		if slices.Equal(h, []string{holder}) {
			return false
		}
		if left.IsZero() {
			left, leftTo = time.Now(), h
		}
		return true
	}
	// excused judges the VIP having left holder, once the store watch has
	// recorded every write under way then.
	excused := func(what string) (time.Duration, error) {
		if slowest, ok := slowStoreBefore(stw.close(), left, checkEvery); ok {
			return slowest, nil
		}
		return 0, fmt.Errorf("the VIP is on %v %s; it was on %s, and etcd answered the lab's writes within %v then", leftTo, what, holder, storeDoubt)
	}
	if err := l.signal(ctx, n, roleEtcd, syscall.SIGKILL, 5*time.Second); err != nil {
		return 0, err
	}
	dir := l.nodeDir(n) + "/etcd-impostor"
	_ = os.RemoveAll(dir)
	restore := func() error {
		if pid := n.PIDs[roleEtcd]; pid != 0 && alive(pid) {
			_ = l.signal(context.WithoutCancel(ctx), n, roleEtcd, syscall.SIGKILL, 5*time.Second)
		}
		_ = os.RemoveAll(dir)
		if err := l.startEtcd(n); err != nil {
			return err
		}
		return l.waitEtcdHealthy(context.WithoutCancel(ctx), recoverTimeout)
	}
	defer func() {
		if rerr := restore(); rerr != nil {
			err = errors.Join(err, fmt.Errorf("put the real member back on %s: %w", n.Name, rerr))
		}
	}()
	if err := l.start(n, roleEtcd, l.selfBin, "etcd",
		"--name", n.Name,
		"--data-dir", dir,
		"--listen-client-urls", fmt.Sprintf("http://%s:%d,http://127.0.0.1:2379", n.IP, etcdDirectPort),
		"--advertise-client-urls", fmt.Sprintf("http://%s:%d", n.IP, etcdFrontPort),
		"--listen-peer-urls", fmt.Sprintf("http://%s:2380", n.IP),
		"--initial-advertise-peer-urls", fmt.Sprintf("http://%s:2380", n.IP),
		"--initial-cluster", fmt.Sprintf("%s=http://%s:2380", n.Name, n.IP),
		"--initial-cluster-state", "new",
		"--initial-cluster-token", "vigil-lab",
		"--log-level", "error",
	); err != nil {
		return 0, fmt.Errorf("start the impostor on %s: %w", n.Name, err)
	}
	// Every vigil must notice it and refuse it (a vigil learns of it on
	// its next operation through that URL: within seconds).
	var live []string
	for _, m := range l.st.Nodes {
		if pid := m.PIDs[roleVigil]; pid != 0 && alive(pid) {
			live = append(live, m.Name)
		}
	}
	refusedBy := map[string]bool{}
	deadline := time.Now().Add(hold)
	for time.Now().Before(deadline) || len(refusedBy) < len(live) {
		if time.Since(deadline) > 10*time.Second {
			break
		}
		for _, name := range live {
			rep, err := l.vigilStatus(ctx, name)
			if err != nil || rep.Etcd == nil {
				continue
			}
			if rep.Etcd.ClusterID != ids[name] {
				return 0, fmt.Errorf("vigil on %s follows etcd cluster %s, was %s: it took the impostor's", name, rep.Etcd.ClusterID, ids[name])
			}
			for _, f := range rep.Etcd.Foreign {
				if f.Endpoint == fmt.Sprintf("http://%s:%d", n.IP, etcdFrontPort) {
					refusedBy[name] = true
				}
			}
		}
		if h, err := l.vipHolders(); err == nil && storeSlow == 0 && offHolder(h) {
			if storeSlow, err = excused(fmt.Sprintf("with the impostor at %s's address", n.Name)); err != nil {
				return 0, err
			}
		}
		clock.Sleep(ctx, checkEvery)
	}
	for _, name := range live {
		if !refusedBy[name] {
			return 0, fmt.Errorf("vigil on %s does not report the impostor at %s's address", name, n.Name)
		}
	}
	// The impostor goes; for 2 s the real member stays away too: the
	// vigils must still follow the two real members, and nothing move.
	if err := l.signal(ctx, n, roleEtcd, syscall.SIGKILL, 5*time.Second); err != nil {
		return 0, err
	}
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); clock.Sleep(ctx, checkEvery) {
		if h, err := l.vipHolders(); err == nil && storeSlow == 0 && offHolder(h) {
			if storeSlow, err = excused(fmt.Sprintf("after the impostor at %s's address went away", n.Name)); err != nil {
				return 0, err
			}
		}
	}
	return storeSlow, nil
}

// impostorDrill runs impostorEtcd on a non-holder for 5 s, with the VIP
// probed every 10 ms and every node's addresses sampled: the outage is the
// longest gap in the answers, and any sample with two holders is a split
// brain. The VIP must stay where it was.
func (l *Lab) impostorDrill(ctx context.Context, r *Result) error {
	if l.st.Settings.Kubeadm {
		return fmt.Errorf("drill %s needs the lab's own etcd processes", DrillImpostorEtcd)
	}
	holder, err := l.waitStable(ctx, recoverTimeout)
	if err != nil {
		return fmt.Errorf("lab not stable before the drill: %w", err)
	}
	target, err := l.nonHolder(DrillImpostorEtcd, holder)
	if err != nil {
		return err
	}
	d, err := l.newDrillRun()
	if err != nil {
		return err
	}
	defer d.w.close()
	r.Target, r.Before = target.Name, holder
	pr, err := startProber(probeInterval, l.st.Settings.vips()[0].Addr())
	if err != nil {
		return err
	}
	defer pr.close()
	mon := startMonitor(d.w, d.live, probeInterval)
	defer mon.close()
	if !clock.Sleep(ctx, 300*time.Millisecond) { // baseline
		return ctx.Err()
	}
	fault := time.Now()
	storeSlow, ferr := l.impostorEtcd(ctx, target, holder, 5*time.Second)
	r.StoreSlowMillis = millis(storeSlow)
	end := time.Now()
	r.OutageMillis = millis(longestGap(pr.snapshot(), fault, end))
	final, herr := r.judgeHolders(mon.close(), d.w, d.live())
	if herr != nil {
		return errors.Join(ferr, herr)
	}
	if len(final) == 1 {
		r.After = final[0]
	}
	if ferr == nil && storeSlow == 0 && !slices.Equal(final, []string{holder}) {
		ferr = fmt.Errorf("after the impostor the VIP is on %v, was on %s", final, holder)
	}
	return ferr
}

// clusterIDs is the etcd cluster ID each running vigil follows (by node).
func (l *Lab) clusterIDs(ctx context.Context) (map[string]string, error) {
	out := map[string]string{}
	for _, m := range l.st.Nodes {
		if pid := m.PIDs[roleVigil]; pid == 0 || !alive(pid) {
			continue
		}
		rep, err := l.vigilStatus(ctx, m.Name)
		if err != nil {
			return nil, err
		}
		if rep.Etcd == nil || rep.Etcd.ClusterID == "" {
			return nil, fmt.Errorf("vigil on %s names no etcd cluster", m.Name)
		}
		out[m.Name] = rep.Etcd.ClusterID
	}
	return out, nil
}
