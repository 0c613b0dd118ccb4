package daemon

import (
	"bytes"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/vigil-ha/vigil/internal/nstest"
	"github.com/vigil-ha/vigil/internal/testkit"
)

// The real binaries: vigil handoff refuses while no peer runs vigil, and a
// hold that would leave no standby; then, forced, it moves the VIP from n1
// to n2 and, with --hold, keeps n1 out even when n2 stops; --release lets
// it campaign again.
func TestHandoffCommand(t *testing.T) {
	p := nstest.NewPair(t)
	startEtcdOn(t, p.A, "192.0.2.1")
	vigil := nstest.Binary(t, "vigil")
	handoff := func(args ...string) (string, int) {
		t.Helper()
		var out bytes.Buffer
		cmd := exec.Command("ip", append([]string{"netns", "exec", p.A, vigil, "handoff", "--etcd-endpoints", "http://127.0.0.1:2379", "--node-name", "n1", "--timeout", "20s"}, args...)...)
		cmd.Stdout, cmd.Stderr = &out, &out
		err := runWithin(cmd, 40*time.Second)
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return out.String(), code
	}
	startIn(t, p.A, "vigil-n1.log", vigil, "run", "--vip", testVIP+"/24", "--interface", "a0",
		"--node-name", "n1", "--etcd-endpoints", "http://127.0.0.1:2379")
	testkit.WaitFor(t, 20*time.Second, "n1 to hold the VIP", func() bool { return hasVIP(t, p.A) })

	// Alone: refused, nothing changes.
	out, code := handoff()
	if code != 1 || !strings.Contains(out, "no healthy peer") {
		t.Fatalf("handoff without a peer: exit %d\n%s", code, out)
	}
	if !hasVIP(t, p.A) || lockHolder(t, p.A) != "n1" {
		t.Fatal("a refused handoff moved the VIP")
	}

	n2 := startIn(t, p.B, "vigil-n2.log", vigil, "run", "--vip", testVIP+"/24", "--interface", "b0",
		"--node-name", "n2", "--etcd-endpoints", "http://192.0.2.1:2379", "--metrics-address", "")
	waitLive(t, p.A, "n2")

	// Holds that would leave the VIP without a standby are refused, and
	// write nothing: n2, the only standby of n1; n1, whose VIP would go to
	// n2 with nobody behind it.
	for _, args := range [][]string{{"--hold", "--node-name", "n2"}, {"--to", "n2", "--hold"}} {
		out, code = handoff(args...)
		if code != 1 || !strings.Contains(out, "leaves no standby") || !strings.Contains(out, "nothing written") {
			t.Fatalf("handoff %v: exit %d, want a refusal that says no standby is left\n%s", args, code, out)
		}
		if !hasVIP(t, p.A) || lockHolder(t, p.A) != "n1" {
			t.Fatalf("a refused hold (%v) moved the VIP", args)
		}
	}
	t.Logf("refused: %s", out)

	out, code = handoff("--to", "n2", "--hold", "--force", "--hold-for", "5m")
	t.Logf("vigil handoff --to n2 --hold --force:\n%s", out)
	if code != 0 || !strings.Contains(out, "n2 renews the lock: done in") || !strings.Contains(out, "n1 is held out of the election until") {
		t.Fatalf("handoff: exit %d", code)
	}
	if hasVIP(t, p.A) || !hasVIPOn(t, p.B, "b0") || lockHolder(t, p.A) != "n2" {
		t.Fatal("the VIP did not move to n2")
	}

	// n2 goes: n1 is held and must not take the VIP.
	_ = n2.Process.Kill()
	// Several lease durations.
	testkit.Always(t, 4*time.Second, "held n1 without the VIP", func() bool { return !hasVIP(t, p.A) })
	out, code = handoff("--release")
	if code != 0 || !strings.Contains(out, "released the hold on n1") {
		t.Fatalf("release: exit %d\n%s", code, out)
	}
	testkit.WaitFor(t, 10*time.Second, "n1 to take the VIP once released", func() bool { return hasVIP(t, p.A) })
}

func hasVIPOn(t *testing.T, ns, dev string) bool {
	return strings.Contains(nstest.IP(t, "-n", ns, "addr", "show", "dev", dev), " "+testVIP+"/")
}
