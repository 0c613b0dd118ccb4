//go:build linux

package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vigil-ha/vigil/internal/netns"
	"github.com/vigil-ha/vigil/internal/nstest"
	"github.com/vigil-ha/vigil/internal/testkit"
)

// A stopped vigil (SIGSTOP) cannot step down; its guard removes the VIP
// once the lease deadline it was sent has passed. Without a kernel lifetime,
// nothing else could.
func TestGuardFencesStoppedHolder(t *testing.T) {
	p := nstest.NewPair(t)
	startEtcdIn(t, p.A)
	vigil := startVigilA(t, p.A, "--vip-lifetime", "0")
	testkit.WaitFor(t, 20*time.Second, "the VIP on a0", func() bool { return hasVIP(t, p.A) })
	if err := vigil.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	defer func() { _ = vigil.Process.Signal(syscall.SIGCONT) }()
	// The guard acts 600 ms after the last renewal began; 3 s is generous.
	testkit.WaitFor(t, 3*time.Second, "the guard to remove the VIP of the stopped holder", func() bool { return !hasVIP(t, p.A) })
	t.Logf("VIP gone %v after SIGSTOP", time.Since(stopped).Round(10*time.Millisecond))
	testkit.Always(t, time.Second, "without the VIP while vigil is stopped", func() bool { return !hasVIP(t, p.A) })
	// Resumed, vigil steps down, campaigns, and takes its own lock again.
	if err := vigil.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 10*time.Second, "the resumed vigil to hold the VIP again", func() bool { return hasVIP(t, p.A) })
}

// The static pod's guard runs as a container of its own (vigil guard
// --listen) because a child guard dies with vigil, PID 1 of its container.
// A vigil connected to it that is SIGKILLed loses the VIP at once; the guard
// then serves the next vigil, and fences it too when it is stopped. No
// kernel lifetime helps here.
func TestGuardSocketFencesKilledAndStoppedHolder(t *testing.T) {
	p := nstest.NewPair(t)
	startEtcdIn(t, p.A)
	sock := filepath.Join(t.TempDir(), "guard.sock")
	startIn(t, p.A, "guard.log", nstest.Binary(t, "vigil"), "guard", "--listen", sock, "--vip", testVIP+"/24", "--interface", "a0")
	vigil := startVigilA(t, p.A, "--vip-lifetime", "0", "--guard-socket", sock)
	testkit.WaitFor(t, 20*time.Second, "the VIP on a0", func() bool { return hasVIP(t, p.A) })
	if err := vigil.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	testkit.WaitFor(t, 2*time.Second, "the guard to remove the VIP of the killed holder", func() bool { return !hasVIP(t, p.A) })
	t.Logf("VIP gone %v after SIGKILL", time.Since(killed).Round(time.Millisecond))

	// The guard outlived its vigil and serves the next one.
	vigil = startVigilA(t, p.A, "--vip-lifetime", "0", "--guard-socket", sock)
	testkit.WaitFor(t, 20*time.Second, "the restarted vigil to hold the VIP", func() bool { return hasVIP(t, p.A) })
	if err := vigil.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	defer func() { _ = vigil.Process.Signal(syscall.SIGCONT) }()
	testkit.WaitFor(t, 3*time.Second, "the guard to remove the VIP of the stopped holder", func() bool { return !hasVIP(t, p.A) })
	t.Logf("VIP gone %v after SIGSTOP", time.Since(stopped).Round(time.Millisecond))
}

// A vigil whose guard does not listen (its container has not started, or is
// being restarted) would hold the VIP unfenced: it does not campaign, says
// why, and a holder whose guard dies steps down until the guard is back.
func TestNoGuardNoVIP(t *testing.T) {
	p := nstest.NewPair(t)
	startEtcdIn(t, p.A)
	sock := filepath.Join(t.TempDir(), "guard.sock")
	bin := nstest.Binary(t, "vigil")
	startVigilA(t, p.A, "--vip-lifetime", "0", "--guard-socket", sock)
	testkit.WaitFor(t, 20*time.Second, "vigil to say why it does not campaign", func() bool {
		return strings.Contains(statusOK(bin, p.A).Ineligible, "not connected to the VIP guard")
	})
	// Several retry periods.
	testkit.Always(t, time.Second, "without the VIP while no guard listens", func() bool { return !hasVIP(t, p.A) })
	guardArgs := []string{"guard", "--listen", sock, "--vip", testVIP + "/24", "--interface", "a0"}
	guard := startIn(t, p.A, "guard.log", bin, guardArgs...)
	testkit.WaitFor(t, 10*time.Second, "the VIP once the guard listens", func() bool { return hasVIP(t, p.A) })

	// The guard dies (SIGKILL: it cannot remove anything): the holder
	// steps down and removes the VIP itself.
	if err := guard.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 5*time.Second, "the holder without its guard to step down", func() bool { return !hasVIP(t, p.A) })
	if r := statusOK(bin, p.A); r.Leader {
		t.Fatalf("vigil still leads without a guard: %+v", r)
	}
	startIn(t, p.A, "guard2.log", bin, guardArgs...)
	testkit.WaitFor(t, 10*time.Second, "the VIP once a guard listens again", func() bool { return hasVIP(t, p.A) })
}

// statusOK is status that returns the zero Report while vigil does not answer.
func statusOK(bin, ns string) Report {
	out, err := exec.Command("ip", "netns", "exec", ns, bin, "status", "--json").Output()
	var r Report
	if err == nil {
		_ = json.Unmarshal(out, &r)
	}
	return r
}

// waitProbedAfter waits until the node in ns has finished a VIP conflict
// probe after after: the probe that follows a takeover (once
// conflictSettle has passed).
func waitProbedAfter(t *testing.T, ns string, after time.Time) {
	t.Helper()
	bin := nstest.Binary(t, "vigil")
	testkit.WaitFor(t, 10*time.Second, "a conflict probe after the takeover", func() bool {
		lp := statusOK(bin, ns).Conflict.LastProbe
		return lp != nil && lp.After(after)
	})
}

// metricsOf is what vigil run in ns serves on /metrics ("" if it does not
// answer).
func metricsOf(t *testing.T, ns string) string {
	t.Helper()
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) { return netns.Dialer(ns)(ctx, addr) },
	}}
	resp, err := hc.Get("http://127.0.0.1:9558/metrics")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return string(body)
}

// The address follows the role: a VIP deleted on the holder comes back, a
// VIP added on a node that does not lead goes, both at once.
func TestAddressFollowsRole(t *testing.T) {
	p := nstest.NewPair(t)
	startEtcdIn(t, p.A)
	startVigilA(t, p.A)
	testkit.WaitFor(t, 20*time.Second, "the VIP on a0", func() bool { return hasVIP(t, p.A) })
	for i := 0; i < 3; i++ {
		nstest.IP(t, "-n", p.A, "addr", "del", testVIP+"/24", "dev", "a0")
		testkit.WaitFor(t, time.Second, "the holder to put the VIP back", func() bool { return hasVIP(t, p.A) })
	}
	// B runs vigil too, with its own name; it does not lead.
	startIn(t, p.B, "vigil-b.log", nstest.Binary(t, "vigil"), "run", "--vip", testVIP+"/24", "--interface", "b0",
		"--node-name", "n2", "--etcd-endpoints", "http://192.0.2.1:2379", "--metrics-address", "")
	for i := 0; i < 3; i++ {
		nstest.IP(t, "-n", p.B, "addr", "add", testVIP+"/24", "dev", "b0")
		// The first time, B's vigil may still be starting; after that,
		// at once.
		within := time.Second
		if i == 0 {
			within = 20 * time.Second
		}
		testkit.WaitFor(t, within, "the non-holder to remove the stray VIP", func() bool {
			return !strings.Contains(nstest.IP(t, "-n", p.B, "addr", "show", "dev", "b0"), " "+testVIP+"/")
		})
	}
	if !hasVIP(t, p.A) {
		t.Fatal("the holder lost the VIP")
	}
}

// A holder whose VIP interface loses carrier, or is renamed away, releases
// the lock and removes the VIP, and does not campaign until the interface
// is back.
func TestHolderWithoutItsInterfaceStepsDown(t *testing.T) {
	p := nstest.NewPair(t)
	startEtcdIn(t, p.A)
	startVigilA(t, p.A)
	testkit.WaitFor(t, 20*time.Second, "the VIP on a0", func() bool { return hasVIP(t, p.A) })

	nstest.IP(t, "-n", p.B, "link", "set", "b0", "down") // a0 loses carrier
	testkit.WaitFor(t, 5*time.Second, "the lock to be released", func() bool { return lockHolder(t, p.A) == "" })
	if hasVIP(t, p.A) {
		t.Fatal("VIP still on a0 without carrier")
	}
	testkit.Always(t, 2*time.Second, "the lock free while the interface has no carrier", func() bool { return lockHolder(t, p.A) == "" })
	nstest.IP(t, "-n", p.B, "link", "set", "b0", "up")
	testkit.WaitFor(t, 10*time.Second, "the VIP back once carrier returns", func() bool { return hasVIP(t, p.A) })

	nstest.IP(t, "-n", p.A, "link", "set", "a0", "down")
	nstest.IP(t, "-n", p.A, "link", "set", "a0", "name", "a9")
	testkit.WaitFor(t, 5*time.Second, "the lock to be released", func() bool { return lockHolder(t, p.A) == "" })
	if strings.Contains(nstest.IP(t, "-n", p.A, "addr", "show", "dev", "a9"), " "+testVIP+"/") {
		t.Fatal("the VIP stayed on the renamed interface")
	}
	nstest.IP(t, "-n", p.A, "link", "set", "a9", "name", "a0")
	nstest.IP(t, "-n", p.A, "link", "set", "a0", "up")
	testkit.WaitFor(t, 10*time.Second, "the VIP back on a0", func() bool { return hasVIP(t, p.A) })
}

// The holder's elector is stuck writing a log line (stderr is a full pipe
// nobody reads) when etcd goes away. The keeper's own timer must remove the
// VIP at the lease deadline anyway: with no guard and no kernel lifetime,
// nothing else can.
func TestBlockedHolderFencedByItsOwnDeadline(t *testing.T) {
	p := nstest.NewPair(t)
	etcd := startEtcdIn(t, p.A)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	cmd := exec.Command("ip", "netns", "exec", p.A, nstest.Binary(t, "vigil"), "run", "--vip", testVIP+"/24", "--interface", "a0",
		"--node-name", "n1", "--etcd-endpoints", "http://127.0.0.1:2379", "--vip-lifetime", "0", "--guard=false", "--metrics-address", "")
	cmd.Stderr = w
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); r.Close(); <-done })
	// Read its log until it leads, then stop reading (no read may be left
	// pending) and fill the pipe.
	buf := make([]byte, 64<<10)
	deadline := time.Now().Add(20 * time.Second)
	for !hasVIP(t, p.A) {
		if time.Now().After(deadline) {
			t.Fatal("vigil did not take the VIP")
		}
		_ = r.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		_, _ = r.Read(buf) // a timeout just means nothing was logged
	}
	// Fill it through a file description of our own: O_NONBLOCK set on w's
	// would be shared with vigil's stderr, and vigil's writes would fail
	// instead of blocking.
	fd, err := syscall.Open(fmt.Sprintf("/proc/self/fd/%d", w.Fd()), syscall.O_WRONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	// Pages first, then single bytes: a page-sized write fails while up to
	// a page minus one byte is still free.
	for _, size := range []int{4096, 1} {
		junk := make([]byte, size)
		for {
			if _, err := syscall.Write(fd, junk); err != nil {
				break // EAGAIN: full; vigil's next log line blocks
			}
		}
	}
	if err := etcd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	testkit.WaitFor(t, 3*time.Second, "the VIP to go at the lease deadline", func() bool { return !hasVIP(t, p.A) })
	t.Logf("VIP gone %v after etcd was killed, with vigil's stderr blocked", time.Since(killed).Round(10*time.Millisecond))
	select {
	case <-done:
		t.Fatal("vigil exited; the test wants it alive and blocked")
	default:
	}
}

// Adding the VIP fails (IPv6 is disabled on the interface): the holder
// retries, steps down after the second failure, releases the lock, and says
// why in its status.
func TestHolderThatCannotAddTheVIPStepsDown(t *testing.T) {
	p := nstest.NewPair(t)
	startEtcdIn(t, p.A)
	nstest.IP(t, "netns", "exec", p.A, "sysctl", "-qw", "net.ipv6.conf.a0.disable_ipv6=1")
	startIn(t, p.A, "vigil.log", nstest.Binary(t, "vigil"), "run", "--vip", "fd00:192::100/64", "--interface", "a0",
		"--node-name", "n1", "--etcd-endpoints", "http://127.0.0.1:2379")
	// It holds the lock for a few hundred milliseconds at most, which a
	// poll of the lock record can miss on a loaded machine (a CI run did,
	// twice over 20 s): its counter of tenures says it took the lock.
	testkit.WaitFor(t, 20*time.Second, "n1 to take the lock (vigil_leader_acquired_total)", func() bool {
		for _, line := range strings.Split(metricsOf(t, p.A), "\n") {
			if v, ok := strings.CutPrefix(line, "vigil_leader_acquired_total "); ok {
				n, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
				return err == nil && n >= 1
			}
		}
		return false
	})
	testkit.WaitFor(t, 5*time.Second, "the lock to be released", func() bool { return lockHolderOK(p.A) == "" })
	// It stands by for 10 s after the failures, then tries again (a peer,
	// if any, holds the lock by then): the status says why meanwhile.
	testkit.WaitFor(t, 5*time.Second, "vigil status to say why n1 stands by", func() bool {
		out := nstest.IP(t, "netns", "exec", p.A, nstest.Binary(t, "vigil"), "status")
		return strings.Contains(out, "does not campaign: adding the VIP failed")
	})
}

// Another machine answers for the VIP besides the holder: every vigil
// reports the conflict, with the MAC, within 5 s.
func TestConflictReported(t *testing.T) {
	p := nstest.NewPair(t)
	startEtcdIn(t, p.A)
	startVigilA(t, p.A)
	testkit.WaitFor(t, 20*time.Second, "the VIP on a0", func() bool { return hasVIP(t, p.A) })
	waitProbedAfter(t, p.A, time.Now().Add(conflictSettle))
	// B runs no vigil: a foreign host given the VIP by mistake.
	nstest.IP(t, "-n", p.B, "addr", "add", testVIP+"/32", "dev", "b0")
	added := time.Now()
	bmac := strings.Fields(nstest.IP(t, "-n", p.B, "-br", "link", "show", "b0"))[2]
	status := func() string { return nstest.IP(t, "netns", "exec", p.A, nstest.Binary(t, "vigil"), "status") }
	testkit.WaitFor(t, 5*time.Second, "the conflict in vigil status", func() bool { return strings.Contains(status(), "VIP CONFLICT: "+bmac) })
	t.Logf("conflict reported %v after B took the VIP", time.Since(added).Round(10*time.Millisecond))
	metrics := metricsOf(t, p.A)
	for _, want := range []string{"vigil_vip_conflicts_total 1", "vigil_vip_conflict 1"} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	nstest.IP(t, "-n", p.B, "addr", "del", testVIP+"/32", "dev", "b0")
	testkit.WaitFor(t, 5*time.Second, "the conflict to clear", func() bool { return strings.Contains(status(), "VIP conflicts: none now") })
}

// In dual-stack every address of the VIP is probed: a foreign host that
// answers for the IPv6 address alone is reported too.
func TestConflictReportedOnEitherFamily(t *testing.T) {
	p := nstest.NewPair(t)
	startEtcdIn(t, p.A)
	const vip6 = "fd00:192::100"
	startVigilA(t, p.A, "--vip", vip6+"/64")
	testkit.WaitFor(t, 20*time.Second, "both VIP addresses on a0", func() bool {
		out := nstest.IP(t, "-n", p.A, "addr", "show", "dev", "a0")
		return strings.Contains(out, " "+testVIP+"/") && strings.Contains(out, " "+vip6+"/64 ")
	})
	waitProbedAfter(t, p.A, time.Now().Add(conflictSettle))
	nstest.IP(t, "-n", p.B, "addr", "add", vip6+"/128", "dev", "b0", "nodad")
	bmac := strings.Fields(nstest.IP(t, "-n", p.B, "-br", "link", "show", "b0"))[2]
	status := func() string { return nstest.IP(t, "netns", "exec", p.A, nstest.Binary(t, "vigil"), "status") }
	testkit.WaitFor(t, 5*time.Second, "the IPv6 conflict in vigil status", func() bool { return strings.Contains(status(), "VIP CONFLICT: "+bmac) })
	nstest.IP(t, "-n", p.B, "addr", "del", vip6+"/128", "dev", "b0")
	testkit.WaitFor(t, 5*time.Second, "the conflict to clear", func() bool { return strings.Contains(status(), "VIP conflicts: none now") })
}

// A second process with a candidate's name (a third node holds the lock, so
// the lock record shows no twin) is refused at start by the name claim, and
// never touches the VIP.
func TestDuplicateNameRefusedAtStart(t *testing.T) {
	p := nstest.NewPair(t)
	startEtcdOn(t, p.A, "192.0.2.1")
	vigil := nstest.Binary(t, "vigil")
	startIn(t, p.A, "vigil-n1.log", vigil, "run", "--vip", testVIP+"/24", "--interface", "a0",
		"--node-name", "n1", "--etcd-endpoints", "http://127.0.0.1:2379")
	testkit.WaitFor(t, 20*time.Second, "n1 to hold the VIP", func() bool { return hasVIP(t, p.A) })
	startIn(t, p.B, "vigil-n2.log", vigil, "run", "--vip", testVIP+"/24", "--interface", "b0",
		"--node-name", "n2", "--etcd-endpoints", "http://192.0.2.1:2379", "--metrics-address", "")
	testkit.WaitFor(t, 20*time.Second, "n2 to claim its name", func() bool {
		v, err := readKey(p.A, "/vigil/leader/names/n2")
		return err == nil && v != nil
	})
	var out bytes.Buffer
	twin := exec.Command("ip", "netns", "exec", p.B, vigil, "run", "--vip", testVIP+"/24", "--interface", "b0",
		"--node-name", "n2", "--etcd-endpoints", "http://192.0.2.1:2379", "--metrics-address", "")
	twin.Stdout, twin.Stderr = &out, &out
	start := time.Now()
	err := runWithin(twin, 15*time.Second)
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
		t.Fatalf("twin exit = %v, want status 1; output:\n%s", err, out.String())
	}
	last := strings.TrimSpace(out.String())
	if i := strings.LastIndexByte(last, '\n'); i >= 0 {
		last = last[i+1:]
	}
	if !strings.Contains(last, `node name "n2" is claimed by another running process`) {
		t.Fatalf("twin's last line does not name the duplicate: %q", last)
	}
	t.Logf("twin refused after %v: %s", time.Since(start).Round(10*time.Millisecond), last)
	if !hasVIP(t, p.A) || lockHolder(t, p.A) != "n1" {
		t.Fatal("the holder was disturbed")
	}
}

// runWithin runs cmd and kills it if it has not exited within d.
func runWithin(cmd *exec.Cmd, d time.Duration) error {
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(d):
		_ = cmd.Process.Kill()
		<-done
		return fmt.Errorf("still running after %v", d)
	}
}

// A stopped guard (SIGSTOP, a frozen container) still has its pipe or
// socket open, and vigil's writes land in the kernel's buffer: only its
// answers tell it is alive. Stopped, it costs the holder the VIP, which the
// holder removes itself; a vigil stopped after it then leaves nothing
// behind, even with no kernel lifetime. Resumed, the VIP comes back.
func TestStoppedGuardStepsDown(t *testing.T) {
	for _, mode := range []string{"child", "socket"} {
		t.Run(mode, func(t *testing.T) {
			p := nstest.NewPair(t)
			startEtcdIn(t, p.A)
			bin := nstest.Binary(t, "vigil")
			var vigil *exec.Cmd
			var guardPID int
			if mode == "socket" {
				sock := filepath.Join(t.TempDir(), "guard.sock")
				g := startIn(t, p.A, "guard.log", bin, "guard", "--listen", sock, "--vip", testVIP+"/24", "--interface", "a0")
				guardPID = g.Process.Pid
				vigil = startVigilA(t, p.A, "--vip-lifetime", "0", "--guard-socket", sock)
			} else {
				vigil = startVigilA(t, p.A, "--vip-lifetime", "0")
			}
			testkit.WaitFor(t, 20*time.Second, "the VIP on a0", func() bool { return hasVIP(t, p.A) })
			if mode == "child" {
				guardPID = childOf(t, vigil.Process.Pid)
			}
			if m := metricsOf(t, p.A); !strings.Contains(m, "\nvigil_guard_up 1\n") {
				t.Fatalf("metrics with a guard that answers lack vigil_guard_up 1:\n%s", m)
			}
			guard, err := os.FindProcess(guardPID)
			if err != nil {
				t.Fatal(err)
			}
			if err := guard.Signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			stopped := time.Now()
			defer func() { _ = guard.Signal(syscall.SIGCONT) }()
			// Unanswered for 300 ms at the defaults, then the next renewal
			// steps down; 3 s is generous.
			testkit.WaitFor(t, 3*time.Second, "the holder with a stopped guard to remove the VIP", func() bool { return !hasVIP(t, p.A) })
			t.Logf("VIP gone %v after the guard's SIGSTOP", time.Since(stopped).Round(time.Millisecond))
			testkit.WaitFor(t, 5*time.Second, "vigil to say its guard does not answer", func() bool {
				return strings.Contains(statusOK(bin, p.A).Ineligible, "guard does not answer")
			})
			if m := metricsOf(t, p.A); !strings.Contains(m, "\nvigil_guard_up 0\n") {
				t.Fatalf("metrics with a stopped guard lack vigil_guard_up 0:\n%s", m)
			}
			// vigil stopped too: nothing may bring the VIP back.
			if err := vigil.Process.Signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			testkit.Always(t, 1500*time.Millisecond, "without the VIP while the guard is stopped", func() bool { return !hasVIP(t, p.A) })
			_ = vigil.Process.Signal(syscall.SIGCONT)
			if err := guard.Signal(syscall.SIGCONT); err != nil {
				t.Fatal(err)
			}
			testkit.WaitFor(t, 10*time.Second, "the VIP once the guard answers again", func() bool { return hasVIP(t, p.A) })
		})
	}
}

// childOf is the pid of the only child of process pid (each thread lists
// the children it started: Go starts them from any thread).
func childOf(t *testing.T, pid int) int {
	t.Helper()
	var child int
	testkit.WaitFor(t, 5*time.Second, fmt.Sprintf("a child of pid %d", pid), func() bool {
		files, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
		var all []string
		for _, f := range files {
			data, _ := os.ReadFile(f)
			all = append(all, strings.Fields(string(data))...)
		}
		if len(all) != 1 {
			return false
		}
		_, err := fmt.Sscan(all[0], &child)
		return err == nil
	})
	return child
}
