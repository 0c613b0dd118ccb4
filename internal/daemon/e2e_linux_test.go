//go:build linux

package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/vigil-ha/vigil/internal/netns"
	"github.com/vigil-ha/vigil/internal/nstest"
	"github.com/vigil-ha/vigil/internal/testkit"
)

const testVIP = "192.0.2.100"

func hasVIP(t *testing.T, ns string) bool {
	return strings.Contains(nstest.IP(t, "-n", ns, "addr", "show", "dev", "a0"), " "+testVIP+"/")
}

// Bad input: one clear error line, exit status 1, nothing configured. A VIP
// already on the interface stays untouched too, because vigil refuses before
// it changes anything.
func TestBadInputLeavesNothingConfigured(t *testing.T) {
	p := nstest.NewPair(t)
	vigil := nstest.Binary(t, "vigil")
	dir := t.TempDir()
	good := []string{"run", "--vip", testVIP + "/24", "--interface", "a0", "--node-name", "n1", "--election", "etcd", "--etcd-endpoints", "http://127.0.0.1:2379"}
	with := func(flag, value string) []string {
		out := append([]string(nil), good...)
		for i := range out {
			if out[i] == flag {
				out[i+1] = value
				return out
			}
		}
		return append(out, flag, value)
	}
	conf := func(name, body string) string {
		f := filepath.Join(dir, name)
		if err := os.WriteFile(f, []byte("apiVersion: vigil.dev/v1alpha1\nkind: VigilConfiguration\n"+body), 0o600); err != nil {
			t.Fatal(err)
		}
		return f
	}
	// Announced over BGP to a router at B's address.
	bgp := func(extra ...string) []string {
		return append(append(with("--vip", testVIP+"/32"), "--announce", "bgp", "--bgp-local-as", "65001", "--bgp-peer", "192.0.2.2,65000"), extra...)
	}
	tests := []struct {
		name string
		args []string
		want string
		env  []string
	}{
		{"bgp hold time under three keepalives", bgp("--bgp-hold-time", "5s", "--bgp-keepalive", "2s"), "is less than 3 x --bgp-keepalive 2s", nil},
		{"bgp timers from --config", bgp("--config", conf("bgp.yaml", "run:\n  bgpHoldTime: 4s\n  bgpKeepalive: 2s\n")), "--bgp-hold-time 4s is less than 3 x", nil},
		{"lb listen port is the lb port", append(with("--lb-port", "7443"), "--lb-listen-port", "7443"), "--lb-listen-port 7443 is --lb-port", nil},
		{"lb listen port without lb port", append(good, "--lb-listen-port", "16445"), "--lb-listen-port needs --lb-port", nil},
		{"ecmp without bgp", append(good, "--bgp-mode", "ecmp"), "--bgp-mode ecmp needs --announce bgp", nil},
		{"ecmp with lb listen port", bgp("--bgp-mode", "ecmp", "--lb-port", "6443", "--lb-listen-port", "16445"), "--lb-listen-port needs one VIP holder", nil},
		{"a port given twice", append(good, "--lb-port", "6443", "--lb-port", "9345", "--lb-port", "9345:9000"), "port 9345 given twice", nil},
		{"a check of a port not balanced", append(good, "--lb-port", "6443", "--lb-port-check", "9345=tcp"), "port 9345 is not an --lb-port", nil},
		{"a bad further port", append(good, "--lb-port", "6443,9345:"), "want PORT or PORT:BACKENDPORT", nil},
		{"bgp bfd multiplier 0", bgp("--bgp-bfd", "--bgp-bfd-multiplier", "0"), "--bgp-bfd-multiplier 0", nil},
		{"bgp policy without bgp", append(good, "--bgp-community", "65001:100"), "need --announce bgp", nil},
		{"bgp source address not on this node", bgp("--bgp-source-address", "198.51.100.1"), "not an address of this node", nil},
		{"bgp multihop with iBGP peers only", append(with("--vip", testVIP+"/32"), "--announce", "bgp", "--bgp-local-as", "65001", "--bgp-peer", "192.0.2.2,65001", "--bgp-multihop", "2"), "eBGP peers only", nil},
		{"unknown key in --config", append(good, "--config", conf("typo.yaml", "run:\n  leaseDurration: 2s\n")), "unknown key run.leaseDurration", nil},
		{"bad value from --config", append(good, "--config", conf("renew.yaml", "run:\n  renewDeadline: 2s\n")), "must be shorter than the lease duration", nil},
		{"missing --config file", append(good, "--config", filepath.Join(dir, "nope.yaml")), "nope.yaml", nil},
		{"bad VIGIL_ variable", good, "VIGIL_LB_PORT", []string{"VIGIL_LB_PORT=x"}},
		{"unknown interface", with("--interface", "nosuch0"), "interface not found", nil},
		{"malformed vip", with("--vip", "192.0.2.300/24"), "is not an IP address", nil},
		{"two IPv4 VIPs", append(good, "--vip", "192.0.2.101/24"), "are of the same family", nil},
		{"three VIPs", append(good, "--vip", "fd00:192::100/64,fd00:192::101/64"), "given 3 times", nil},
		{"malformed second vip", append(good, "--vip", "fd00:192::zz/64"), "is not an IP address", nil},
		{"renew deadline not below lease", with("--renew-deadline", "2s"), "must be shorter than the lease duration", nil},
		{"missing cert files", append(with("--etcd-cert", filepath.Join(dir, "nope.crt")), "--etcd-key", filepath.Join(dir, "nope.key")), "no such file", nil},
		{"unknown backend", with("--election", "zookeeper"), "unknown --election backend", nil},
		{"unknown flag", append(good, "--frobnicate"), "unknown flag", nil},
		{"bad endpoint", with("--etcd-endpoints", "127.0.0.1:2379"), "must look like https://HOST:PORT", nil},
		{"lb port in use (apiserver on 0.0.0.0)", with("--lb-port", "16443"), "--bind-address", nil},
		{"a further lb port in use", with("--lb-port", "6443,16443"), "16443", nil},
		{"metrics port in use", with("--metrics-address", "127.0.0.1:16444"), "--metrics-address 127.0.0.1:16444", nil},
		{"backend port out of range", with("--backend-port", "70000"), "--backend-port 70000 is out of range", nil},
		{"malformed health path", with("--health-path", "readyz"), "must be an absolute path", nil},
		{"unknown lb policy", with("--lb-policy", "random"), "unknown balancing policy", nil},
		{"static backend without port", with("--backend", "10.0.0.1"), "must be HOST:PORT", nil},
		{"kubernetes discovery without kubeconfig", with("--discovery", "kubernetes"), "--discovery kubernetes needs --kubeconfig", nil},
		{"delete node without prune", append(good, "--prune-delete-node"), "--prune-delete-node needs --prune-after", nil},
		{"missing kubeconfig with etcd election", with("--kubeconfig", filepath.Join(dir, "nope.conf")), "--kubeconfig", nil},
	}
	// What holds the ports: kube-apiserver bound to 0.0.0.0:16443, and
	// something on the metrics port.
	for _, addr := range []string{"0.0.0.0:16443", "127.0.0.1:16444"} {
		var ln net.Listener
		if err := netns.Do(p.A, func() (err error) { ln, err = net.Listen("tcp", addr); return err }); err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var stderr bytes.Buffer
			cmd := exec.Command("ip", append([]string{"netns", "exec", p.A, vigil}, tc.args...)...)
			cmd.Env = append(os.Environ(), tc.env...)
			cmd.Stderr = &stderr
			err := cmd.Run()
			if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
				t.Fatalf("exit = %v, want status 1; stderr: %s", err, stderr.String())
			}
			msg := strings.TrimSpace(stderr.String())
			if strings.Count(msg, "\n") != 0 || !strings.Contains(msg, tc.want) {
				t.Fatalf("stderr = %q, want one line containing %q", msg, tc.want)
			}
			if hasVIP(t, p.A) {
				t.Fatal("the VIP was added despite the error")
			}
		})
	}
}

// startVigilA runs `vigil run` for node n1 on a0 in ns (the pair's A side),
// electing over the etcd of startEtcdIn, with extra flags.
func startVigilA(t *testing.T, ns string, extra ...string) *exec.Cmd {
	t.Helper()
	args := append([]string{"run", "--vip", testVIP + "/24", "--interface", "a0", "--node-name", "n1", "--etcd-endpoints", "http://127.0.0.1:2379"}, extra...)
	return startIn(t, ns, "vigil.log", nstest.Binary(t, "vigil"), args...)
}

// startIn runs a command inside ns and kills it when the test ends.
func startIn(t *testing.T, ns, logName string, bin string, args ...string) *exec.Cmd {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), logName))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns, bin}, args...)...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
		if t.Failed() {
			b, _ := os.ReadFile(f.Name())
			t.Logf("%s:\n%s", logName, b)
		}
	})
	return cmd
}

// A VIP left by a crash is removed at start, and never added while etcd is
// unreachable.
func TestStaleVIPRemovedWhileEtcdUnreachable(t *testing.T) {
	p := nstest.NewPair(t)
	nstest.IP(t, "-n", p.A, "addr", "add", testVIP+"/24", "dev", "a0")
	startIn(t, p.A, "vigil.log", nstest.Binary(t, "vigil"), "run", "--vip", testVIP+"/24", "--interface", "a0",
		"--node-name", "n1", "--etcd-endpoints", "http://127.0.0.1:1")
	testkit.WaitFor(t, 10*time.Second, "the stale VIP to go", func() bool { return !hasVIP(t, p.A) })
	testkit.Always(t, 2*time.Second, "without the VIP while etcd is unreachable", func() bool { return !hasVIP(t, p.A) })
}

// With a real etcd process beside it, vigil takes the VIP, a peer learns
// where it is from the gratuitous ARP, and SIGTERM removes the VIP and
// releases the lock.
func TestLeadAnnounceAndGracefulStop(t *testing.T) {
	p := nstest.NewPair(t)
	startEtcdIn(t, p.A)
	// B believes the VIP lives elsewhere.
	nstest.IP(t, "-n", p.B, "neigh", "replace", testVIP, "lladdr", "02:00:00:00:00:01", "dev", "b0", "nud", "stale")
	vigil := startVigilA(t, p.A)
	testkit.WaitFor(t, 20*time.Second, "the VIP on a0", func() bool { return hasVIP(t, p.A) })
	mac := strings.Fields(nstest.IP(t, "-n", p.A, "-br", "link", "show", "a0"))[2]
	testkit.WaitFor(t, 5*time.Second, "B to learn the VIP's MAC", func() bool {
		return strings.Contains(nstest.IP(t, "-n", p.B, "neigh", "show", testVIP), mac)
	})

	if err := vigil.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 10*time.Second, "vigil to exit", func() bool { return !alive(vigil.Process.Pid) })
	if hasVIP(t, p.A) {
		t.Fatal("VIP still on a0 after SIGTERM")
	}
	testkit.WaitFor(t, 5*time.Second, "the guard to exit", func() bool { return !guardRunning(t, p.A) })
	if h := lockHolder(t, p.A); h != "" {
		t.Fatalf("lock holder after SIGTERM = %q, want released", h)
	}
}

// lockHolder reads the holder of /vigil/leader from the etcd in ns.
func lockHolder(t *testing.T, ns string) string {
	t.Helper()
	h, err := readLockHolder(ns)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// lockHolderOK is lockHolder for polling: "?" when the lock cannot be read
// (yet).
func lockHolderOK(ns string) string {
	h, err := readLockHolder(ns)
	if err != nil {
		return "?"
	}
	return h
}

func readLockHolder(ns string) (string, error) {
	v, err := readKey(ns, "/vigil/leader")
	if err != nil {
		return "", fmt.Errorf("read lock: %w", err)
	}
	if v == nil {
		return "", errors.New("read lock: no lock record yet")
	}
	var rec struct{ Holder string }
	if err := json.Unmarshal(v, &rec); err != nil {
		return "", err
	}
	return rec.Holder, nil
}

// readKey reads key through ns's 127.0.0.1:2379: nil when there is none.
func readKey(ns, key string) ([]byte, error) {
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: []string{"127.0.0.1:2379"}, DialTimeout: 5 * time.Second,
		DialOptions: []grpc.DialOption{grpc.WithContextDialer(netns.Dialer(ns))},
	})
	if err != nil {
		return nil, err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, key)
	if err != nil || len(resp.Kvs) == 0 {
		return nil, err
	}
	return resp.Kvs[0].Value, nil
}

// reportRevision is the etcd revision of node's published member view
// (membership.DefaultReportPrefix), read through ns's 127.0.0.1:2379; 0
// when there is none (yet) or etcd cannot be read.
func reportRevision(ns, node string) int64 {
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: []string{"127.0.0.1:2379"}, DialTimeout: 5 * time.Second,
		DialOptions: []grpc.DialOption{grpc.WithContextDialer(netns.Dialer(ns))},
	})
	if err != nil {
		return 0
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, "/vigil/member-views/"+node)
	if err != nil || len(resp.Kvs) != 1 {
		return 0
	}
	return resp.Kvs[0].ModRevision
}

// waitLive waits until node's vigil is live to the others: its member
// view published and then published again (readers count a view as fresh
// once they have seen it change).
func waitLive(t *testing.T, ns, node string) {
	t.Helper()
	var first int64
	testkit.WaitFor(t, 30*time.Second, node+" to publish its member view twice", func() bool {
		rev := reportRevision(ns, node)
		if first == 0 {
			first = rev
			return false
		}
		return rev > first
	})
}

// startEtcdIn runs a one-member etcd on 127.0.0.1:2379 inside ns.
func startEtcdIn(t *testing.T, ns string) *exec.Cmd { return startEtcdOn(t, ns, "127.0.0.1") }

// startEtcdOn runs a one-member etcd on addr:2379 inside ns (and on
// 127.0.0.1), advertising addr.
func startEtcdOn(t *testing.T, ns, addr string) *exec.Cmd {
	dir := t.TempDir()
	listen := "http://127.0.0.1:2379"
	if addr != "127.0.0.1" {
		listen += ",http://" + addr + ":2379"
	}
	return startIn(t, ns, "etcd.log", nstest.Binary(t, "vigil-lab"), "etcd", "--name", "e1", "--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", listen, "--advertise-client-urls", "http://"+addr+":2379",
		"--listen-peer-urls", "http://127.0.0.1:2380", "--initial-advertise-peer-urls", "http://127.0.0.1:2380",
		"--initial-cluster", "e1=http://127.0.0.1:2380", "--log-level", "error")
}

// vigil killed outright cannot remove the VIP; the kernel must, when the
// lifetime the holder kept refreshing runs out.
func TestKilledHolderVIPExpires(t *testing.T) {
	p := nstest.NewPair(t)
	startEtcdIn(t, p.A)
	vigil := startVigilA(t, p.A, "--vip-lifetime", "2s", "--guard=false")
	testkit.WaitFor(t, 20*time.Second, "the VIP on a0", func() bool { return hasVIP(t, p.A) })
	if out := nstest.IP(t, "-n", p.A, "addr", "show", "dev", "a0"); !strings.Contains(out, "valid_lft 2sec") && !strings.Contains(out, "valid_lft 1sec") {
		t.Fatalf("VIP has no 2 s lifetime:\n%s", out)
	}
	// Several refreshes: the VIP must stay while vigil lives.
	testkit.Always(t, 3*time.Second, "the VIP on a0 while its holder lives", func() bool { return hasVIP(t, p.A) })
	killed := time.Now()
	if err := vigil.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 10*time.Second, "the kernel to drop the VIP", func() bool { return !hasVIP(t, p.A) })
	t.Logf("VIP gone %v after SIGKILL", time.Since(killed).Round(10*time.Millisecond))
}

// vigil killed outright: its guard process removes the VIP at once. With no
// address lifetime, nothing else could.
func TestGuardRemovesVIPWhenVigilIsKilled(t *testing.T) {
	p := nstest.NewPair(t)
	startEtcdIn(t, p.A)
	vigil := startVigilA(t, p.A, "--vip-lifetime", "0")
	testkit.WaitFor(t, 20*time.Second, "the VIP on a0", func() bool { return hasVIP(t, p.A) })
	if err := vigil.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 5*time.Second, "the guard to remove the VIP", func() bool { return !hasVIP(t, p.A) })
	testkit.WaitFor(t, 5*time.Second, "the guard to exit", func() bool { return !guardRunning(t, p.A) })
}

// guardRunning reports whether a `vigil guard` process runs in ns.
func guardRunning(t *testing.T, ns string) bool {
	for _, pid := range strings.Fields(nstest.IP(t, "netns", "pids", ns)) {
		b, _ := os.ReadFile("/proc/" + pid + "/cmdline")
		if strings.Contains(string(b), "\x00guard\x00") {
			return true
		}
	}
	return false
}

func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}
