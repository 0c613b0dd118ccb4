package lab

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/vigil-ha/vigil/internal/clock"
	"github.com/vigil-ha/vigil/internal/election"
)

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
		if !clock.Sleep(ctx, 100*time.Millisecond) {
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
		if !clock.Sleep(ctx, time.Millisecond) {
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
		if !clock.Sleep(ctx, 50*time.Millisecond) {
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
		if !clock.Sleep(ctx, 500*time.Millisecond) {
			return "", ctx.Err()
		}
	}
}
