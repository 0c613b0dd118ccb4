package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vigil-ha/vigil/internal/etcdtest"
	"github.com/vigil-ha/vigil/internal/kubetest"
	"github.com/vigil-ha/vigil/internal/membership"
	"github.com/vigil-ha/vigil/internal/nstest"
	"github.com/vigil-ha/vigil/internal/testkit"
)

// runVigil runs the vigil binary and returns its stdout, stderr and exit
// status.
func runVigil(t *testing.T, vigil string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(vigil, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), errb.String(), code
}

// TestMembersCLI runs the vigil binary against a real 3-member etcd: list
// works in every format, and every bad input exits 1 with one clear line
// and leaves the membership as it was.
func TestMembersCLI(t *testing.T) {
	vigil := nstest.Binary(t, "vigil")
	c := etcdtest.StartDistinct(t, 3)
	eps := strings.Join(c.Endpoints, ",")
	run := func(args ...string) (string, string, int) {
		full := []string{"members", "--etcd-endpoints", eps}
		if slices.Contains(args, "--etcd-endpoints") {
			full = full[:1] // the case names its own
		}
		return runVigil(t, vigil, append(full, args...)...)
	}
	members := func() []string {
		out, stderr, code := run("list", "-o", "json")
		if code != 0 {
			t.Fatalf("list: %s", stderr)
		}
		var ms []struct{ Name string }
		if err := json.Unmarshal([]byte(out), &ms); err != nil {
			t.Fatalf("list -o json: %v\n%s", err, out)
		}
		var names []string
		for _, m := range ms {
			names = append(names, m.Name)
		}
		return names
	}
	want := []string{"m1", "m2", "m3"}
	if got := members(); !slices.Equal(got, want) {
		t.Fatalf("members = %v", got)
	}
	out, _, code := run("list")
	if code != 0 || !strings.Contains(out, "SEEN BY VIGIL") || strings.Count(out, "\n") != 4 {
		t.Fatalf("table:\n%s", out)
	}
	if out, _, code := run("list", "-o", "yaml"); code != 0 || !strings.Contains(out, "name: m2") {
		t.Fatalf("yaml:\n%s", out)
	}

	c.WaitReconfigurable()
	dir := t.TempDir()
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"unknown member", []string{"remove", "m9"}, "neither the name nor"},
		{"healthy member without --force", []string{"remove", "m2"}, "pass --force"},
		{"malformed peer URL", []string{"replace", "m3", "--with", "m4=10.0.0.14:2380"}, "must look like https://HOST:2380"},
		{"missing NAME=", []string{"replace", "m3", "--with", "http://10.0.0.14:2380"}, "must be NAME=PEER_URL"},
		{"no --with", []string{"replace", "m3"}, `required flag(s) "with" not set`},
		{"unreachable etcd", []string{"--etcd-endpoints", "http://127.0.0.1:1", "remove", "m3"}, "is etcd reachable"},
		{"TLS files missing", []string{"--etcd-cacert", filepath.Join(dir, "ca.crt"), "list"}, "no such file"},
		{"cert without key", []string{"--etcd-cert", filepath.Join(dir, "c.crt"), "list"}, "go together"},
		{"bad output format", []string{"list", "-o", "xml"}, "use table, json or yaml"},
		{"negative min-down", []string{"prune", "--min-down", "-1s"}, "must not be negative"},
		{"bad endpoint", []string{"--etcd-endpoints", "127.0.0.1:2379", "list"}, "must look like https://HOST:PORT"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, stderr, code := run(tc.args...)
			msg := strings.TrimSpace(stderr)
			if code != 1 || strings.Count(msg, "\n") != 0 || !strings.Contains(msg, tc.want) {
				t.Fatalf("exit %d, stderr %q; want exit 1 and one line containing %q", code, msg, tc.want)
			}
			if got := members(); !slices.Equal(got, want) {
				t.Fatalf("membership changed: %v", got)
			}
		})
	}

	// prune with nothing dead: says so, exits 0, changes nothing.
	out, stderr, code := run("prune", "--min-down", "0s")
	if code != 0 || !strings.Contains(out, "nothing to prune") {
		t.Fatalf("prune: exit %d\n%s%s", code, out, stderr)
	}
}

// TestMembersDeleteNode runs remove and prune with --delete-node against a
// real etcd and a real kube-apiserver: refusals change nothing; a dead
// member's Node goes with it, a Ready Node stays.
func TestMembersDeleteNode(t *testing.T) {
	vigil := nstest.Binary(t, "vigil")
	c := etcdtest.StartDistinct(t, 3)
	s := kubetest.Start(t, etcdtest.Start(t, 1).Endpoints[0])
	admin := s.Client(t, kubetest.AdminToken)
	adminKC, nobodyKC := s.Kubeconfig(t, kubetest.AdminToken), s.Kubeconfig(t, kubetest.NobodyToken)
	eps := strings.Join(c.Endpoints, ",")
	run := func(args ...string) (string, string, int) {
		return runVigil(t, vigil, append([]string{"members", "--etcd-endpoints", eps}, args...)...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for name, ready := range map[string]corev1.ConditionStatus{"m1": corev1.ConditionTrue, "m2": corev1.ConditionTrue, "m3": corev1.ConditionUnknown} {
		n, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: ready}}
		if _, err := admin.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	nodeExists := func(name string) bool {
		_, err := admin.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		return err == nil
	}
	// preflight --for-join looks for a Ready Node of that name.
	nodeCheck := func(name string) membership.Finding {
		t.Helper()
		out, stderr, _ := run("preflight", "-o", "json", "--for-join", name, "--kubeconfig", adminKC)
		var p struct{ Findings []membership.Finding }
		if err := json.Unmarshal([]byte(out), &p); err != nil {
			t.Fatalf("preflight: %v\n%s%s", err, out, stderr)
		}
		for _, f := range p.Findings {
			if f.Check == "no Ready Node named "+name {
				return f
			}
		}
		t.Fatalf("preflight did not check the Node: %s", out)
		return membership.Finding{}
	}
	if f := nodeCheck("m1"); f.OK || f.Skip || len(f.Fix) != 1 || !strings.Contains(f.Fix[0], "kubectl delete node m1") {
		t.Fatalf("preflight --for-join m1 (Ready Node): %+v", f)
	}
	if f := nodeCheck("m3"); !f.OK || !strings.Contains(f.Detail, "not Ready") {
		t.Fatalf("preflight --for-join m3 (NotReady Node): %+v", f)
	}
	if f := nodeCheck("m9"); !f.OK || !strings.Contains(f.Detail, "no Node has this name") {
		t.Fatalf("preflight --for-join m9 (no Node): %+v", f)
	}

	// What vigil run does on m1 (and later m2): observe the members and
	// publish its view.
	observe := func(member string) {
		cl, err := membership.New(membership.Config{Endpoints: c.Endpoints}, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		octx, stop := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			membership.NewObserver(cl, membership.ObserverConfig{Node: member, Member: member}, slog.New(slog.DiscardHandler)).Run(octx)
		}()
		t.Cleanup(func() { stop(); <-done; cl.Close() })
	}
	observe("m1")
	c.WaitReconfigurable()
	c.Kill(2)

	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no kubeconfig", []string{"remove", "m3", "--delete-node"}, "--delete-node needs --kubeconfig"},
		{"kubeconfig without delete-node", []string{"prune", "--kubeconfig", adminKC}, "only used with --delete-node"},
		{"no RBAC", []string{"prune", "--min-down", "0s", "--delete-node", "--kubeconfig", nobodyKC}, "not allowed to delete nodes"},
		{"unreadable kubeconfig", []string{"remove", "m3", "--delete-node", "--kubeconfig", filepath.Join(t.TempDir(), "nope")}, "--kubeconfig"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, stderr, code := run(tc.args...)
			msg := strings.TrimSpace(stderr)
			if code != 1 || strings.Count(msg, "\n") != 0 || !strings.Contains(msg, tc.want) {
				t.Fatalf("exit %d, stderr %q; want exit 1 and one line containing %q", code, msg, tc.want)
			}
			if out, _, _ := run("list"); !strings.Contains(out, "m3") || !nodeExists("m3") {
				t.Fatalf("something changed after a refusal:\n%s", out)
			}
		})
	}

	// Only m1's vigil sees m3 down: one voter of the two needed.
	out, stderr, code := run("prune", "--min-down", "0s", "--delete-node", "--kubeconfig", adminKC)
	if code != 1 || !strings.Contains(out, "one-sided") || !strings.Contains(stderr, "--force") || !nodeExists("m3") {
		t.Fatalf("prune on one vigil's view: exit %d\n%s%s", code, out, stderr)
	}
	if out, _, _ := run("list"); !strings.Contains(out, "m1 down") {
		t.Fatalf("list does not show m1's view of m3:\n%s", out)
	}
	observe("m2")
	// Ask once m2's vigil has published its view of m3: prune itself
	// waits only a few seconds for views to renew, and a loaded machine
	// may take longer to start m2's first rounds.
	testkit.WaitNilEvery(t, 30*time.Second, 250*time.Millisecond, "m2's view of m3", func() error {
		if out, _, _ := run("list"); !strings.Contains(out, "m2 down") {
			return fmt.Errorf("vigil members list says:\n%s", out)
		}
		return nil
	})
	out, stderr, code = run("prune", "--min-down", "0s", "--delete-node", "--kubeconfig", adminKC)
	if code != 0 || !strings.Contains(out, "deleted Node m3") {
		t.Fatalf("prune --delete-node: exit %d\n%s%s", code, out, stderr)
	}
	if nodeExists("m3") {
		t.Fatal("Node m3 still exists")
	}
	if out, _, _ := run("list"); strings.Contains(out, "m3") {
		t.Fatalf("member m3 still listed:\n%s", out)
	}
	// A healthy member removed by force: its Ready Node stays.
	out, stderr, code = run("remove", "m2", "--force", "--delete-node", "--kubeconfig", adminKC)
	if code != 0 || !strings.Contains(out, "Node m2 left in place") || !nodeExists("m2") {
		t.Fatalf("remove --force --delete-node of a Ready node: exit %d\n%s%s", code, out, stderr)
	}
}
