package daemon

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vigil-ha/vigil"
	"github.com/vigil-ha/vigil/internal/netns"
	"github.com/vigil-ha/vigil/internal/nstest"
	"github.com/vigil-ha/vigil/internal/testkit"
)

// getIn fetches http://127.0.0.1:9558<path> inside ns (vigil's default
// metrics address) and returns the status code and body.
func getIn(ns, path string) (int, string, error) {
	dial := netns.Dialer(ns)
	c := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) { return dial(ctx, addr) },
	}}
	resp, err := c.Get("http://127.0.0.1:9558" + path)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// The real binary's probes: /livez answers while etcd is not there yet,
// /readyz only once the lock has been read, and again not once etcd has
// been gone for a while; /metrics carries vigil_build_info.
func TestProbesAndBuildInfo(t *testing.T) {
	p := nstest.NewPair(t)
	startVigilA(t, p.A)
	code := func(path string) int {
		c, _, err := getIn(p.A, path)
		if err != nil {
			return 0
		}
		return c
	}
	testkit.WaitFor(t, 10*time.Second, "/livez to answer 200 without etcd", func() bool { return code("/livez") == 200 })
	if c, body, err := getIn(p.A, "/readyz"); err != nil || c != http.StatusServiceUnavailable || !strings.Contains(body, "not ready: the holder is unknown") {
		t.Fatalf("/readyz before etcd runs = %d %q %v, want 503 saying the lock has not been read", c, body, err)
	}
	if c := code("/healthz"); c != 200 {
		t.Fatalf("/healthz = %d, want 200 (the same as /livez)", c)
	}

	etcd := startEtcdIn(t, p.A)
	testkit.WaitFor(t, 30*time.Second, "/readyz to answer 200 once etcd runs", func() bool { return code("/readyz") == 200 })
	_, metrics, err := getIn(p.A, "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf(`vigil_build_info{goversion=%q,revision=`, vigil.BuildInfo().GoVersion)
	line := ""
	for l := range strings.Lines(metrics) {
		if strings.HasPrefix(l, "vigil_build_info{") {
			line = strings.TrimSpace(l)
		}
	}
	if !strings.HasPrefix(line, want) || !strings.Contains(line, fmt.Sprintf(`version=%q} 1`, vigil.Version)) {
		t.Fatalf("vigil_build_info = %q, want %s...,version=%q} 1", line, want, vigil.Version)
	}

	// Without etcd the view of the election goes stale: not ready, still live.
	if err := etcd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	testkit.WaitFor(t, 30*time.Second, "/readyz to answer 503 with etcd gone", func() bool { return code("/readyz") == http.StatusServiceUnavailable })
	_, body, _ := getIn(p.A, "/readyz")
	t.Logf("%v after etcd was killed, /readyz says %q", time.Since(killed).Round(time.Millisecond), strings.TrimSpace(body))
	if c := code("/livez"); c != 200 {
		t.Fatalf("/livez with etcd gone = %d, want 200: a restart cannot bring etcd back", c)
	}
}

// vigil run from a configuration file, with the node name from the
// environment: the file's settings and VIGIL_NODE_NAME reach the election.
func TestConfigFileAndEnvironment(t *testing.T) {
	p := nstest.NewPair(t)
	startEtcdIn(t, p.A)
	file := filepath.Join(t.TempDir(), "vigil.yaml")
	body := "apiVersion: vigil.dev/v1alpha1\nkind: VigilConfiguration\nrun:\n  vip: " + testVIP + "/24\n  interface: a0\n  nodeName: from-file\n  etcdEndpoints: [http://127.0.0.1:2379]\n"
	if err := os.WriteFile(file, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	startIn(t, p.A, "vigil.log", "/usr/bin/env", "VIGIL_NODE_NAME=from-env", nstest.Binary(t, "vigil"), "run", "--config", file)
	testkit.WaitFor(t, 20*time.Second, "the VIP on a0", func() bool { return hasVIP(t, p.A) })
	if h := lockHolder(t, p.A); h != "from-env" {
		t.Fatalf("lock holder = %q, want from-env (VIGIL_NODE_NAME beats the file)", h)
	}
}
