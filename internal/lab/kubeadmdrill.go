package lab

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/vigil-ha/vigil/internal/election"
	"github.com/vigil-ha/vigil/internal/netns"
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
	// while the VIP was briefly gone (its holder stepped down), the lab's
	// own writes through etcd having taken over 400 ms just before: vigil
	// promises no move only while etcd answers within 400 ms
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
	w, err := newVIPWatch(l.st.Nodes)
	if err != nil {
		return err
	}
	defer w.close()
	d := &drillRun{l: l, dead: map[string]bool{}, w: w, target: victim}
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
	mon := startMonitor(w, live, probeInterval)
	defer mon.close()
	if !sleepCtx(ctx, time.Second) { // a baseline of good requests
		return ctx.Err()
	}
	phaseStart := time.Now()
	phase := r.phaser(phaseStart)
	fault := phaseStart
	switch kind {
	case DrillKubeadmVigilKilled, DrillKubeadmVigilOOM:
		err = l.killVigilContainer(ctx, victim, kind == DrillKubeadmVigilOOM, w, k, phase)
	case DrillKubeadmVigilRestart:
		err = l.restartVigilPod(ctx, victim, w, k, phase)
	case DrillKubeadmCertsRenew:
		err = l.renewCerts(ctx, phase)
	case DrillKubeadmReplace:
		d.setDead(victim.Name, true)
		err = l.replaceMachine(ctx, victim, w, k, phase)
	case DrillKubeadmLease:
		err = l.moveToLease(ctx, victim, w, k, phase)
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

// vigilProcess finds the process of a container of vigil's static pod on
// n: "vigil run" (role "run") or "vigil guard" (role "guard").
func vigilProcess(ctx context.Context, n *Node, role string) (int, error) {
	pids, err := nsPIDs(ctx, nodeNS(n.Name))
	if err != nil {
		return 0, err
	}
	for _, p := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p))
		if err != nil {
			continue
		}
		argv := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if len(argv) > 1 && argv[0] == "/usr/local/bin/vigil" && argv[1] == role {
			return p, nil
		}
	}
	return 0, fmt.Errorf("no vigil %s container process on %s", role, n.Name)
}

// killVigilContainer kills the holder's vigil container process (PID 1 of
// its container), with SIGKILL or through the OOM killer, and checks that
// its guard, a container of its own, survives and removes the VIP, and
// that kubelet restarts vigil.
func (l *Lab) killVigilContainer(ctx context.Context, n *Node, oom bool, w *vipWatch, k *KubeadmResult, phase func(string, string)) error {
	pid, err := vigilProcess(ctx, n, "run")
	if err != nil {
		return err
	}
	guard, err := vigilProcess(ctx, n, "guard")
	if err != nil {
		return err
	}
	killed := time.Now()
	how := "SIGKILL"
	if oom {
		// Starved, vigil may run on for seconds, reclaiming, before the
		// OOM killer picks it: the clock starts at its death.
		how = "OOM killer"
		limited, err := starveMemory(ctx, pid)
		if err != nil {
			return err
		}
		squeeze := func() {
			if dir, err := memoryCgroup(pid); err == nil {
				_ = lowerMemoryLimit(dir)
			}
		}
		if killed, err = waitDead(ctx, pid, 60*time.Second, squeeze); err != nil {
			return err
		}
		phase("OOM-killed", fmt.Sprintf("%v after its memory limit was lowered", killed.Sub(limited).Round(time.Millisecond)))
	} else if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("kill vigil (pid %d): %w", pid, err)
	}
	gone, err := waitVIPGone(ctx, w, n.Name, 10*time.Second)
	if err != nil {
		return err
	}
	// 0 when the VIP was gone already: a starved vigil that could not
	// renew stepped down, or its guard fenced it, before it died.
	k.VIPGoneMs = max(millis(gone.Sub(killed)), 0)
	phase("VIP gone from "+n.Name, fmt.Sprintf("vigil pid %d, %s", pid, how))
	// The bound the issue sets: one lease (the manifest keeps vigil's
	// default) plus a second.
	if bound := election.DefaultLeaseDuration + time.Second; gone.Sub(killed) > bound {
		return fmt.Errorf("the VIP left %s %v after the %s, beyond a lease + 1 s (%v)", n.Name, gone.Sub(killed).Round(time.Millisecond), how, bound)
	}
	if !alive(guard) {
		return fmt.Errorf("the guard (pid %d) died with vigil", guard)
	}
	if err := l.waitMovedAndNewVigil(ctx, n, pid, w, k, phase); err != nil {
		return err
	}
	phase("kubelet restarted vigil", "")
	if oom {
		reason, err := l.lastTermination(ctx, n.Name)
		if err != nil {
			return err
		}
		if reason != "OOMKilled" {
			return fmt.Errorf("kubelet reports vigil's last termination on %s as %q, not OOMKilled", n.Name, reason)
		}
		k.Terminated = reason
	}
	_, err = l.waitStable(ctx, recoverTimeout)
	return err
}

// renewCerts renews every kubeadm certificate on every control-plane node
// and restarts etcd and kube-apiserver node by node; vigil runs on.
func (l *Lab) renewCerts(ctx context.Context, phase func(string, string)) error {
	vigils := map[string]int{}
	for _, n := range l.st.Nodes {
		pid, err := vigilProcess(ctx, n, "run")
		if err != nil {
			return err
		}
		vigils[n.Name] = pid
	}
	kubeadm := filepath.Join(filepath.Dir(l.selfBin), "kubeadm")
	for _, n := range l.st.Nodes {
		cert := filepath.Join(l.machineDir(n), "etc-kubernetes", "pki", "apiserver-etcd-client.crt")
		before, err := os.ReadFile(cert)
		if err != nil {
			return err
		}
		if _, err := l.machineRun(ctx, n, kubeadm, "certs", "renew", "all"); err != nil {
			return err
		}
		after, err := os.ReadFile(cert)
		if err != nil {
			return err
		}
		if string(before) == string(after) {
			return fmt.Errorf("kubeadm certs renew all left %s unchanged on %s", filepath.Base(cert), n.Name)
		}
	}
	phase("kubeadm certs renew all", fmt.Sprintf("on %d nodes", len(l.st.Nodes)))
	for _, n := range l.st.Nodes {
		// kubelet restarts a static pod's container whose process died.
		// One node at a time, each back in full before the next: etcd
		// keeps its quorum.
		for _, comm := range []string{"etcd", "kube-apiserver"} {
			old, err := commPID(ctx, n, comm)
			if err != nil {
				return err
			}
			if err := l.killComm(ctx, n, comm); err != nil {
				return err
			}
			deadline := time.Now().Add(2 * time.Minute)
			for {
				if p, err := commPID(ctx, n, comm); err == nil && p != old {
					break
				}
				if time.Now().After(deadline) {
					return fmt.Errorf("kubelet did not restart %s on %s within 2 minutes", comm, n.Name)
				}
				if !sleepCtx(ctx, 100*time.Millisecond) {
					return ctx.Err()
				}
			}
		}
		if err := l.waitEtcdMembersHealthy(ctx, 2*time.Minute); err != nil {
			return err
		}
		if err := l.waitBackendUp(ctx, n, 3*time.Minute); err != nil {
			return err
		}
		phase("etcd and kube-apiserver restarted on "+n.Name, "")
	}
	for _, n := range l.st.Nodes {
		pid, err := vigilProcess(ctx, n, "run")
		if err != nil {
			return err
		}
		if pid != vigils[n.Name] {
			return fmt.Errorf("vigil on %s was restarted (pid %d, was %d)", n.Name, pid, vigils[n.Name])
		}
	}
	// Every etcd member restarted, so every vigil's connections to etcd
	// are new ones, made with the renewed pair; the holder still renews.
	holder, err := l.waitStable(ctx, recoverTimeout)
	if err != nil {
		return err
	}
	rep, err := l.vigilStatus(ctx, holder)
	if err != nil {
		return err
	}
	if !rep.Leader {
		return fmt.Errorf("vigil on %s holds the VIP but does not report leading", holder)
	}
	phase("same vigils, one holder", holder)
	return nil
}

// commPID is the process of node n whose command name is comm.
func commPID(ctx context.Context, n *Node, comm string) (int, error) {
	pids, err := nsPIDs(ctx, nodeNS(n.Name))
	if err != nil {
		return 0, err
	}
	for _, p := range pids {
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", p)); err == nil && strings.TrimSpace(string(b)) == comm {
			return p, nil
		}
	}
	return 0, fmt.Errorf("no %s process on %s", comm, n.Name)
}

// waitEtcdMembersHealthy waits until every etcd member answers a status
// request and all name the same leader.
func (l *Lab) waitEtcdMembersHealthy(ctx context.Context, d time.Duration) error {
	deadline := time.Now().Add(d)
	var last error
	for time.Now().Before(deadline) {
		last = l.etcdMembersHealthy(ctx)
		if last == nil {
			return nil
		}
		if !sleepCtx(ctx, 250*time.Millisecond) {
			return ctx.Err()
		}
	}
	return fmt.Errorf("lab: etcd not healthy after %v: %w", d, last)
}

func (l *Lab) etcdMembersHealthy(ctx context.Context) error {
	cli, err := l.kubeadmEtcdClient()
	if err != nil {
		return err
	}
	defer cli.Close()
	var leader uint64
	for _, ep := range cli.Endpoints() {
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		st, err := cli.Status(sctx, ep)
		cancel()
		if err != nil {
			return fmt.Errorf("%s: %w", ep, err)
		}
		if leader != 0 && st.Leader != leader {
			return fmt.Errorf("%s follows %x, another member %x", ep, st.Leader, leader)
		}
		leader = st.Leader
	}
	if leader == 0 {
		return errors.New("no etcd leader")
	}
	return nil
}

// waitMovedAndNewVigil waits until another node holds the VIP (recording
// when, as the phase "new holder"), then until kubelet runs a vigil on n
// other than the process old.
func (l *Lab) waitMovedAndNewVigil(ctx context.Context, n *Node, old int, w *vipWatch, k *KubeadmResult, phase func(string, string)) error {
	if _, err := l.waitHolderOther(ctx, w, n.Name, 30*time.Second); err != nil {
		return err
	}
	k.movedAt = time.Now()
	phase("new holder", "")
	deadline := time.Now().Add(60 * time.Second)
	for {
		if p, err := vigilProcess(ctx, n, "run"); err == nil && p != old {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kubelet did not start a new vigil on %s within 60s", n.Name)
		}
		if !sleepCtx(ctx, 100*time.Millisecond) {
			return ctx.Err()
		}
	}
}

// restartVigilPod annotates vigil's static pod manifest on n, so that
// kubelet replaces the pod, and waits for the VIP to move and for the new
// vigil to run.
func (l *Lab) restartVigilPod(ctx context.Context, n *Node, w *vipWatch, k *KubeadmResult, phase func(string, string)) error {
	old, err := vigilProcess(ctx, n, "run")
	if err != nil {
		return err
	}
	dir := filepath.Join(l.machineDir(n), "etc-kubernetes", "manifests")
	path := filepath.Join(dir, "vigil.yaml")
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var pod corev1.Pod
	if err := yaml.Unmarshal(b, &pod); err != nil {
		return fmt.Errorf("lab: %s: %w", path, err)
	}
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	pod.Annotations["vigil-lab.vigil-ha.io/restarted-at"] = time.Now().UTC().Format(time.RFC3339Nano)
	out, err := yaml.Marshal(&pod)
	if err != nil {
		return err
	}
	// kubelet ignores dot files in the manifests directory; the rename is
	// the change it sees.
	tmp := filepath.Join(dir, ".vigil.yaml.tmp")
	if err := os.WriteFile(tmp, out, 0o600); err != nil {
		return err
	}
	changed := time.Now()
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	gone, err := waitVIPGone(ctx, w, n.Name, 60*time.Second)
	if err != nil {
		return err
	}
	k.VIPGoneMs = millis(gone.Sub(changed))
	phase("kubelet stopped the pod, VIP gone from "+n.Name, "")
	if err := l.waitMovedAndNewVigil(ctx, n, old, w, k, phase); err != nil {
		return err
	}
	phase("new vigil pod running", "")
	_, err = l.waitStable(ctx, recoverTimeout)
	return err
}

// waitDead returns when pid has exited, polled every millisecond; every
// 200 ms meanwhile it calls squeeze (when not nil). A starved process
// whose cgroup still holds page cache (its own binary's text, which the
// kernel can drop and read again) is not OOM-killed until that is gone:
// lowering the limit again, to just below the usage, takes it away.
func waitDead(ctx context.Context, pid int, d time.Duration, squeeze func()) (time.Time, error) {
	deadline := time.Now().Add(d)
	next := time.Now().Add(200 * time.Millisecond)
	for alive(pid) {
		if time.Now().After(deadline) {
			return time.Time{}, fmt.Errorf("vigil (pid %d) still alive %v after its memory limit was lowered", pid, d)
		}
		if squeeze != nil && time.Now().After(next) {
			squeeze()
			next = time.Now().Add(200 * time.Millisecond)
		}
		if !sleepCtx(ctx, time.Millisecond) {
			return time.Time{}, ctx.Err()
		}
	}
	return time.Now(), nil
}

// starveMemory lowers the memory limit of pid's cgroup (cgroup v1) just
// below what it uses, so that its next allocation finds nothing to reclaim
// and the kernel's OOM killer kills it. The kernel refuses a limit below
// what it cannot reclaim (EBUSY), so the write is retried as vigil's use
// moves. It returns when the limit took.
func starveMemory(ctx context.Context, pid int) (time.Time, error) {
	dir, err := memoryCgroup(pid)
	if err != nil {
		return time.Time{}, err
	}
	deadline := time.Now().Add(10 * time.Second)
	var last error
	for time.Now().Before(deadline) {
		if last = lowerMemoryLimit(dir); last == nil {
			return time.Now(), nil
		}
		if !sleepCtx(ctx, 50*time.Millisecond) {
			return time.Time{}, ctx.Err()
		}
	}
	return time.Time{}, fmt.Errorf("could not lower the memory limit of %s: %w", dir, last)
}

// memoryCgroup is the cgroup v1 memory directory of pid.
func memoryCgroup(pid int) (string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.SplitN(line, ":", 3); len(f) == 3 && slices.Contains(strings.Split(f[1], ","), "memory") {
			return filepath.Join(cgroupFS, "memory", f[2]), nil
		}
	}
	return "", fmt.Errorf("no memory cgroup for pid %d", pid)
}

// lowerMemoryLimit sets dir's limit 256 KiB below its usage now; the
// kernel refuses (EBUSY) when it cannot reclaim that much.
func lowerMemoryLimit(dir string) error {
	u, err := os.ReadFile(filepath.Join(dir, "memory.usage_in_bytes"))
	if err != nil {
		return err
	}
	var usage int64
	fmt.Sscan(strings.TrimSpace(string(u)), &usage)
	return os.WriteFile(filepath.Join(dir, "memory.limit_in_bytes"), []byte(fmt.Sprint(usage-256<<10)), 0o644)
}

// lastTermination is why vigil's container in the static pod on node last
// ended, as kubelet reports it.
func (l *Lab) lastTermination(ctx context.Context, node string) (string, error) {
	c, err := l.kubeClient()
	if err != nil {
		return "", err
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		pod, err := c.CoreV1().Pods("kube-system").Get(ctx, "vigil-"+node, metav1.GetOptions{})
		if err == nil {
			for _, cs := range pod.Status.ContainerStatuses {
				if cs.Name == "vigil" && cs.LastTerminationState.Terminated != nil {
					return cs.LastTerminationState.Terminated.Reason, nil
				}
			}
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("the mirror pod vigil-%s shows no last termination (err %v)", node, err)
		}
		if !sleepCtx(ctx, 500*time.Millisecond) {
			return "", ctx.Err()
		}
	}
}

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
	l.st.Nodes = append(l.st.Nodes, n)
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
		if !sleepCtx(ctx, 200*time.Millisecond) {
			return ctx.Err()
		}
	}
	return fmt.Errorf("lab: %s after %v", last, d)
}

// kubeadmEtcdClient is a client of the kubeadm cluster's etcd with
// kubeadm's apiserver-etcd-client certificate, from the client namespace.
func (l *Lab) kubeadmEtcdClient() (*clientv3.Client, error) {
	return l.kubeadmEtcdClientOf(l.st.Nodes)
}

// kubeadmEtcdClientOf is kubeadmEtcdClient with the members of nodes only.
func (l *Lab) kubeadmEtcdClientOf(nodes []*Node) (*clientv3.Client, error) {
	var pki string
	var eps []string
	for _, n := range nodes {
		p := filepath.Join(l.machineDir(n), "etc-kubernetes", "pki")
		if _, err := os.Stat(filepath.Join(p, "apiserver-etcd-client.crt")); err != nil {
			continue
		}
		if pki == "" {
			pki = p
		}
		eps = append(eps, fmt.Sprintf("https://%s:2379", n.IP))
	}
	if pki == "" {
		return nil, errors.New("lab: no control-plane node has kubeadm's etcd client certificate")
	}
	tlsInfo := transport.TLSInfo{
		CertFile:      filepath.Join(pki, "apiserver-etcd-client.crt"),
		KeyFile:       filepath.Join(pki, "apiserver-etcd-client.key"),
		TrustedCAFile: filepath.Join(pki, "etcd", "ca.crt"),
	}
	tc, err := tlsInfo.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("lab: etcd TLS: %w", err)
	}
	return clientv3.New(clientv3.Config{
		Endpoints:   eps,
		DialTimeout: 2 * time.Second,
		TLS:         tc,
		DialOptions: []grpc.DialOption{grpc.WithContextDialer(netns.Dialer(clientNS))},
		Logger:      zap.NewNop(),
	})
}

// withKubeadmEtcd runs f with a client of the kubeadm cluster's etcd and a
// 5 s context.
func (l *Lab) withKubeadmEtcd(ctx context.Context, f func(context.Context, *clientv3.Client) error) error {
	cli, err := l.kubeadmEtcdClient()
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return f(ctx, cli)
}

// kubeadmMembers lists the etcd member names.
func (l *Lab) kubeadmMembers(ctx context.Context) (map[string]uint64, error) {
	var resp *clientv3.MemberListResponse
	err := l.withKubeadmEtcd(ctx, func(ctx context.Context, cli *clientv3.Client) (err error) {
		resp, err = cli.MemberList(ctx)
		return err
	})
	if err != nil {
		return nil, err
	}
	out := map[string]uint64{}
	for _, m := range resp.Members {
		out[m.Name] = m.ID
	}
	return out, nil
}

// waitMemberGone waits until etcd no longer lists member name.
func (l *Lab) waitMemberGone(ctx context.Context, name string, d time.Duration) error {
	deadline := time.Now().Add(d)
	var last error
	for time.Now().Before(deadline) {
		ms, err := l.kubeadmMembers(ctx)
		if err == nil {
			if _, ok := ms[name]; !ok {
				return nil
			}
			err = fmt.Errorf("member %s still listed", name)
		}
		last = err
		if !sleepCtx(ctx, 500*time.Millisecond) {
			return ctx.Err()
		}
	}
	return fmt.Errorf("lab: vigil did not prune %s within %v: %w", name, d, last)
}

// removeMemberByHand removes member name from etcd, as the seed's user had
// to.
func (l *Lab) removeMemberByHand(ctx context.Context, name string) error {
	ms, err := l.kubeadmMembers(ctx)
	if err != nil {
		return err
	}
	id, ok := ms[name]
	if !ok {
		return nil
	}
	cli, err := l.kubeadmEtcdClient()
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := cli.MemberRemove(ctx, id); err != nil {
		return fmt.Errorf("lab: remove member %s by hand: %w", name, err)
	}
	return nil
}

// kubeadmCA is the cluster CA's certificate pool, for HTTPS to the VIP.
func (l *Lab) kubeadmCA() (*x509.CertPool, error) {
	for _, n := range l.st.Nodes {
		pem, err := os.ReadFile(filepath.Join(l.machineDir(n), "etc-kubernetes", "pki", "ca.crt"))
		if err == nil {
			pool := x509.NewCertPool()
			pool.AppendCertsFromPEM(pem)
			return pool, nil
		}
	}
	return nil, errors.New("lab: no control-plane node has the cluster CA")
}

// preflightLine sums a preflight up for the drill's phases.
func preflightLine(p Preflight) string {
	if p.Join {
		return "yes"
	}
	line := "no: " + strings.Join(p.Failed, "; ")
	if len(p.Fixes) > 0 {
		line += "; fix: " + p.Fixes[0]
	}
	return line
}

// Preflight is one run of vigil members preflight during a drill.
type Preflight struct {
	When string `json:"when"`
	Join bool   `json:"join"` // it said yes (exit 0)
	// Failed are the checks it failed, each with its detail.
	Failed []string `json:"failed,omitempty"`
	// Fixes are the commands it printed for them.
	Fixes []string `json:"fixes,omitempty"`
}

// preflight runs vigil members preflight from the client namespace, as an
// operator about to run kubeadm join would, with kubeadm's etcd client
// certificate and admin.conf of a surviving control-plane node.
func (l *Lab) preflight(ctx context.Context, when, joining string) (Preflight, error) {
	var pki, admin string
	var eps []string
	for _, n := range l.st.Nodes {
		dir := filepath.Join(l.machineDir(n), "etc-kubernetes")
		if _, err := os.Stat(filepath.Join(dir, "pki", "apiserver-etcd-client.crt")); err != nil {
			continue
		}
		if pki == "" {
			pki, admin = filepath.Join(dir, "pki"), filepath.Join(dir, filepath.Base(kubeadmAdmin))
		}
		eps = append(eps, fmt.Sprintf("https://%s:2379", n.IP))
	}
	if pki == "" {
		return Preflight{}, errors.New("lab: no control-plane node has kubeadm's etcd client certificate")
	}
	args := []string{"netns", "exec", clientNS, l.vigilBin, "members", "preflight", "-o", "json",
		"--etcd-endpoints", strings.Join(eps, ","), "--etcd-cacert", filepath.Join(pki, "etcd", "ca.crt"),
		"--etcd-cert", filepath.Join(pki, "apiserver-etcd-client.crt"), "--etcd-key", filepath.Join(pki, "apiserver-etcd-client.key"),
		"--kubeconfig", admin}
	if joining != "" {
		args = append(args, "--for-join", joining)
	}
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(cctx, "ip", args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var ee *exec.ExitError
	if err != nil && !(errors.As(err, &ee) && ee.ExitCode() == 1) {
		return Preflight{}, fmt.Errorf("lab: vigil members preflight: %w: %s", err, stderr.String())
	}
	var res struct {
		Join     bool
		Findings []struct {
			Check, Detail string
			OK, Skipped   bool
			Fix           []string
		}
	}
	if jerr := json.Unmarshal(out, &res); jerr != nil {
		return Preflight{}, fmt.Errorf("lab: vigil members preflight printed no JSON (%v): %s%s", jerr, out, stderr.String())
	}
	p := Preflight{When: when, Join: res.Join}
	for _, f := range res.Findings {
		if !f.OK && !f.Skipped {
			p.Failed = append(p.Failed, f.Check+": "+f.Detail)
			p.Fixes = append(p.Fixes, f.Fix...)
		}
	}
	if p.Join != (err == nil) {
		return p, fmt.Errorf("lab: vigil members preflight said join=%v but exited with %v", p.Join, err)
	}
	return p, nil
}
