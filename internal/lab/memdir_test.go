package lab

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// memDir is a new directory in memory (/dev/shm, when it is a tmpfs) for a
// lab's state, its etcd members' data and its logs, removed when the test
// ends; else t.TempDir(). On disk, the members' fsyncs wait behind
// whatever else the machine writes: hack/test.sh builds kube-apiserver and
// the -race packages beside the lab, and a cold run once stalled a
// holder's etcd write past its 500 ms renew deadline that way, ending a
// drill that was about something else. The drills measure vigil, not the
// disk. (vigil-lab's own default, /run/vigil-lab, is a tmpfs on most
// machines.)
//
// A test binary that is killed (a stopped run, the watchdog's panic) runs
// no cleanup, and its directory, up to 1.6 GB, would hold that much memory
// until the machine restarts: the name says which process made it, and
// the first memDir of every test binary removes the directories of
// processes that are gone (sweepMemDirs).
func memDir(t *testing.T) string {
	t.Helper()
	var st syscall.Statfs_t
	if err := syscall.Statfs(memDirRoot, &st); err != nil || st.Type != tmpfsMagic {
		return t.TempDir()
	}
	sweepOnce.Do(func() {
		for _, name := range sweepMemDirs(memDirRoot) {
			t.Logf("removed %s, left by a test process that is gone", filepath.Join(memDirRoot, name))
		}
		_ = syscall.Statfs(memDirRoot, &st)
	})
	if st.Bavail*uint64(st.Bsize) < memDirMin {
		return t.TempDir() // a container's 64 MiB /dev/shm would fill
	}
	self, err := procTag(os.Getpid())
	if err != nil {
		return t.TempDir()
	}
	dir, err := os.MkdirTemp(memDirRoot, memDirPrefix+self+"-")
	if err != nil {
		return t.TempDir()
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

const (
	memDirRoot = "/dev/shm"
	// memDirPrefix, then procTag of the process, a dash and a random
	// suffix.
	memDirPrefix = "vigil-lab-test-p"
	// tmpfsMagic is TMPFS_MAGIC, statfs(2)'s f_type of a tmpfs.
	tmpfsMagic = 0x01021994
	// memDirMin is the free space memDir asks of /dev/shm: the largest
	// lab (TestDrills after scale and replace) used 1.6 GB there.
	memDirMin = 4 << 30
)

var sweepOnce sync.Once

// procTag names a running process: its PID and its start time (in clock
// ticks since boot, /proc/PID/stat's 22nd field), so that a PID used again
// by another process does not pass for the one that made a directory.
func procTag(pid int) (string, error) {
	f, err := procStat(pid)
	if err != nil {
		return "", err
	}
	if len(f) < 20 {
		return "", fmt.Errorf("/proc/%d/stat: %d fields after the command name, want 20 or more", pid, len(f))
	}
	return fmt.Sprintf("%d.%s", pid, f[19]), nil
}

// sweepMemDirs removes the directories in root that memDir made for a
// process that is no longer running, and returns their names. Names it
// cannot read, another process's that still runs, and anything else are
// left alone.
func sweepMemDirs(root string) []string {
	ents, err := os.ReadDir(root)
	if err != nil {
		return nil
	}
	var removed []string
	for _, e := range ents {
		rest, ok := strings.CutPrefix(e.Name(), memDirPrefix)
		if !ok || !e.IsDir() {
			continue
		}
		tag, _, ok := strings.Cut(rest, "-")
		pidText, _, ok2 := strings.Cut(tag, ".")
		pid, err := strconv.Atoi(pidText)
		if !ok || !ok2 || err != nil || pid <= 0 {
			continue
		}
		if now, err := procTag(pid); err == nil && now == tag {
			continue // still running
		} else if err != nil && !os.IsNotExist(err) {
			continue // cannot tell
		}
		if os.RemoveAll(filepath.Join(root, e.Name())) == nil {
			removed = append(removed, e.Name())
		}
	}
	return removed
}

func TestSweepMemDirsRemovesOnlyWhatGoneProcessesLeft(t *testing.T) {
	root := t.TempDir()
	self, err := procTag(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	// A process that has ended: its PID, its start time while it ran.
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	gone, err := procTag(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	selfPID, selfStart, _ := strings.Cut(self, ".")
	dirs := map[string]bool{ // name: kept
		memDirPrefix + self + "-1":               true,  // this process
		memDirPrefix + gone + "-2":               false, // ended
		memDirPrefix + selfPID + ".1" + "-3":     false, // this PID, another start: PID reused
		memDirPrefix + selfPID + "." + selfStart: true,  // no random suffix: not memDir's
		"vigil-lab-test-1526449690":              true,  // the old names, without a process
		"something-else":                         true,
	}
	for name := range dirs {
		if err := os.MkdirAll(filepath.Join(root, name, "n1"), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	removed := sweepMemDirs(root)
	for name, kept := range dirs {
		_, err := os.Stat(filepath.Join(root, name))
		if kept && err != nil {
			t.Errorf("%s: removed, want kept (%v)", name, err)
		}
		if !kept && !os.IsNotExist(err) {
			t.Errorf("%s: kept, want removed", name)
		}
	}
	if len(removed) != 2 {
		t.Errorf("sweepMemDirs said it removed %q, want the 2 directories of gone processes", removed)
	}
}
