package main

import (
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"sigs.k8s.io/yaml"
)

// helm runs a real Helm: bin/helm, which hack/build-helm.sh builds (here,
// unless it is there and current; a cold build takes minutes).
func helm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	helmOnce.Do(func() {
		out, err := exec.Command("bash", "../build-helm.sh").CombinedOutput()
		if err != nil {
			helmErr = fmt.Errorf("hack/build-helm.sh: %v\n%s", err, out)
		}
	})
	if helmErr != nil {
		t.Fatal(helmErr)
	}
	cmd := exec.Command("../../bin/helm", args...)
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+t.TempDir(), "HELM_CONFIG_HOME="+t.TempDir(), "HELM_DATA_HOME="+t.TempDir())
	out, err := cmd.CombinedOutput()
	return string(out), err
}

var (
	helmOnce sync.Once
	helmErr  error
)

// objects parses a YAML stream into its objects, keyed kind/namespace/name.
func objects(t *testing.T, stream string) map[string]map[string]any {
	t.Helper()
	out := map[string]map[string]any{}
	for _, doc := range strings.Split("\n"+stream, "\n---") {
		var obj map[string]any
		if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
			t.Fatalf("%v in:\n%s", err, doc)
		}
		if obj == nil {
			continue
		}
		md, _ := obj["metadata"].(map[string]any)
		out[fmt.Sprintf("%s/%v/%v", obj["kind"], md["namespace"], md["name"])] = obj
	}
	return out
}

// The chart, rendered by a real Helm, is what vigil manifest daemonset and
// the agent's part of vigil manifest rbac print for the same values, and
// Helm refuses the values vigil manifest refuses.
func testChart(t *testing.T, rel, v string) {
	chart := filepath.Join(rel, "vigil-agent-"+v+".tgz")
	bin := filepath.Join(rel, binaryName("vigil", v, runtime.GOARCH))
	if _, err := os.Stat(bin); err != nil {
		t.Skipf("no vigil binary for this machine in the release: %v", err)
	}
	server := "https://10.0.0.100:6443"
	if out, err := helm(t, "lint", "--strict", chart, "--set", "server="+server); err != nil {
		t.Fatalf("helm lint: %v\n%s", err, out)
	}
	rbac, err := exec.Command(bin, "manifest", "rbac").Output()
	if err != nil {
		t.Fatal(err)
	}
	agentRBAC := map[string]map[string]any{}
	for k, obj := range objects(t, string(rbac)) {
		if strings.HasSuffix(k, "/vigil-agent") {
			agentRBAC[k] = obj
		}
	}
	if len(agentRBAC) != 3 {
		t.Fatalf("vigil manifest rbac: %d objects for the agent, want its ServiceAccount, Role and RoleBinding", len(agentRBAC))
	}
	for _, c := range []struct {
		values string
		flags  []string
	}{
		{"server: " + server, []string{"--server", server}},
		{"server: https://[fd00::100]:6443\nimage: registry.example.com/vigil:v9\napiserverListen: 127.0.0.1:7443",
			[]string{"--server", "https://[fd00::100]:6443", "--image", "registry.example.com/vigil:v9", "--apiserver-listen", "127.0.0.1:7443"}},
		{"server: " + server + "\nmetrics:\n  expose: true", []string{"--server", server, "--metrics-address", "0.0.0.0:9559"}},
		{"server: " + server + "\nmetrics:\n  expose: true\n  port: 9600", []string{"--server", server, "--metrics-address", "0.0.0.0:9600"}},
		{"server: " + server + "\nmetrics:\n  port: 9600", []string{"--server", server, "--metrics-address", "127.0.0.1:9600"}},
	} {
		t.Run(strings.Join(c.flags, " "), func(t *testing.T) {
			values := filepath.Join(t.TempDir(), "values.yaml")
			if err := os.WriteFile(values, []byte(c.values+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			out, err := helm(t, "template", "vigil-agent", chart, "-f", values)
			if err != nil {
				t.Fatalf("helm template: %v\n%s", err, out)
			}
			got := objects(t, out)
			ds, err := exec.Command(bin, append([]string{"manifest", "daemonset"}, c.flags...)...).Output()
			if err != nil {
				t.Fatalf("vigil manifest daemonset: %v", err)
			}
			want := objects(t, string(ds))
			for k, obj := range agentRBAC {
				want[k] = obj
			}
			keys := slices.Sorted(maps.Keys(want))
			if len(got) != len(want) {
				t.Errorf("the chart renders %d objects, vigil manifest %d (%q)", len(got), len(want), keys)
			}
			for _, k := range keys {
				if !reflect.DeepEqual(got[k], want[k]) {
					g, _ := yaml.Marshal(got[k])
					w, _ := yaml.Marshal(want[k])
					t.Errorf("%s: the chart renders\n%s\nvigil manifest prints\n%s", k, g, w)
				}
			}
		})
	}
	for _, c := range []struct{ values, want string }{
		{"image: x", "server is required"},
		{"server: http://10.0.0.100:6443", "server"},
		{"server: " + server + "\nmetrics:\n  port: 0", "port"},
		{"server: " + server + "\napiserverListen: localhost", "apiserverListen"},
		{"server: " + server + "\nserverr: x", "serverr"},
	} {
		values := filepath.Join(t.TempDir(), "values.yaml")
		if err := os.WriteFile(values, []byte(c.values+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := helm(t, "template", "vigil-agent", chart, "-f", values); err == nil || !strings.Contains(out, c.want) {
			t.Errorf("helm template with %q = %v, %q; want a refusal naming %q", c.values, err, out, c.want)
		}
	}
}
