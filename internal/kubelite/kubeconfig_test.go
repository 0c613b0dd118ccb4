package kubelite

import (
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vigil-ha/vigil/internal/kubetest"
)

// The kubeconfigs kubeadm writes (kubelet.conf: files beside it; admin.conf:
// data inline) load; what needs client-go is refused with a reason.
func TestFromKubeconfig(t *testing.T) {
	caFile, certFile, keyFile := kubetest.ServingCert(t, "127.0.0.1")
	dir := t.TempDir()
	for _, f := range []string{caFile, certFile, keyFile} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(f)), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	data := func(f string) string {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		return base64.StdEncoding.EncodeToString(b)
	}
	write := func(user, cluster string) string {
		p := filepath.Join(dir, "kubeconfig")
		cfg := "apiVersion: v1\nkind: Config\ncurrent-context: c\ncontexts:\n- name: c\n  context: {cluster: k, user: u}\n" +
			"clusters:\n- name: k\n  cluster:\n" + cluster + "users:\n- name: u\n  user:\n" + user
		if err := os.WriteFile(p, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	files := "    client-certificate: " + filepath.Base(certFile) + "\n    client-key: " + filepath.Base(keyFile) + "\n"
	inline := "    client-certificate-data: " + data(certFile) + "\n    client-key-data: " + data(keyFile) + "\n"
	server := "    server: https://10.0.0.1:6443\n"
	for _, tc := range []struct {
		name, user, cluster, err string
	}{
		{"kubelet.conf: relative files", files, server + "    certificate-authority: " + filepath.Base(caFile) + "\n", ""},
		{"admin.conf: inline data", inline, server + "    certificate-authority-data: " + data(caFile) + "\n", ""},
		{"token, no CA (system roots)", "    token: abc\n", server, ""},
		{"exec plugin", "    exec: {command: aws, apiVersion: client.authentication.k8s.io/v1}\n", server, "not supported by the agent"},
		{"http server", "    token: abc\n", "    server: http://10.0.0.1:8080\n", "want https://"},
		{"missing CA file", "    token: abc\n", server + "    certificate-authority: nope.crt\n", "nope.crt"},
		{"missing key", "    client-certificate: " + filepath.Base(certFile) + "\n", server, "client certificate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := FromKubeconfig(write(tc.user, tc.cluster))
			switch {
			case tc.err == "" && err != nil:
				t.Fatal(err)
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Fatalf("error %v, want one that says %q", err, tc.err)
			case tc.err == "" && c.Server != "https://10.0.0.1:6443":
				t.Fatalf("server %q", c.Server)
			}
		})
	}
	if _, err := FromKubeconfig(filepath.Join(dir, "missing")); err == nil || !strings.Contains(err.Error(), "`kubeconfig`") {
		t.Fatalf("a missing kubeconfig: %v", err)
	}
}
