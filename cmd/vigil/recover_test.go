package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vigil-ha/vigil/internal/etcdtest"
	"github.com/vigil-ha/vigil/internal/nstest"
)

// TestMembersRecoverCLI runs vigil members recover against the data
// directory of a member whose two peers are lost: bad input exits 1 with
// one line; --kubeadm moves etcd's manifest away, recovers and puts it
// back; the member then starts as a one-member cluster.
func TestMembersRecoverCLI(t *testing.T) {
	vigil := nstest.Binary(t, "vigil")
	c := etcdtest.StartDistinct(t, 3)
	c.WaitLeader(10 * time.Second)
	for i := range 3 {
		c.Kill(i)
	}
	dir := c.DataDir(0)
	run := func(args ...string) (string, string, int) {
		return runVigil(t, vigil, append([]string{"members", "recover"}, args...)...)
	}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no data dir", []string{"--name", "m1"}, "--data-dir is required"},
		{"manifest without kubeadm", []string{"--data-dir", dir, "--name", "m1", "--manifest", "/tmp/x.yaml"}, "only used with --kubeadm"},
		{"wrong name", []string{"--data-dir", dir, "--name", "m7"}, `no member named "m7"`},
		{"wrong name, forced", []string{"--data-dir", dir, "--name", "m7", "--force"}, `no member named "m7"`},
		{"not etcd's", []string{"--data-dir", t.TempDir(), "--name", "m1"}, "not an etcd data directory"},
		{"kubeadm without manifest", []string{"--kubeadm", "--data-dir", dir, "--name", "m1", "--manifest", filepath.Join(t.TempDir(), "etcd.yaml"), "--etcd-cacert", "", "--etcd-cert", "", "--etcd-key", ""}, "static pod manifest"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, stderr, code := run(tc.args...)
			msg := strings.TrimSpace(stderr)
			if code != 1 || strings.Count(msg, "\n") != 0 || !strings.Contains(msg, tc.want) {
				t.Fatalf("exit %d, stderr %q; want exit 1 and one line containing %q", code, msg, tc.want)
			}
		})
	}
	out, stderr, code := run("--data-dir", dir, "--name", "m1", "--dry-run")
	if code != 0 || !strings.Contains(out, "dry run: nothing changed") || !strings.Contains(out, "raft index") {
		t.Fatalf("dry run: exit %d\n%s%s", code, out, stderr)
	}
	// --kubeadm, with a manifest of its own: moved away during the
	// recovery (here nothing runs it), back afterwards.
	manifests := filepath.Join(t.TempDir(), "manifests")
	if err := os.Mkdir(manifests, 0o755); err != nil {
		t.Fatal(err)
	}
	manifest, apiserver := filepath.Join(manifests, "etcd.yaml"), filepath.Join(manifests, "kube-apiserver.yaml")
	for _, m := range []string{manifest, apiserver} {
		if err := os.WriteFile(m, []byte("kind: Pod\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	out, stderr, code = run("--kubeadm", "--manifest", manifest, "--data-dir", dir, "--name", "m1", "--peer-url", c.PeerURL(0),
		"--etcd-cacert", "", "--etcd-cert", "", "--etcd-key", "")
	// Both stopped (the API server first) and started again (etcd first).
	order := []string{"moved " + apiserver + " to", "moved " + manifest + " to", "now a one-member cluster", "moved " + manifest + " back", "moved " + apiserver + " back"}
	at := 0
	for _, o := range order {
		i := strings.Index(out[at:], o)
		if i < 0 {
			t.Fatalf("recover --kubeadm: exit %d, %q missing or out of order\n%s%s", code, o, out, stderr)
		}
		at += i
	}
	if code != 0 {
		t.Fatalf("recover --kubeadm: exit %d\n%s%s", code, out, stderr)
	}
	for _, m := range []string{manifest, apiserver} {
		if b, err := os.ReadFile(m); err != nil || string(b) != "kind: Pod\n" {
			t.Fatalf("manifest %s after recover: %q, %v", m, b, err)
		}
	}
	backups, _ := filepath.Glob(dir + ".vigil-backup-*")
	if len(backups) != 1 {
		t.Fatalf("backups: %v", backups)
	}
	t.Cleanup(func() { _ = os.RemoveAll(backups[0]) })
	c.Restart(0)
	out, stderr, code = runVigil(t, vigil, "members", "--etcd-endpoints", c.Endpoints[0], "list")
	if code != 0 || strings.Count(strings.TrimSpace(out), "\n") != 1 || !strings.Contains(out, "m1") {
		t.Fatalf("list after recover: exit %d\n%s%s", code, out, stderr)
	}
}
