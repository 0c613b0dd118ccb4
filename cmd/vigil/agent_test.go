package main

import (
	"bytes"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vigil-ha/vigil/internal/kubelite"
	"github.com/vigil-ha/vigil/internal/nstest"
)

// TestAgentAndManifestBadInput runs the vigil binary with bad flags: each
// case exits 1 with one line naming the problem, prints nothing on stdout,
// and leaves no listener behind.
func TestAgentAndManifestBadInput(t *testing.T) {
	vigil := nstest.Binary(t, "vigil")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	taken := ln.Addr().String()
	defer ln.Close()
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	apiAddr := free.Addr().String()
	free.Close()
	cache := t.TempDir()
	type badCase struct {
		args []string
		want string
	}
	var extra []badCase
	if _, err := os.Stat(kubelite.ServiceAccountDir); err != nil { // not inside a pod
		extra = append(extra, badCase{[]string{"agent", "--server", "https://10.0.0.100:6443", "--in-cluster"}, "is the pod's service-account token mounted?"})
	}
	agentConf := filepath.Join(cache, "agent.yaml")
	if err := os.WriteFile(agentConf, []byte("apiVersion: vigil.dev/v1alpha1\nkind: VigilConfiguration\nagent:\n  server: https://10.0.0.100:6443\n  healthIntervall: 1s\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	serverOnly := filepath.Join(cache, "server.yaml")
	if err := os.WriteFile(serverOnly, []byte("apiVersion: vigil.dev/v1alpha1\nkind: VigilConfiguration\nagent:\n  server: 10.0.0.100:6443\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range append([]badCase{
		{[]string{"agent"}, "--server is required"},
		{[]string{"agent", "--config", agentConf}, "unknown key agent.healthIntervall"},
		{[]string{"agent", "--config", serverOnly}, "must be an https URL"}, // the file's value reaches the check
		{[]string{"config", "print-defaults", "extra"}, "unknown command"},
		{[]string{"config", "print-defaults", "--section", "agnet"}, `--section "agnet": want "run", "agent"`},
		{[]string{"config", "print-env"}, `--section "": want "run" or "agent"`},
		{[]string{"manifest", "chart"}, "--out is required"},
		{[]string{"handoff", "--hold", "--release"}, "--hold and --release exclude each other"},
		{[]string{"handoff", "--force"}, "--force goes with --hold"},
		{[]string{"handoff", "--timeout", "0s"}, "--timeout 0s must be positive"},
		{[]string{"handoff", "--hold", "--to", "cp1", "--node-name", "cp1"}, "--to cp1 is the node --hold keeps out"},
		{[]string{"members", "preflight", "-o", "yaml"}, "use table or json"},
		{[]string{"manifest", "monitoring", "--rules-file", "--dashboard"}, "--rules-file and --dashboard exclude each other"},
		{[]string{"manifest", "daemonset", "--server", "https://10.0.0.100:6443", "--metrics-address", "9559"}, "--metrics-address \"9559\" must be IP:PORT"},
		{[]string{"agent", "--server", "https://10.0.0.100:6443", "--pprof", "--metrics-address", ""}, "--pprof serves on --metrics-address"},
		{[]string{"agent", "--server", "10.0.0.100:6443"}, "must be an https URL"},
		{[]string{"agent", "--server", "https://10.0.0.100:6443", "--etcd-listen", "127.0.0.1:2379"}, "needs --etcd-endpoints"},
		{[]string{"agent", "--server", "https://10.0.0.100:6443", "--cache-dir", cache, "--apiserver-listen", apiAddr,
			"--etcd-listen", taken, "--etcd-endpoints", "http://10.0.0.11:2379", "--metrics-address", ""}, "port is taken"},
		{[]string{"agent", "--server", "https://10.0.0.100:6443", "--etcd-cert", "/nonexistent.crt", "--etcd-key", "/nonexistent.key"}, "--etcd-cert"},
		{[]string{"agent", "--server", "https://10.0.0.100:6443", "--kubeconfig", "/nonexistent"}, "--kubeconfig /nonexistent"},
		{[]string{"agent", "--server", "https://10.0.0.100:6443", "--kubeconfig", "/nonexistent", "--in-cluster"}, "exclude each other"},
		{[]string{"manifest", "pod", "--vip", "10.0.0.100"}, "--interface is required"},
		{[]string{"manifest", "pod", "--vip", "10.0.0.100", "--interface", "eth0", "--kubeconfig", "vigil.conf"}, "must be an absolute path"},
		{[]string{"manifest", "pod", "--vip", "10.0.0.100", "--interface", "eth0", "--election", "kubernetes"}, "--election kubernetes needs --kubeconfig"},
		{[]string{"manifest", "pod", "--vip", "10.0.0.100", "--interface", "eth0", "--election", "consul"}, "use etcd or kubernetes"},
		{[]string{"manifest", "pod", "--vip", "10.0.0.999", "--interface", "eth0"}, "not an IP address"},
		{[]string{"manifest", "daemonset"}, "--server is required"},
		{[]string{"manifest", "pod", "--vip", "10.0.0.100", "--interface", "eth0", "--prune-after", "5s"}, "--prune-after 5s"},
		{[]string{"guard", "--listen", filepath.Join(cache, "guard.sock"), "--vip", "nonsense", "--interface", "lo"}, "not an IP address"},
		{[]string{"guard", "--listen", filepath.Join(cache, "guard.sock"), "--vip", "10.0.0.100", "--interface", "nosuch0"}, "interface not found"},
		{[]string{"run", "--vip", "10.0.0.100", "--interface", "lo", "--election", "kubernetes"}, "--kubeconfig is required"},
		{[]string{"run", "--vip", "10.0.0.100", "--interface", "lo", "--election", "kubernetes", "--kubeconfig", "/nonexistent"}, "--kubeconfig"},
		{[]string{"run", "--vip", "10.0.0.100", "--interface", "lo", "--etcd-endpoints", "http://127.0.0.1:2379", "--lb-port", "6443", "--lb-max-conns", "100", "--lb-max-conns-per-source", "200"}, "--lb-max-conns-per-source 200 is above --lb-max-conns 100"},
		{[]string{"run", "--vip", "10.0.0.100", "--interface", "lo", "--etcd-endpoints", "http://127.0.0.1:2379", "--lb-port", "6443", "--lb-idle-timeout", "-1s"}, "--lb-idle-timeout"},
		{[]string{"run", "--vip", "10.0.0.100", "--interface", "lo", "--etcd-endpoints", "http://127.0.0.1:2379", "--lb-port", "6443", "--lb-event-loops", "-2"}, "--lb-event-loops -2"},
		{[]string{"agent", "--server", "https://10.0.0.100:6443", "--lb-max-conns", "-7"}, "--lb-max-conns -7"},
		// One rule for etcd endpoints in every command (internal/validate).
		{[]string{"run", "--vip", "10.0.0.100", "--interface", "lo", "--etcd-endpoints", "https://10.0.0.11"}, `etcd endpoint "https://10.0.0.11" must look like https://HOST:PORT, such as https://10.0.0.11:2379 (no port)`},
		{[]string{"agent", "--server", "https://10.0.0.100:6443", "--etcd-endpoints", "https://10.0.0.11"}, `etcd endpoint "https://10.0.0.11" must look like https://HOST:PORT, such as https://10.0.0.11:2379 (no port)`},
		{[]string{"members", "list", "--etcd-endpoints", "https://10.0.0.11"}, `etcd endpoint "https://10.0.0.11" must look like https://HOST:PORT, such as https://10.0.0.11:2379 (no port)`},
		{[]string{"manifest", "pod", "--vip", "10.0.0.100", "--interface", "eth0", "--etcd-endpoints", "https://10.0.0.11"}, `etcd endpoint "https://10.0.0.11" must look like https://HOST:PORT, such as https://10.0.0.11:2379 (no port)`},
		{[]string{"run", "--vip", "10.0.0.100", "--interface", "lo", "--etcd-endpoints", "https://10.0.0.11:2379,http://10.0.0.12:2379"}, "etcd endpoints mix http and https"},
		{[]string{"manifest", "daemonset", "--server", "https://10.0.0.100:6443/api"}, "nothing may follow HOST:PORT"},
		{[]string{"agent", "--server", "https://10.0.0.100:6443/api"}, "nothing may follow HOST:PORT"},
	}, extra...) {
		cmd := exec.Command(vigil, tc.args...)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		ee, ok := err.(*exec.ExitError)
		if !ok || ee.ExitCode() != 1 {
			t.Errorf("vigil %s: err = %v, want exit status 1", strings.Join(tc.args, " "), err)
			continue
		}
		msg := strings.TrimSpace(errb.String())
		if !strings.Contains(msg, tc.want) || strings.Count(msg, "\n") > 0 || out.Len() != 0 {
			t.Errorf("vigil %s: stderr %q stdout %q, want one line mentioning %q", strings.Join(tc.args, " "), msg, out.String(), tc.want)
		}
		if strings.Count(msg, "invalid configuration") > 1 {
			t.Errorf("vigil %s: %q says \"invalid configuration\" more than once", strings.Join(tc.args, " "), msg)
		}
	}
	// A guard that refused to start leaves no socket behind.
	if _, err := os.Stat(filepath.Join(cache, "guard.sock")); !os.IsNotExist(err) {
		t.Errorf("a refused vigil guard left its socket (%v)", err)
	}
	// The port-conflict case opened the API server endpoint first: it
	// must be closed again.
	l, err := net.Listen("tcp", apiAddr)
	if err != nil {
		t.Fatalf("the agent left %s open after failing: %v", apiAddr, err)
	}
	l.Close()
}
