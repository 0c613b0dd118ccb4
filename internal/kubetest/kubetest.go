// Package kubetest runs a real kube-apiserver (built by
// hack/build-kube-apiserver.sh into bin/) on loopback for tests, against an
// etcd the test provides. Authentication is a static token file with two
// users: an administrator (group system:masters) and "nobody", who has no
// RBAC grants at all, for the "missing RBAC" cases.
package kubetest

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/vigil-ha/vigil/internal/netns"
	"github.com/vigil-ha/vigil/internal/sakey"
	"github.com/vigil-ha/vigil/internal/testaddr"
)

// Tokens of the users: admin (system:masters), nobody (no rights), and
// the users vigil's RBAC binds (vigil manifest rbac): vigil and
// vigil-agent, who have the rights of those bindings once applied.
const (
	AdminToken  = "vigil-test-admin-token"
	NobodyToken = "vigil-test-nobody-token"
	VigilToken  = "vigil-test-vigil-token"
	AgentToken  = "vigil-test-vigil-agent-token"
)

// RequireEnv makes a missing kube-apiserver binary a test failure instead of
// a skip; hack/test.sh sets it, having built the binary.
const RequireEnv = "VIGIL_REQUIRE_KUBE_APISERVER"

// Binary returns the kube-apiserver to run: $KUBE_APISERVER, else bin/
// at the repository root. A test without it skips, or fails under
// RequireEnv.
func Binary(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("KUBE_APISERVER"); p != "" {
		return p
	}
	_, file, _, _ := runtime.Caller(0)
	p := filepath.Join(filepath.Dir(file), "..", "..", "bin", "kube-apiserver")
	if _, err := os.Stat(p); err != nil {
		if os.Getenv(RequireEnv) != "" {
			t.Fatalf("kube-apiserver not found at %s (%s is set): run hack/build-kube-apiserver.sh", p, RequireEnv)
		}
		t.Skipf("kube-apiserver not built: run hack/build-kube-apiserver.sh (or set KUBE_APISERVER)")
	}
	return p
}

// Server is a running kube-apiserver.
type Server struct {
	URL    string // https://ADVERTISE-ADDRESS:PORT
	CAFile string // the self-signed serving certificate, as a CA
	Dir    string
	// AuditLog is the audit log (one JSON event per line) with
	// Options.Audit; "" without.
	AuditLog string
	netns    string
	cmd      *exec.Cmd
	done     chan struct{}
	t        testing.TB
}

// Options say where and how StartWith runs the server.
type Options struct {
	EtcdURL string
	// Netns, when set, is the network namespace to run in (ip netns exec);
	// the test process reaches the server through netns.Dialer.
	Netns string
	// BindAddress defaults to the test binary's own loopback address
	// (etcdtest.Loopback), or to 127.0.0.1 in Netns; AdvertiseAddress to
	// BindAddress (or to 127.0.0.1 when binding 0.0.0.0).
	BindAddress      string
	AdvertiseAddress string
	// Port defaults to one of the test binary's own (etcdtest.Port): free
	// on its loopback address, and in a fresh namespace every port is.
	Port int
	// Reconcile lets the server publish itself in the kubernetes Service's
	// EndpointSlices (--endpoint-reconciler-type=lease). It needs a
	// non-loopback AdvertiseAddress; off, nothing writes those slices.
	Reconcile bool
	// Audit logs every request's metadata to Server.AuditLog.
	Audit bool
	// CertFile and KeyFile serve TLS, verified with CAFile; all empty: a
	// self-signed certificate from --cert-dir (for the advertise address).
	CertFile, KeyFile, CAFile string
}

// Start runs a kube-apiserver on loopback against etcdURL and waits until
// it is ready. It is stopped when the test ends.
func Start(t testing.TB, etcdURL string) *Server {
	t.Helper()
	return StartWith(t, Options{EtcdURL: etcdURL})
}

// StartWith runs a kube-apiserver as opts say and waits until it is ready.
// It is stopped when the test ends.
func StartWith(t testing.TB, opts Options) *Server {
	t.Helper()
	bin := Binary(t)
	dir := t.TempDir()
	if opts.Port == 0 {
		opts.Port = testaddr.Port(t)
	}
	if opts.BindAddress == "" {
		opts.BindAddress = "127.0.0.1" // a namespace's own
		if opts.Netns == "" {
			opts.BindAddress = testaddr.Loopback(t) // this test binary's own
		}
	}
	if opts.AdvertiseAddress == "" {
		opts.AdvertiseAddress = opts.BindAddress
		if opts.BindAddress == "0.0.0.0" {
			opts.AdvertiseAddress = "127.0.0.1"
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "tokens.csv"), []byte(
		AdminToken+",admin,admin-uid,system:masters\n"+NobodyToken+",nobody,nobody-uid\n"+
			VigilToken+",vigil,vigil-uid\n"+AgentToken+",vigil-agent,vigil-agent-uid\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := sakey.Write(filepath.Join(dir, "sa.key"), filepath.Join(dir, "sa.pub")); err != nil {
		t.Fatal(err)
	}
	s := &Server{
		URL:    "https://" + net.JoinHostPort(opts.AdvertiseAddress, strconv.Itoa(opts.Port)),
		CAFile: filepath.Join(dir, "certs", "apiserver.crt"),
		Dir:    dir, netns: opts.Netns, t: t, done: make(chan struct{}),
	}
	reconciler := "none"
	if opts.Reconcile {
		reconciler = "lease"
	}
	args := []string{
		"--etcd-servers=" + opts.EtcdURL,
		fmt.Sprintf("--etcd-prefix=/registry-%d", opts.Port),
		"--bind-address=" + opts.BindAddress,
		"--advertise-address=" + opts.AdvertiseAddress,
		fmt.Sprintf("--secure-port=%d", opts.Port),
		"--cert-dir=" + filepath.Join(dir, "certs"),
		"--token-auth-file=" + filepath.Join(dir, "tokens.csv"),
		"--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file=" + filepath.Join(dir, "sa.pub"),
		"--service-account-signing-key-file=" + filepath.Join(dir, "sa.key"),
		"--service-cluster-ip-range=10.96.0.0/12",
		"--enable-priority-and-fairness=false",
		"--endpoint-reconciler-type=" + reconciler,
		"--v=0",
	}
	if opts.Audit {
		policy := filepath.Join(dir, "audit-policy.yaml")
		if err := os.WriteFile(policy, []byte("apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: Metadata\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		s.AuditLog = filepath.Join(dir, "audit.log")
		args = append(args, "--audit-policy-file="+policy, "--audit-log-path="+s.AuditLog, "--audit-log-mode=blocking")
	}
	if opts.CertFile != "" {
		args = append(args, "--tls-cert-file="+opts.CertFile, "--tls-private-key-file="+opts.KeyFile)
		s.CAFile = opts.CAFile
	}
	if opts.Netns != "" {
		s.cmd = exec.Command("ip", append([]string{"netns", "exec", opts.Netns, bin}, args...)...)
	} else {
		s.cmd = exec.Command(bin, args...)
	}
	logf, err := os.Create(filepath.Join(dir, "kube-apiserver.log"))
	if err != nil {
		t.Fatal(err)
	}
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	// ip netns exec runs the server in its own process (exec), so this
	// reaches it too.
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		t.Fatalf("start kube-apiserver: %v", err)
	}
	go func() { _ = s.cmd.Wait(); logf.Close(); close(s.done) }()
	t.Cleanup(s.Stop)
	if err := s.waitReady(90 * time.Second); err != nil {
		s.Stop()
		b, _ := os.ReadFile(filepath.Join(dir, "kube-apiserver.log"))
		t.Fatalf("kube-apiserver not ready: %v\n%s", err, tail(string(b), 3000))
	}
	return s
}

// PID is the server's process ID (for CPU and memory figures).
func (s *Server) PID() int { return s.cmd.Process.Pid }

// Stop kills the server and waits for it; safe to call twice.
func (s *Server) Stop() {
	select {
	case <-s.done:
		return
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
}

func (s *Server) waitReady(d time.Duration) error {
	tr := &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}
	if s.netns != "" {
		dial := netns.Dialer(s.netns)
		tr.DialContext = func(ctx context.Context, _, addr string) (net.Conn, error) { return dial(ctx, addr) }
	}
	hc := &http.Client{Timeout: 2 * time.Second, Transport: tr}
	defer tr.CloseIdleConnections()
	deadline := time.Now().Add(d)
	var last error
	for time.Now().Before(deadline) {
		select {
		case <-s.done:
			return fmt.Errorf("exited: %v", s.cmd.ProcessState)
		default:
		}
		req, _ := http.NewRequest(http.MethodGet, s.URL+"/readyz", nil)
		req.Header.Set("Authorization", "Bearer "+AdminToken)
		resp, err := hc.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("/readyz: HTTP %d", resp.StatusCode)
		}
		last = err
		time.Sleep(200 * time.Millisecond)
	}
	return last
}

// Config is a rest.Config for the user with token.
func (s *Server) Config(token string) *rest.Config {
	c := &rest.Config{Host: s.URL, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{CAFile: s.CAFile}}
	if s.netns != "" {
		dial := netns.Dialer(s.netns)
		c.Dial = func(ctx context.Context, _, addr string) (net.Conn, error) { return dial(ctx, addr) }
	}
	return c
}

// Client is a clientset for the user with token.
func (s *Server) Client(t testing.TB, token string) kubernetes.Interface {
	t.Helper()
	c, err := kubernetes.NewForConfig(s.Config(token))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Kubeconfig writes a kubeconfig file for the user with token and returns
// its path.
func (s *Server) Kubeconfig(t testing.TB, token string) string {
	t.Helper()
	return WriteKubeconfig(t, s.URL, s.CAFile, token)
}

// WriteKubeconfig writes a kubeconfig for server, trusting caFile, with a
// bearer token, into a temporary directory.
func WriteKubeconfig(t testing.TB, server, caFile, token string) string {
	t.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["test"] = &clientcmdapi.Cluster{Server: server, CertificateAuthority: caFile}
	cfg.AuthInfos["test"] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "test"}
	cfg.CurrentContext = "test"
	p := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, p); err != nil {
		t.Fatal(err)
	}
	return p
}

// WaitNamespace waits until the namespace exists (kube-system is created
// by the server shortly after it is ready).
func (s *Server) WaitNamespace(t testing.TB, ns string) {
	t.Helper()
	c := s.Client(t, AdminToken)
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := c.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("namespace %s: %v", ns, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}
