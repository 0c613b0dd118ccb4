package lab

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// --from names a commit of the repository, or the drill is refused before
// anything is built.
func TestBuildRevisionRefuses(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is not installed")
	}
	repo := filepath.Join("..", "..")
	for rev, want := range map[string]string{
		"--output=/tmp/x": "not a git revision",
		"HEAD; rm -rf /":  "not a git revision",
		"no-such-branch":  "no such commit",
		"0000000000000000000000000000000000000000": "no such commit",
	} {
		_, err := BuildRevision(context.Background(), repo, rev, t.TempDir())
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("BuildRevision(%q) = %v, want an error saying %q", rev, err, want)
		}
	}
}
