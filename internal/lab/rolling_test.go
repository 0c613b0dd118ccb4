package lab

import (
	"context"
	"os"
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
		_, err := BuildRevision(context.Background(), repo, rev, t.TempDir(), "")
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("BuildRevision(%q) = %v, want an error saying %q", rev, err, want)
		}
	}
}

// Module requirements to build against that are not there: refused
// before anything is built, naming the directory.
func TestBuildRevisionRefusesMissingModules(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is not installed")
	}
	dir, empty := t.TempDir(), t.TempDir()
	_, err := BuildRevision(context.Background(), filepath.Join("..", ".."), "HEAD", dir, empty)
	if err == nil || !strings.Contains(err.Error(), "with the modules of "+empty) {
		t.Fatalf("BuildRevision with no go.mod in %s = %v, want an error naming it", empty, err)
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Errorf("%d files left in %s", len(left), dir)
	}
}
