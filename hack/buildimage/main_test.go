package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vigil-ha/vigil"
	"github.com/vigil-ha/vigil/internal/nstest"
	"github.com/vigil-ha/vigil/internal/testkit"
)

// TestArchiveIsReproducible: the same binaries and epoch give the same
// archive, byte for byte; another epoch gives another; bad input is
// refused with nothing written.
func TestArchiveIsReproducible(t *testing.T) {
	dir := t.TempDir()
	for _, arch := range []string{"amd64", "arm64"} {
		if err := os.WriteFile(filepath.Join(dir, arch), []byte("not really vigil for "+arch), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	bins := []string{"linux/amd64=" + filepath.Join(dir, "amd64"), "linux/arm64=" + filepath.Join(dir, "arm64")}
	extra := []string{"vigil-agent@linux/amd64=" + filepath.Join(dir, "amd64"), "vigil-agent@linux/arm64=" + filepath.Join(dir, "arm64")}
	build := func(name string, epoch int64) []byte {
		t.Helper()
		out := filepath.Join(dir, name)
		if err := run(bins, extra, out, vigil.Image(), meta{name: "vigil", version: vigil.Version, revision: "abc", created: time.Unix(epoch, 0)}); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	a, b := build("a.tar", 1764547200), build("b.tar", 1764547200)
	if !bytes.Equal(a, b) {
		t.Fatal("two builds of the same binaries at the same epoch differ")
	}
	if c := build("c.tar", 1764547201); bytes.Equal(a, c) {
		t.Fatal("another epoch gave the same archive")
	}
	for _, bad := range [][]string{nil, {"amd64=" + bins[0]}, {"windows/amd64=x"}, {"linux/amd64=" + filepath.Join(dir, "missing")}} {
		out := filepath.Join(dir, "bad.tar")
		if err := run(bad, nil, out, vigil.Image(), meta{name: "vigil", version: vigil.Version, created: time.Unix(0, 0)}); err == nil {
			t.Errorf("run(%q) succeeded", bad)
		}
		if _, err := os.Stat(out); err == nil {
			t.Errorf("run(%q) left %s behind", bad, out)
		}
	}
	for _, bad := range []string{"linux/amd64=x", "vigil@linux/amd64=x", "a/b@linux/amd64=x", "vigil-agent@linux/amd64=" + filepath.Join(dir, "missing")} {
		out := filepath.Join(dir, "bad.tar")
		if err := run(bins, []string{bad}, out, vigil.Image(), meta{name: "vigil", version: vigil.Version, created: time.Unix(0, 0)}); err == nil {
			t.Errorf("--extra %q accepted", bad)
		}
		if _, err := os.Stat(out); err == nil {
			t.Errorf("--extra %q left %s behind", bad, out)
		}
	}
}

// TestImageRunsInContainerd imports the archive hack/build-image.sh built
// (VIGIL_IMAGE_ARCHIVE) into a real containerd of its own, and runs vigil
// from it with runc: it must report this version, and the manifest it
// writes must pin the image it runs from.
func TestImageRunsInContainerd(t *testing.T) {
	archive := os.Getenv("VIGIL_IMAGE_ARCHIVE")
	if archive == "" {
		t.Skip("VIGIL_IMAGE_ARCHIVE is not set (hack/test.sh builds the image and sets it)")
	}
	nstest.RequireRoot(t)
	for _, bin := range []string{"containerd", "ctr", "runc"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Fatalf("%s is not installed (apt-get install containerd runc): %v", bin, err)
		}
	}
	archive, _ = filepath.Abs(archive)
	dir := t.TempDir()
	sock := filepath.Join(dir, "containerd.sock")
	ctx, cancel := context.WithCancel(context.Background())
	// Without the CRI plugin (it would create /etc/cni/net.d on the host);
	// the shims' sockets and runc's state go under /run/containerd, which
	// is removed afterwards if this test created it.
	cfg := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(cfg, []byte("version = 2\ndisabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat("/run/containerd"); os.IsNotExist(err) {
		t.Cleanup(func() { os.RemoveAll("/run/containerd") })
	}
	d := exec.CommandContext(ctx, "containerd", "--root", filepath.Join(dir, "root"), "--state", filepath.Join(dir, "state"), "--address", sock, "-c", cfg)
	var dlog bytes.Buffer
	d.Stdout, d.Stderr = &dlog, &dlog
	if err := d.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		_ = d.Wait()
		if t.Failed() {
			t.Logf("containerd's log:\n%s", dlog.String())
		}
	})
	ctr := func(args ...string) (string, error) {
		cctx, ccancel := context.WithTimeout(ctx, 2*time.Minute)
		defer ccancel()
		out, err := exec.CommandContext(cctx, "ctr", append([]string{"-a", sock, "-n", "vigil-test"}, args...)...).CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	testkit.WaitNilEvery(t, 30*time.Second, 100*time.Millisecond, "containerd to answer", func() error {
		_, err := ctr("version")
		return err
	})
	if out, err := ctr("images", "import", "--snapshotter", "native", archive); err != nil {
		t.Fatalf("import: %v\n%s", err, out)
	}
	ls, err := ctr("images", "ls", "-q")
	if err != nil || !strings.Contains(ls, vigil.Image()) {
		t.Fatalf("images after the import: %q, %v; want %s", ls, err, vigil.Image())
	}
	runBin := func(bin, name string, args ...string) string {
		t.Helper()
		out, err := ctr(append([]string{"run", "--rm", "--snapshotter", "native", "--net-host", vigil.Image(), name, "/usr/local/bin/" + bin}, args...)...)
		if err != nil {
			t.Fatalf("ctr run %s %s: %v\n%s", bin, strings.Join(args, " "), err, out)
		}
		return out
	}
	runVigil := func(name string, args ...string) string { t.Helper(); return runBin("vigil", name, args...) }
	// The worker's binary sits beside vigil.
	if out := runBin("vigil-agent", "agent-version", "--version"); !strings.Contains(out, vigil.Version) {
		t.Fatalf("vigil-agent --version in the image printed %q, want %s", out, vigil.Version)
	}
	if out := runVigil("version", "version"); !strings.HasPrefix(out, "vigil "+vigil.Version+" ") {
		t.Fatalf("vigil version in the image printed %q, want vigil %s", out, vigil.Version)
	}
	if out := runVigil("manifest", "manifest", "pod", "--vip", "10.0.0.100/24", "--interface", "eth0"); !strings.Contains(out, "image: "+vigil.Image()+"\n") {
		t.Fatalf("the manifest written in the image does not pin %s:\n%s", vigil.Image(), out)
	}
}
