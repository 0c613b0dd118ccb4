// Package nstest gives tests throwaway network namespaces joined by a veth
// pair. Every namespace it creates is deleted when the test ends, pass or
// fail. Tests that use it skip, with a message, when not run as root
// (and fail instead when VIGIL_REQUIRE_ROOT=1, as in hack/test.sh).
package nstest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
)

var seq atomic.Int64

// RequireRootEnv, set to 1, turns every skip of Unavailable into a
// failure. hack/test.sh sets it: it runs as root with every tool installed,
// so a root-only test that skips there is a test that silently stopped
// running.
const RequireRootEnv = "VIGIL_REQUIRE_ROOT"

// Unavailable skips the test because what it needs (root, a tool, a clean
// host) is missing, or fails it when RequireRootEnv is set.
func Unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv(RequireRootEnv) == "1" {
		t.Fatalf("%s; %s=1 says this test must run here", msg, RequireRootEnv)
	}
	t.Skip(msg)
}

// RequireRoot skips the test unless it runs as root with iproute2 (fails
// it instead under RequireRootEnv).
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		Unavailable(t, "needs root to create network namespaces (CI runs tests as root)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		Unavailable(t, "needs the ip command (iproute2)")
	}
}

// IP runs iproute2 and fails the test on error.
func IP(t testing.TB, args ...string) string {
	t.Helper()
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// Pair is two namespaces, A and B, joined by a veth pair: A's end is "a0"
// with 192.0.2.1/24 and fd00:192::1/64, B's end is "b0" with 192.0.2.2/24
// and fd00:192::2/64 (documentation and unique-local ranges, only ever
// inside these namespaces). Duplicate address detection is off so IPv6 works
// at once.
type Pair struct {
	A, B string
}

// NewPair creates the namespaces and deletes them when the test ends.
func NewPair(t testing.TB) *Pair {
	t.Helper()
	RequireRoot(t)
	n := seq.Add(1)
	p := &Pair{A: fmt.Sprintf("vtest-%d-%da", os.Getpid(), n), B: fmt.Sprintf("vtest-%d-%db", os.Getpid(), n)}
	for _, ns := range []string{p.A, p.B} {
		IP(t, "netns", "add", ns)
		t.Cleanup(func() {
			_ = exec.Command("ip", "netns", "del", ns).Run() // deleting the namespace deletes its veth end too
		})
		IP(t, "-n", ns, "link", "set", "lo", "up")
	}
	IP(t, "-n", p.A, "link", "add", "a0", "type", "veth", "peer", "name", "b0", "netns", p.B)
	// Without DAD on the veth ends, link-local addresses are usable at once.
	IP(t, "netns", "exec", p.A, "sysctl", "-qw", "net.ipv6.conf.a0.accept_dad=0")
	IP(t, "netns", "exec", p.B, "sysctl", "-qw", "net.ipv6.conf.b0.accept_dad=0")
	// Links go up before IPv6 addresses are added: addresses added to a down
	// link leave it without its link-local and multicast routes.
	for _, s := range [][]string{
		{"-n", p.A, "link", "set", "a0", "up"},
		{"-n", p.B, "link", "set", "b0", "up"},
		{"-n", p.A, "addr", "add", "192.0.2.1/24", "dev", "a0"},
		{"-n", p.A, "addr", "add", "fd00:192::1/64", "dev", "a0", "nodad"},
		{"-n", p.B, "addr", "add", "192.0.2.2/24", "dev", "b0"},
		{"-n", p.B, "addr", "add", "fd00:192::2/64", "dev", "b0", "nodad"},
	} {
		IP(t, s...)
	}
	return p
}

// Binary returns the path of one of this module's commands ("vigil" or
// "vigil-lab"): $VIGIL_BIN or $VIGIL_LAB_BIN when set (hack/test.sh builds
// them), otherwise a fresh build in a temporary directory.
func Binary(t testing.TB, name string) string {
	t.Helper()
	env := map[string]string{"vigil": "VIGIL_BIN", "vigil-lab": "VIGIL_LAB_BIN"}[name]
	if p := os.Getenv(env); p != "" {
		return p
	}
	out := filepath.Join(t.TempDir(), name)
	cmd := exec.Command("go", "build", "-o", out, "github.com/vigil-ha/vigil/cmd/"+name)
	cmd.Env = append(os.Environ(), "GOTOOLCHAIN=local")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", name, err, b)
	}
	return out
}
