package main

import (
	"bytes"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vigil-ha/vigil/internal/etcdtest"
	"github.com/vigil-ha/vigil/internal/nstest"
)

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
		cmd := exec.Command(vigil, append(full, args...)...)
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
	if code != 0 || !strings.Contains(out, "LAST SEEN HEALTHY") || strings.Count(out, "\n") != 4 {
		t.Fatalf("table:\n%s", out)
	}
	if out, _, code := run("list", "-o", "yaml"); code != 0 || !strings.Contains(out, "name: m2") {
		t.Fatalf("yaml:\n%s", out)
	}

	time.Sleep(5500 * time.Millisecond) // etcd accepts changes only after 5 s
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
