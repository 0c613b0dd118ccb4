package lab

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/vigil-ha/vigil/internal/clock"
)

// DrillRecover is the disaster the runbook covers: two of three
// control-plane nodes are lost for good, etcd has no quorum and the VIP
// goes dark. The drill writes keys, waits until the node that will
// survive has applied them, powers off the other two (the VIP holder among
// them), runs `vigil members recover` on the survivor with its etcd
// stopped, starts that etcd again, and checks: the VIP answers again
// within recoverBound of the command, every key is back, and two new
// members join as kubeadm join adds them, leaving three healthy voters and
// one VIP holder.
const DrillRecover = "recover"

const (
	// recoverKeys is how many keys the drill writes before the loss.
	recoverKeys = 200
	// recoverBound is the most the VIP may take to answer again, from the
	// start of vigil members recover (issue 33's goal for the netns lab).
	recoverBound = 60 * time.Second
	// recoverPrefix is where the drill's keys live.
	recoverPrefix = "/vigil-lab/recover/"
)

// RecoveryResult is what the recover drill measured.
type RecoveryResult struct {
	Survivor string   `json:"survivor"`
	Lost     []string `json:"lost"`
	// Keys were written (and applied by the survivor) before the loss;
	// KeysBack were read back, with their values, after the recovery.
	Keys     int `json:"keys"`
	KeysBack int `json:"keysBack"`
	// DarkMillis: from the power-off to the start of the recovery, during
	// which no node may answer on the VIP.
	DarkMillis float64 `json:"darkMillis"`
	// BackMillis: from the start of vigil members recover to the VIP
	// answering steadily again (the survivor's etcd restart and vigil's
	// election included), with the bound it must meet.
	BackMillis  float64 `json:"backMillis"`
	BoundMillis float64 `json:"boundMillis"`
	// Output is what vigil members recover printed.
	Output []string `json:"output,omitempty"`
}

func (x *RecoveryResult) String() string {
	return fmt.Sprintf("recovery on %s after losing %s: %d/%d keys back, VIP answering %.1fs after recover (bound %.0fs)",
		x.Survivor, strings.Join(x.Lost, ","), x.KeysBack, x.Keys, x.BackMillis/1000, x.BoundMillis/1000)
}

func (l *Lab) recoverDrill(ctx context.Context, r *Result) error {
	holder, err := l.settledVigilLab(ctx, DrillRecover)
	if err != nil {
		return err
	}
	if len(l.st.Nodes) != 3 {
		return fmt.Errorf("drill %s starts from 3 nodes; the lab has %d", DrillRecover, len(l.st.Nodes))
	}
	// The survivor does not hold the VIP: the holder is lost with the
	// quorum, and the VIP must come back on the node that recovers.
	survivor := l.otherNode(holder)
	var lost []*Node
	for _, n := range l.st.Nodes {
		if n != survivor {
			lost = append(lost, n)
		}
	}
	x := &RecoveryResult{Survivor: survivor.Name, BoundMillis: millis(recoverBound)}
	for _, n := range lost {
		x.Lost = append(x.Lost, n.Name)
	}
	r.Recovery, r.Target, r.Before = x, strings.Join(x.Lost, ","), holder

	// 1. Keys, applied by the survivor: what recover must keep.
	if err := l.writeRecoverKeys(ctx, survivor); err != nil {
		return err
	}
	x.Keys = recoverKeys

	w, err := newVIPWatch(l.st.Nodes)
	if err != nil {
		return err
	}
	d := &drillRun{l: l, dead: map[string]bool{}, w: w}
	defer func() { d.w.close() }()
	pr, err := startProber(probeInterval, l.st.Settings.vipAddr())
	if err != nil {
		return err
	}
	defer pr.close()
	mon := startMonitor(w, d.live, probeInterval)
	defer func() { mon.close() }()
	if !clock.Sleep(ctx, 300*time.Millisecond) {
		return ctx.Err()
	}
	start := time.Now()
	phase := r.phaser(start)

	// 2. Two machines lose power for good.
	for _, n := range lost {
		if err := l.setNodePorts(ctx, n, false); err != nil {
			return err
		}
		d.setDead(n.Name, true)
		if err := l.killNode(ctx, n); err != nil {
			return err
		}
	}
	l.editNodes(dropNodes(func(m *Node) bool { return slices.Contains(lost, m) }))
	for _, n := range lost {
		l.st.Retired = append(l.st.Retired, n.Index)
	}
	if err := l.save(); err != nil {
		return err
	}
	phase("power off "+strings.Join(x.Lost, ", "), "")

	// 3. The VIP goes dark: the survivor's vigil cannot win an election
	// on an etcd without quorum. The drill waits until nothing has
	// answered for two lease durations' worth of probes.
	if err := waitDark(ctx, pr, 3*time.Second, recoverTimeout); err != nil {
		return err
	}
	phase("quorum lost, VIP dark", "")

	// 4. The operator looks first (a dry run, etcd still running), then
	// stops the survivor's etcd and runs recover.
	recoverArgs := []string{"recover", "--data-dir", l.nodeDir(survivor) + "/etcd", "--name", survivor.Name,
		"--peer-url", fmt.Sprintf("http://%s:2380", survivor.IP)}
	dry, err := l.vigilMembers(ctx, survivor.Name, append(recoverArgs, "--dry-run")...)
	if err != nil || !strings.Contains(dry, "dry run: nothing changed") {
		return fmt.Errorf("vigil members recover --dry-run on %s, etcd running: %v\n%s", survivor.Name, err, dry)
	}
	phase("vigil members recover --dry-run", lastLine(dry))
	if err := l.signal(ctx, survivor, roleEtcd, syscall.SIGTERM, 10*time.Second); err != nil {
		if kerr := l.signal(ctx, survivor, roleEtcd, syscall.SIGKILL, 5*time.Second); kerr != nil {
			return fmt.Errorf("stop etcd on %s: %w", survivor.Name, errors.Join(err, kerr))
		}
	}
	phase("stop etcd on "+survivor.Name, "")
	recoverStart := time.Now()
	x.DarkMillis = millis(recoverStart.Sub(start))
	out, err := l.vigilMembers(ctx, survivor.Name, recoverArgs...)
	x.Output = strings.Split(strings.TrimSpace(out), "\n")
	if err != nil {
		return fmt.Errorf("vigil members recover on %s: %w\n%s", survivor.Name, err, out)
	}
	phase("vigil members recover", lastLine(out))
	if err := l.startEtcdWith(survivor, fmt.Sprintf("%s=http://%s:2380", survivor.Name, survivor.IP), "existing"); err != nil {
		return err
	}
	back, err := waitAnsweringWithin(ctx, pr, "", recoverStart, recoverBound)
	if err != nil {
		return fmt.Errorf("after recover: %w", err)
	}
	x.BackMillis = millis(back.Sub(recoverStart))
	r.After = nodeAt(pr.snapshot(), back)
	phase("start etcd, VIP answering", "on "+r.After)
	if r.After != survivor.Name {
		return fmt.Errorf("after recover the VIP answered on %s, not on the survivor %s", r.After, survivor.Name)
	}

	// 5. Every key is back.
	if x.KeysBack, err = l.readRecoverKeys(ctx); err != nil {
		return err
	}
	if x.KeysBack != x.Keys {
		return fmt.Errorf("after recover %d of the %d keys the survivor had applied are back", x.KeysBack, x.Keys)
	}
	if err := l.waitEtcdHealthy(ctx, recoverTimeout); err != nil {
		return fmt.Errorf("after recover: %w", err)
	}
	phase(fmt.Sprintf("%d keys read back", x.KeysBack), "")

	// 6. Two new members join, as kubeadm join adds them (as a learner,
	// promoted once caught up: a voter added to a one-member cluster would
	// stop etcd until it ran); the VIP stays.
	joinStart := time.Now()
	var doubles []doubleHold
	for range 2 {
		n, err := l.joinNodeAsLearner(ctx, survivor.Name)
		if err != nil {
			return err
		}
		// Watch the new node too.
		var seen []doubleHold
		mon, seen, err = d.watchJoined(mon)
		doubles = append(doubles, seen...)
		if err != nil {
			return err
		}
		phase(fmt.Sprintf("join %s (%d voters)", n.Name, len(l.st.Nodes)), "")
	}
	r.Phases = append(r.Phases, Phase{Name: "total", Millis: millis(time.Since(start))})
	for _, n := range lost {
		if err := l.retireNode(ctx, n); err != nil {
			return err
		}
	}
	if !clock.Sleep(ctx, time.Second) {
		return ctx.Err()
	}
	replies := pr.close()
	// The outage that counts is the one after the recovery: the dark
	// period before it is the disaster itself, and is DarkMillis.
	// (longestGap counts from the last answer before its start: back's own.)
	r.OutageMillis = millis(longestGap(replies, back.Add(time.Nanosecond), time.Now()))
	r.SplitBrain, r.SplitDetail = judgeSplit(append(doubles, mon.close()...), replies, start)
	if err := l.waitEtcdHealthy(ctx, recoverTimeout); err != nil {
		return fmt.Errorf("after the joins: %w", err)
	}
	if got := replies[len(replies)-1].node; got != survivor.Name {
		return fmt.Errorf("the VIP moved from %s to %s while members joined", survivor.Name, got)
	}
	final, err := d.w.holders(l.st.Nodes)
	if err != nil {
		return err
	}
	r.HoldersAfterHeal = final
	if len(final) != 1 {
		return fmt.Errorf("after the recovery and the joins the VIP is on %v", final)
	}
	l.log.Info("recovered", "drill", DrillRecover, "joins", time.Since(joinStart).Round(time.Millisecond))
	return nil
}

// joinNodeAsLearner adds a control-plane node as kubeadm join does since
// Kubernetes 1.29 (etcd learner mode): the member is added as a learner,
// its etcd starts, and it is promoted once it has caught up; then its API
// server and vigil start, and holder balances over its API server.
func (l *Lab) joinNodeAsLearner(ctx context.Context, holder string) (*Node, error) {
	n, err := l.addNode(ctx)
	if err != nil {
		return nil, err
	}
	cli, err := etcdClient(l.etcdEndpoints())
	if err != nil {
		return nil, err
	}
	defer cli.Close()
	peer := fmt.Sprintf("http://%s:2380", n.IP)
	resp, err := addMember(ctx, cli, peer, true, 15*time.Second, 500*time.Millisecond)
	if err != nil {
		return nil, fmt.Errorf("lab: add %s as a learner: %w", n.Name, err)
	}
	ic, _ := initialCluster(resp.Members, n.Name, peer)
	if err := l.startEtcdWith(n, ic, "existing"); err != nil {
		return nil, err
	}
	// etcd refuses the promotion until the learner has caught up.
	deadline := time.Now().Add(recoverTimeout)
	for {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err = cli.MemberPromote(pctx, resp.Member.ID)
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("lab: promote %s: %w", n.Name, err)
		}
		if !clock.Sleep(ctx, 200*time.Millisecond) {
			return nil, ctx.Err()
		}
	}
	if err := l.waitEtcdHealthy(ctx, recoverTimeout); err != nil {
		return nil, fmt.Errorf("after %s joined: %w", n.Name, err)
	}
	if err := l.startServices(n); err != nil {
		return nil, err
	}
	return n, l.waitBackendsUp(ctx, holder, len(l.st.Nodes), recoverTimeout)
}

// writeRecoverKeys writes the drill's keys through the cluster, then waits
// until survivor has applied the last of them: recover keeps what the
// member had, and a member that lagged would lose what it never received.
func (l *Lab) writeRecoverKeys(ctx context.Context, survivor *Node) error {
	cli, err := etcdClient(l.etcdEndpoints())
	if err != nil {
		return err
	}
	defer cli.Close()
	own, err := etcdClient([]string{fmt.Sprintf("http://%s:%d", survivor.IP, etcdFrontPort)})
	if err != nil {
		return err
	}
	defer own.Close()
	if err := writeKeysApplied(ctx, cli, own); err != nil {
		return fmt.Errorf("lab: %s: %w", survivor.Name, err)
	}
	return nil
}

// readRecoverKeys counts the drill's keys that are back with their values.
func (l *Lab) readRecoverKeys(ctx context.Context) (int, error) {
	cli, err := etcdClient(l.etcdEndpoints())
	if err != nil {
		return 0, err
	}
	defer cli.Close()
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	resp, err := cli.Get(cctx, recoverPrefix, clientv3.WithPrefix())
	if err != nil {
		return 0, fmt.Errorf("lab: read the keys back: %w", err)
	}
	return countRecoverKeys(resp), nil
}

func recoverKey(i int) string   { return fmt.Sprintf("%s%04d", recoverPrefix, i) }
func recoverValue(i int) string { return fmt.Sprintf("value %d, written before the loss", i) }

// waitDark waits until no node has answered on the VIP for quiet.
func waitDark(ctx context.Context, p *prober, quiet, d time.Duration) error {
	since := time.Now()
	for time.Since(since) < d {
		if !clock.Sleep(ctx, 100*time.Millisecond) {
			return ctx.Err()
		}
		rs := p.snapshot()
		last := since
		if len(rs) > 0 && rs[len(rs)-1].at.After(last) {
			last = rs[len(rs)-1].at
		}
		if time.Since(last) >= quiet {
			return nil
		}
	}
	return fmt.Errorf("the VIP still answered %v after the quorum was lost", d)
}
