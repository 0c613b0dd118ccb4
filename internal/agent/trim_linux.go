package agent

import (
	"bufio"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// trimExecutable asks the kernel to drop this process's resident pages of
// its own executable (code and read-only data). A Go binary's package
// initialisers touch code and tables spread over the whole file, and the
// kernel maps file pages 64 KiB around every fault, so right after start
// most of a 60 MB binary is resident although the agent's steady work uses
// a small part of it. Once dropped, only what the agent then runs comes
// back. The pages are clean and file-backed: nothing is written, and a
// page needed again is read back from the page cache. Requires Linux 5.4
// (MADV_PAGEOUT); on older kernels it does nothing.
func trimExecutable() (released int, err error) {
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		return 0, err
	}
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// start-end perms offset dev inode path
		fields := strings.Fields(sc.Text())
		if len(fields) < 6 || fields[5] != exe || strings.Contains(fields[1], "w") {
			continue
		}
		lo, hi, ok := strings.Cut(fields[0], "-")
		if !ok {
			continue
		}
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 != nil || err2 != nil || end <= start {
			continue
		}
		// A raw madvise on the mapping's addresses (unix.Madvise wants
		// a []byte, which this range is not).
		if _, _, e := unix.Syscall(unix.SYS_MADVISE, uintptr(start), uintptr(end-start), unix.MADV_PAGEOUT); e != 0 {
			return released, e
		}
		released += int(end - start)
	}
	return released, sc.Err()
}
