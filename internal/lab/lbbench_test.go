package lab

import (
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestCheckSchedGroups(t *testing.T) {
	for _, c := range []struct {
		name   string
		groups map[string]string
		ok     bool
	}{
		{"each its own", map[string]string{"vigil": "/autogroup-1", "haproxy": "/autogroup-2", "loadgen": "/autogroup-3"}, true},
		{"no autogroups", map[string]string{"vigil": "", "haproxy": "", "loadgen": ""}, true},
		{"haproxy with the load generator", map[string]string{"vigil": "/autogroup-1", "haproxy": "/autogroup-3", "loadgen": "/autogroup-3"}, false},
		{"vigil with the load generator", map[string]string{"vigil": "/autogroup-3", "haproxy": "/autogroup-2", "loadgen": "/autogroup-3"}, false},
		{"balancers together", map[string]string{"vigil": "/autogroup-2", "haproxy": "/autogroup-2", "loadgen": "/autogroup-3"}, false},
	} {
		err := checkSchedGroups(c.groups)
		if (err == nil) != c.ok {
			t.Errorf("%s: checkSchedGroups = %v, want ok %v", c.name, err, c.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "scheduler group of their own") {
			t.Errorf("%s: unclear error %q", c.name, err)
		}
	}
}

// The bench relies on a process started in a session of its own, as
// Lab.start starts vigil and HAProxy, landing in a scheduler group apart
// from the load generator's.
func TestSchedGroupOfNewSession(t *testing.T) {
	self := schedGroup(os.Getpid())
	if self == "" {
		t.Skip("this kernel has no scheduler autogroups (/proc/self/autogroup)")
	}
	if !strings.HasPrefix(self, "/autogroup-") {
		t.Fatalf("schedGroup(self) = %q, want /autogroup-N", self)
	}
	start := func(setsid bool) string {
		cmd := exec.Command("sleep", "5")
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: setsid}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
		return schedGroup(cmd.Process.Pid)
	}
	if g := start(false); g != self {
		t.Errorf("a child in our session is in group %q, want ours, %q", g, self)
	}
	if g := start(true); g == self || g == "" {
		t.Errorf("a child in a new session is in group %q, want one apart from ours (%q)", g, self)
	}
}

// The HAProxy configuration the benchmarks share is filled in completely,
// and HAProxy itself accepts it where it is installed.
func TestHAProxyConf(t *testing.T) {
	l := &Lab{}
	for i, ip := range []string{"10.250.0.11", "10.250.0.12"} {
		l.st.Nodes = append(l.st.Nodes, &Node{Name: "n" + string(rune('1'+i)), IP: netip.MustParseAddr(ip)})
	}
	dir := t.TempDir()
	conf := l.haproxyConf(filepath.Join(dir, "haproxy.sock"))
	if strings.Contains(conf, "@") {
		t.Fatalf("a placeholder is left in:\n%s", conf)
	}
	for _, want := range []string{
		"bind " + VIP.Addr().String() + ":8443\n",
		"    server n1 10.250.0.11:7000 check port 6443\n    server n2 10.250.0.12:7000 check port 6443\n",
		"option ssl-hello-chk",
	} {
		if !strings.Contains(conf, want) {
			t.Errorf("configuration lacks %q:\n%s", want, conf)
		}
	}
	if _, err := exec.LookPath("haproxy"); err != nil {
		t.Skip("haproxy not installed: the configuration is not checked by HAProxy")
	}
	p := filepath.Join(dir, "haproxy.cfg")
	if err := os.WriteFile(p, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("haproxy", "-c", "-f", p).CombinedOutput(); err != nil {
		t.Fatalf("haproxy -c: %v\n%s", err, out)
	}
}
