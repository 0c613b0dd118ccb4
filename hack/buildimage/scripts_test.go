package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestScriptsRefuseBadInput: the image scripts refuse an unknown
// architecture or argument with exit status 2 and a message naming it,
// before they build or write anything. Each runs from a copy in a
// directory of its own, so nothing in the checkout can be touched.
func TestScriptsRefuseBadInput(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash")
	}
	for _, tc := range []struct {
		script string
		env    []string
		args   []string
		want   string
	}{
		{"build-image.sh", []string{"VIGIL_IMAGE_ARCHES=amd64 x86"}, nil, "unknown architecture x86"},
		{"build-image.sh", []string{"VIGIL_IMAGE_ARCHES=arm64 ppc"}, nil, "unknown architecture ppc"},
		{"build-kube-images.sh", nil, []string{"--bogus"}, "usage: hack/build-kube-images.sh [--no-vigil-image]"},
	} {
		t.Run(tc.script+" "+strings.Join(append(tc.env, tc.args...), " "), func(t *testing.T) {
			dir := t.TempDir()
			src, err := os.ReadFile(filepath.Join("..", tc.script))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.MkdirAll(filepath.Join(dir, "hack"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "hack", tc.script), src, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "VERSION"), []byte("0.0.0\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command("bash", append([]string{filepath.Join(dir, "hack", tc.script)}, tc.args...)...)
			cmd.Env = append(os.Environ(), tc.env...)
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 2 {
				t.Fatalf("exit %v, want status 2; output:\n%s", err, out)
			}
			if !strings.Contains(string(out), tc.want) {
				t.Errorf("output %q does not say %q", out, tc.want)
			}
			if _, err := os.Stat(filepath.Join(dir, "bin")); !os.IsNotExist(err) {
				t.Errorf("bin/ was created before the input was refused (stat: %v)", err)
			}
		})
	}
}
