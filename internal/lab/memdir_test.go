package lab

import (
	"os"
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
func memDir(t *testing.T) string {
	t.Helper()
	var st syscall.Statfs_t
	if err := syscall.Statfs("/dev/shm", &st); err != nil || st.Type != tmpfsMagic || st.Bavail*uint64(st.Bsize) < memDirMin {
		return t.TempDir() // a container's 64 MiB /dev/shm would fill
	}
	dir, err := os.MkdirTemp("/dev/shm", "vigil-lab-test-")
	if err != nil {
		return t.TempDir()
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

const (
	// tmpfsMagic is TMPFS_MAGIC, statfs(2)'s f_type of a tmpfs.
	tmpfsMagic = 0x01021994
	// memDirMin is the free space memDir asks of /dev/shm: the largest
	// lab (TestDrills after scale and replace) used 1.1 GB there.
	memDirMin = 4 << 30
)
