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

// Drills of the kubeadm lab.
const (
	// DrillKubeadmReplace is the seed's story: a control-plane node (the
	// VIP holder) is powered off for good and a new node runs kubeadm join
	// --control-plane in its place. With vigil pruning (vigil-lab up
	// --kubeadm --prune-after D) the join must pass; without, it must fail
	// on the dead etcd member, as the seed describes, and pass once the
	// member is removed by hand.
	DrillKubeadmReplace = "kubeadm-replace"
	// DrillKubeadmVigilKilled SIGKILLs vigil's container process on the
	// holder: the guard, a container of its own, must remove the VIP at
	// once, kubelet restarts vigil, and there are never two holders.
	DrillKubeadmVigilKilled = "kubeadm-vigil-killed"
	// DrillKubeadmVigilOOM has the kernel's OOM killer kill vigil's
	// container on the holder: its memory cgroup's limit is lowered below
	// what vigil uses. The VIP must leave within a lease + 1 s, kubelet
	// must report the container OOMKilled, and there are never two
	// holders.
	DrillKubeadmVigilOOM = "kubeadm-vigil-oom"
	// DrillKubeadmVigilRestart changes the holder's static pod manifest
	// (an annotation), as an upgrade of vigil does: kubelet stops the pod
	// (SIGTERM, vigil hands the VIP over) and starts the new one.
	DrillKubeadmVigilRestart = "kubeadm-vigil-restart"
	// DrillKubeadmCertsRenew runs `kubeadm certs renew all` on every
	// control-plane node, then restarts etcd and kube-apiserver there, one
	// node at a time. vigil must keep working without a restart: the same
	// processes, one holder throughout, every backend up again, and new
	// connections to etcd made with the renewed client certificate.
	DrillKubeadmCertsRenew = "kubeadm-certs-renew"
	// DrillKubeadmLease moves the running cluster from the etcd election to
	// the Lease election, as docs/kubeadm.md tells users: vigil manifest
	// rbac, a kubeconfig per node for its own API server (kubeadm
	// kubeconfig user), then every node's manifest rewritten with
	// --election kubernetes, the VIP holder's last. The VIP must move once,
	// to a node that holds the Lease, with never two holders, and the etcd
	// election must be retired. It is one-way: a lab that has moved is
	// refused, and the other drills run on in it with the Lease election.
	DrillKubeadmLease = "kubeadm-lease"
	// DrillKubeadmRecover is the runbook's disaster: keys are written,
	// two of the three control-plane nodes (the VIP holder among them)
	// are powered off for good, and on the third `vigil members recover
	// --kubeadm` stops etcd's static pod through the kubelet, makes the
	// member a one-member cluster and starts it again. The VIP must
	// answer the Kubernetes API (a Node list) within 120 s of the
	// command, every key must be back, and two new machines must join
	// with kubeadm join --control-plane.
	DrillKubeadmRecover = "kubeadm-recover"
)

// KubeadmDrills are the drills of a kubeadm lab. DrillKubeadmLease comes
// last: the drills before it run with the etcd election.
var KubeadmDrills = []string{DrillKubeadmVigilKilled, DrillKubeadmVigilOOM, DrillKubeadmVigilRestart, DrillKubeadmCertsRenew, DrillKubeadmReplace, DrillKubeadmRecover, DrillKubeadmLease}

// kubeadmRequestTimeout bounds each request through the VIP in the kubeadm
// drills. The lab runs four machines' control planes on two cores. In one
// CI run (2026-12-02, kubeadm-replace) a single GET /version went
// unanswered for 2 s, the old limit, while a new machine was being made
// (containerd importing six images), with no failover under way and the
// VIP holder alive. A request that vigil sends nowhere, or to a dead
// server, still fails at this limit.
const kubeadmRequestTimeout = 5 * time.Second

// KubeadmResult adds what the kubeadm drills measure to Result.
type KubeadmResult struct {
	Pruning bool   `json:"pruning"`
	Victim  string `json:"victim"`
	NewNode string `json:"newNode,omitempty"`
	// JoinFailed and JoinError: the replacement's kubeadm join.
	JoinFailed bool   `json:"joinFailed"`
	JoinError  string `json:"joinError,omitempty"`
	// EtcdUnhealthyAtJoin: kubeadm's check-etcd found a member it could
	// not reach (it then retries for its etcd API timeout, 2 minutes by
	// default, and since kubeadm 1.3x goes on when a quorum answers).
	EtcdUnhealthyAtJoin bool `json:"etcdUnhealthyAtJoin"`
	// DeadMemberLeft: after the join, etcd still lists the dead member, so
	// the cluster has 4 voters of which 3 live, and tolerates no further
	// failure.
	DeadMemberLeft   bool `json:"deadMemberLeft"`
	MembersAfterJoin int  `json:"membersAfterJoin,omitempty"`
	// Preflights are vigil members preflight's answers on the way: no
	// after the power-off; before the join, yes once pruned.
	Preflights []Preflight `json:"preflights,omitempty"`
	// Requests through the VIP during the drill (GET /version, a new
	// connection each), and those that failed outside the failover window
	// (from the fault until the VIP answered again, plus a second).
	Requests      int     `json:"requests"`
	Failed        int     `json:"failed"`
	FailedOutside int     `json:"failedOutside"`
	FailoverMs    float64 `json:"failoverMillis"`
	// VIPGoneMs is how long after the fault the VIP left the holder: the
	// kill (kubeadm-vigil-killed, -oom), or the change of its manifest
	// (kubeadm-vigil-restart, kubeadm-lease).
	VIPGoneMs float64 `json:"vipGoneMillis,omitempty"`
	// Terminated is, for kubeadm-vigil-oom, the reason kubelet gives for
	// the container's end.
	Terminated string `json:"terminated,omitempty"`
	// OutsideErrors are the first requests that failed outside the
	// failover window: when, in which phase, and why.
	OutsideErrors []string `json:"outsideErrors,omitempty"`
	// LateAnswers are requests outside the failover window that vigil
	// delivered to a live API server (TLS handshake with it completed, the
	// request written) and that the server did not answer within the
	// request timeout. Not counted in FailedOutside; LateAnswerErrors are
	// the first of them.
	LateAnswers      int      `json:"lateAnswers,omitempty"`
	LateAnswerErrors []string `json:"lateAnswerErrors,omitempty"`
	// NoServer are requests outside the failover window that failed while
	// no API server answered the lab's direct requests (not through the
	// VIP) within 1 s around their start: the control plane, not the path
	// to it, was down (serverwatch.go). Not counted in FailedOutside;
	// NoServerErrors are the first of them.
	NoServer       int      `json:"noServer,omitempty"`
	NoServerErrors []string `json:"noServerErrors,omitempty"`
	// SlowStore are requests outside the failover window that failed
	// while the VIP was briefly gone (its holder stepped down), one of the
	// lab's own writes through etcd having taken over storeDoubt just
	// before: vigil promises no move only while etcd answers within 400
	// ms, and the store watch sees a stall up to 100 ms short
	// (serverwatch.go). Not counted in FailedOutside; SlowStoreErrors are
	// the first of them.
	SlowStore       int      `json:"slowStore,omitempty"`
	SlowStoreErrors []string `json:"slowStoreErrors,omitempty"`
	// StoreSlowestMs is the slowest of the lab's writes through etcd that
	// overlapped the failover window (a failed one counts as its 2 s
	// bound): above 400 ms, vigil's timing promises do not hold.
	StoreSlowestMs float64 `json:"storeSlowestMillis,omitempty"`
	// LeaseHolder is, for kubeadm-lease, the holder of the Lease after the
	// move (the node with the VIP), and Order the order the nodes moved in.
	LeaseHolder string   `json:"leaseHolder,omitempty"`
	Order       []string `json:"order,omitempty"`
	// Recovery is, for kubeadm-recover, what the recovery measured
	// (BackMillis: from vigil members recover to a Node list through the
	// VIP), and NewNodes the machines that joined after it.
	Recovery *RecoveryResult `json:"recovery,omitempty"`
	NewNodes []string        `json:"newNodes,omitempty"`

	movedAt time.Time // when another node was seen holding the VIP
	// faultAt, when set, is when the fault that moved the VIP began, if not
	// at the drill's start (kubeadm-lease: the holder's manifest rewritten).
	faultAt time.Time
}

func (k *KubeadmResult) String() string {
	s := fmt.Sprintf("victim %s", k.Victim)
	if k.VIPGoneMs > 0 {
		s += fmt.Sprintf(", VIP left it %.0fms after the fault", k.VIPGoneMs)
	}
	if k.Terminated != "" {
		s += ", kubelet: " + k.Terminated
	}
	if k.LeaseHolder != "" {
		s += fmt.Sprintf(", moved to the Lease election in the order %s; the Lease and the VIP are on %s", strings.Join(k.Order, ", "), k.LeaseHolder)
	}
	if k.NewNode != "" {
		s += fmt.Sprintf(", replacement %s (pruning %s): kubeadm join %s", k.NewNode, onOff(k.Pruning), map[bool]string{true: "FAILED", false: "passed"}[k.JoinFailed])
		if k.JoinError != "" {
			s += fmt.Sprintf(" [%s]", k.JoinError)
		}
		if !k.JoinFailed {
			s += fmt.Sprintf("; check-etcd found a dead member: %s; dead member left in etcd: %s (%d members)", yesNo(k.EtcdUnhealthyAtJoin), yesNo(k.DeadMemberLeft), k.MembersAfterJoin)
		}
	}
	s += fmt.Sprintf("; requests through the VIP %d, failed %d (%d outside the %.0fms failover window); slowest write through etcd in the window %.0fms", k.Requests, k.Failed, k.FailedOutside, k.FailoverMs, k.StoreSlowestMs)
	for _, e := range k.OutsideErrors {
		s += "\n      outside: " + e
	}
	for _, c := range k.excused() {
		if c.n > 0 {
			s += fmt.Sprintf("\n      %s (not counted as failed): %d", c.what, c.n)
			for _, e := range c.errs {
				s += "\n      " + c.tag + ": " + e
			}
		}
	}
	for _, p := range k.Preflights {
		s += fmt.Sprintf("\n      vigil members preflight %s: %s", p.When, preflightLine(p))
	}
	if k.Recovery != nil {
		s += fmt.Sprintf("\n      %s; then kubeadm join of %s: %d members", k.Recovery, strings.Join(k.NewNodes, ", "), k.MembersAfterJoin)
	}
	return s
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

// kubeadmDrill runs one of KubeadmDrills.
func (l *Lab) kubeadmDrill(ctx context.Context, kind string, r *Result) error {
	if !l.st.Settings.Kubeadm {
		return fmt.Errorf("drill %s needs the kubeadm lab (vigil-lab up --kubeadm)", kind)
	}
	if len(l.st.Nodes) < 3 {
		return fmt.Errorf("drill %s needs 3 control-plane nodes, the lab has %d", kind, len(l.st.Nodes))
	}
	holder, err := l.waitStable(ctx, recoverTimeout)
	if err != nil {
		return fmt.Errorf("lab not stable before the drill: %w", err)
	}
	// A whole cluster to start from, whatever the drill before did.
	if err := l.waitEtcdMembersHealthy(ctx, 2*time.Minute); err != nil {
		return fmt.Errorf("lab not healthy before the drill: %w", err)
	}
	if err := l.waitBackendsUp(ctx, holder, len(l.st.Nodes), 2*time.Minute); err != nil {
		return fmt.Errorf("lab not healthy before the drill: %w", err)
	}
	// Every node a candidate: a vigil that kubelet restarted in the
	// drill before waits out its dead predecessor's claim on the node
	// name (a few seconds) before it campaigns. Two such nodes, and a
	// handover would find nobody to take the VIP.
	if err := l.waitCandidates(ctx, time.Minute); err != nil {
		return fmt.Errorf("lab not ready before the drill: %w", err)
	}
	victim, err := l.node(holder)
	if err != nil {
		return err
	}
	r.Target = victim.Name
	k := &KubeadmResult{Victim: victim.Name, Pruning: l.st.Settings.PruneAfter > 0}
	r.Kubeadm = k
	d, err := l.newDrillRun()
	if err != nil {
		return err
	}
	defer d.w.close()
	d.target = victim
	pr, err := l.startHTTPSProber(APIServerPort, kubeadmRequestTimeout)
	if err != nil {
		return err
	}
	defer pr.close()
	udp, err := startProber(probeInterval, l.st.Settings.vipAddr())
	if err != nil {
		return err
	}
	defer udp.close()
	sw, err := l.startServerWatch(l.watchedServers(2), APIServerPort, kubeadmRequestTimeout)
	if err != nil {
		return err
	}
	defer sw.close()
	ec, err := l.kubeadmEtcdClient()
	if err != nil {
		return err
	}
	defer ec.Close()
	stw := startStoreWatch(func(ctx context.Context) error {
		_, err := ec.Put(ctx, "/vigil-lab/store-watch", time.Now().UTC().Format(time.RFC3339Nano))
		return err
	})
	defer stw.close()
	// The monitor samples the nodes there were at the start; a replacement
	// is checked once it is up, below.
	watched := slices.Clone(l.st.Nodes)
	live := func() []*Node {
		return slices.DeleteFunc(slices.Clone(watched), func(n *Node) bool { return !slices.Contains(d.live(), n) })
	}
	mon := startMonitor(d.w, live, probeInterval)
	defer mon.close()
	if !clock.Sleep(ctx, time.Second) { // a baseline of good requests
		return ctx.Err()
	}
	phaseStart := time.Now()
	phase := r.phaser(phaseStart)
	fault := phaseStart
	switch kind {
	case DrillKubeadmVigilKilled, DrillKubeadmVigilOOM:
		err = l.killVigilContainer(ctx, victim, kind == DrillKubeadmVigilOOM, d.w, k, phase)
	case DrillKubeadmVigilRestart:
		err = l.restartVigilPod(ctx, victim, d.w, k, phase)
	case DrillKubeadmCertsRenew:
		err = l.renewCerts(ctx, phase)
	case DrillKubeadmReplace:
		d.setDead(victim.Name, true)
		err = l.replaceMachine(ctx, victim, d.w, k, phase)
	case DrillKubeadmLease:
		err = l.moveToLease(ctx, victim, d.w, k, phase)
	case DrillKubeadmRecover:
		err = l.recoverMachines(ctx, victim, d, k, phase)
	}
	if !k.faultAt.IsZero() {
		fault = k.faultAt
	}
	replies := udp.close()
	r.Before = lastBefore(replies, fault)
	if rec, werr := waitAnsweringIn(replies, victim.Name, fault); werr == nil {
		r.After = nodeAt(replies, rec)
		r.OutageMillis = millis(longestGap(replies, fault, rec))
	}
	// The failover window ends with the first request that succeeded
	// after another node took the VIP.
	moved := k.movedAt
	if moved.IsZero() {
		moved = fault
	}
	recovered := moved
	reqs := pr.close()
	for _, q := range reqs {
		k.Requests++
		if q.err == "" {
			if recovered == moved && q.start.After(moved) {
				recovered = q.end
			}
			continue
		}
		k.Failed++
	}
	k.FailoverMs = millis(recovered.Sub(fault))
	direct := sw.close()
	writes := stw.close()
	dark := darkSpans(replies)
	for _, p := range writes {
		if p.start.Before(recovered) && p.start.Add(p.took).After(fault) {
			k.StoreSlowestMs = max(k.StoreSlowestMs, millis(p.took))
		}
	}
	for _, q := range reqs {
		if q.err != "" && (q.end.Before(fault) || q.start.After(recovered.Add(time.Second))) {
			// When, from the fault, and in which phase.
			at := fmt.Sprintf("+%v (%s)", q.start.Sub(fault).Round(time.Millisecond), r.phaseAt(phaseStart, q.start))
			if q.reached != "" {
				// vigil delivered it: the TLS handshake with a live API
				// server completed through the VIP (a dead or frozen
				// server cannot complete one) and the request was
				// written; the server then did not answer in time. On
				// two cores running four control planes this happens
				// (a CI run's kubeadm join, a Lease move under load
				// here). Reported, but not vigil's failure.
				k.LateAnswers++
				if len(k.LateAnswerErrors) < 5 {
					k.LateAnswerErrors = append(k.LateAnswerErrors, at+": "+q.err)
				}
				continue
			}
			if d, slowest, ok := slowStoreDark(dark, writes, q.start, q.end); ok {
				k.SlowStore++
				if len(k.SlowStoreErrors) < 5 {
					k.SlowStoreErrors = append(k.SlowStoreErrors, fmt.Sprintf("%s: %s; the VIP was silent %v from +%v, a write through etcd having taken %v",
						at, q.err, d.to.Sub(d.from).Round(time.Millisecond), d.from.Sub(fault).Round(time.Millisecond), slowest.Round(time.Millisecond)))
				}
				continue
			}
			prompt := promptServers(direct, q.start)
			if len(prompt) == 0 {
				// No server answered anyone promptly: no load balancer
				// could have delivered this request.
				k.NoServer++
				if len(k.NoServerErrors) < 5 {
					k.NoServerErrors = append(k.NoServerErrors, at+": "+q.err)
				}
				continue
			}
			k.FailedOutside++
			if len(k.OutsideErrors) < 5 {
				k.OutsideErrors = append(k.OutsideErrors, fmt.Sprintf("%s: %s; answering directly then: %s", at, q.err, serverNames(prompt, pr.servers)))
			}
		}
	}
	doubles := mon.close()
	if err != nil {
		return err
	}
	// Every node now, the replacement included.
	wNow, err := newVIPWatch(l.st.Nodes)
	if err != nil {
		return err
	}
	defer wNow.close()
	final, err := r.judgeHolders(doubles, wNow, l.st.Nodes)
	if err != nil {
		return err
	}
	if len(final) != 1 {
		return fmt.Errorf("after the drill the VIP is on %v", final)
	}
	// Restarting API servers resets the requests in flight on them: the
	// renewal drill reports failures but is judged on vigil alone.
	if k.FailedOutside > 0 && kind != DrillKubeadmCertsRenew {
		return fmt.Errorf("%d requests through the VIP failed outside the failover window", k.FailedOutside)
	}
	// A slow server costs one late request per timeout (the client sends
	// one at a time): more than 1% late is no longer load, whoever is slow.
	// Likewise for a control plane that stalls as a whole, and for a slow
	// etcd.
	for _, c := range k.excused() {
		if c.n*100 > k.Requests && kind != DrillKubeadmCertsRenew {
			return fmt.Errorf("%d of %d requests through the VIP: %s (more than 1%%)", c.n, k.Requests, c.what)
		}
	}
	return nil
}

// excusedRequests is one kind of failed request that is not vigil's
// failure (within a bound): how many, the first, and what they were.
type excusedRequests struct {
	n         int
	errs      []string
	what, tag string
}

func (k *KubeadmResult) excused() []excusedRequests {
	return []excusedRequests{
		{k.LateAnswers, k.LateAnswerErrors, "delivered to a live API server that answered late", "late"},
		{k.NoServer, k.NoServerErrors, "failed while no API server answered the lab directly", "no server"},
		{k.SlowStore, k.SlowStoreErrors, "failed while the VIP was briefly gone on a slow etcd", "slow etcd"},
	}
}

// phaseAt names the phase of r that was under way at t, the phases having
// begun at start.
func (r *Result) phaseAt(start, t time.Time) string {
	at := start
	for _, p := range r.Phases {
		at = at.Add(time.Duration(p.Millis * float64(time.Millisecond)))
		if t.Before(at) {
			return p.Name
		}
	}
	return "after the last phase"
}

// waitAnsweringIn is the time of the first answer after since from a node
// other than avoid, among replies already collected.
func waitAnsweringIn(replies []reply, avoid string, since time.Time) (time.Time, error) {
	for _, q := range replies {
		if q.at.After(since) && q.node != avoid && q.node != "" {
			return q.at, nil
		}
	}
	return time.Time{}, errors.New("no other node answered")
}
