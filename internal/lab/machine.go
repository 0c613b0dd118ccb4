package lab

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// A machine is a lab node that looks like a host of its own to a kubelet,
// containerd and kubeadm: besides the node's network namespace it has
//   - its own mount namespace, in which the paths kubeadm and the kubelet
//     use (/etc/kubernetes, /var/lib/kubelet, /var/lib/etcd, containerd's
//     directories…) are bind mounts of the node's directory under the lab;
//   - its own UTS namespace, whose hostname is the node's name: kubeadm
//     and the kubelet name the Node after it, and vigil's static pod, on
//     the host network, takes its node name from it;
//   - its own cgroup root (/vlab-<node>) in every cgroup v1 hierarchy.
//
// Both namespaces are kept by bind mounts of their /proc files under
// <node>/ns, as `ip netns` keeps network namespaces, so that commands run
// later (kubeadm join, the drills) enter the same ones.

// machineBinds are the paths a machine keeps apart from the host, and the
// directory under <node>/machine that backs each.
var machineBinds = []struct {
	target, source string
	file           bool
}{
	{"/etc/kubernetes", "etc-kubernetes", false},
	{"/var/lib/kubelet", "var-lib-kubelet", false},
	{"/var/lib/etcd", "var-lib-etcd", false},
	{"/var/log/pods", "var-log-pods", false},
	{"/var/log/containers", "var-log-containers", false},
	{"/etc/cni/net.d", "etc-cni-net.d", false},
	{"/var/lib/cni", "var-lib-cni", false},
	{"/etc/containerd", "etc-containerd", false},
	{"/var/lib/containerd", "var-lib-containerd", false},
	{"/run/containerd", "run-containerd", false},
	{"/etc/hosts", "hosts", true},
}

// hostSysctls are host-wide settings the kubelet rewrites; the lab records
// them before the first kubelet starts and puts them back on down.
var hostSysctls = []string{"vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops"}

const (
	cgroupFS        = "/sys/fs/cgroup"
	containerdSock  = "/run/containerd/containerd.sock"
	hostDirsFile    = "host-dirs"    // mount points the lab created on the host
	hostSysctlsFile = "host-sysctls" // host settings to restore on down
)

// machineCgroupRoot starts each machine's cgroup root (+ node name); it
// follows the lab instance (SetInstance).
var machineCgroupRoot = "/" + Prefix

func (l *Lab) machineDir(n *Node) string { return filepath.Join(l.nodeDir(n), "machine") }
func (l *Lab) nsDir(n *Node) string      { return filepath.Join(l.nodeDir(n), "ns") }

func cgroupRoot(n *Node) string { return machineCgroupRoot + n.Name }

// machineArgv is argv run inside node n's namespaces (mount, UTS, network),
// with bin/ first on PATH (kubeadm looks for the kubelet there).
func (l *Lab) machineArgv(n *Node, argv ...string) []string {
	return append([]string{"nsenter",
		"--mount=" + filepath.Join(l.nsDir(n), "mnt"),
		"--uts=" + filepath.Join(l.nsDir(n), "uts"),
		"--net=/run/netns/" + nodeNS(n.Name),
		"--", "env", "PATH=" + filepath.Dir(l.selfBin) + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	}, argv...)
}

// machineRun runs argv in node n and returns its combined output.
func (l *Lab) machineRun(ctx context.Context, n *Node, argv ...string) (string, error) {
	a := l.machineArgv(n, argv...)
	out, err := exec.CommandContext(ctx, a[0], a[1:]...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s on %s: %w: %s", strings.Join(argv, " "), n.Name, err, lastLines(string(out), 15))
	}
	return string(out), nil
}

// lastLines is the end of a command's output, for an error message.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// linkEtcdData makes the machine's var-lib-etcd a link to dir (created),
// which the bind mount of /var/lib/etcd follows; once.
func linkEtcdData(md, dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("lab: etcd data directory: %w", err)
	}
	if err := os.MkdirAll(md, 0o755); err != nil {
		return err
	}
	link := filepath.Join(md, "var-lib-etcd")
	if fi, err := os.Lstat(link); err == nil && fi.Mode()&os.ModeSymlink != 0 {
		return nil
	}
	if err := os.Symlink(dir, link); err != nil {
		return fmt.Errorf("lab: etcd data directory: %w", err)
	}
	return nil
}

// createMachine gives node n (whose network namespace exists) its mount
// and UTS namespaces, its bind mounts and its cgroup root.
func (l *Lab) createMachine(ctx context.Context, n *Node) error {
	md := l.machineDir(n)
	if l.etcdData != "" {
		if err := linkEtcdData(md, filepath.Join(l.etcdData, n.Name)); err != nil {
			return err
		}
	}
	for _, b := range machineBinds {
		src := filepath.Join(md, b.source)
		if b.file {
			continue
		}
		if err := os.MkdirAll(src, 0o755); err != nil {
			return err
		}
	}
	hosts := fmt.Sprintf("127.0.0.1 localhost\n::1 localhost\n%s %s\n", n.IP, n.Name)
	if err := os.WriteFile(filepath.Join(md, "hosts"), []byte(hosts), 0o644); err != nil {
		return err
	}
	if err := l.ensureHostMountPoints(); err != nil {
		return err
	}
	// The namespace files must sit on a private mount, or the bind mount
	// that keeps them would propagate (and unshare refuses).
	nd := l.nsDir(n)
	if err := os.MkdirAll(nd, 0o755); err != nil {
		return err
	}
	for _, argv := range [][]string{{"mount", "--bind", nd, nd}, {"mount", "--make-private", nd}} {
		if out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput(); err != nil {
			return fmt.Errorf("lab: %s: %w: %s", strings.Join(argv, " "), err, out)
		}
	}
	for _, f := range []string{"mnt", "uts"} {
		if err := os.WriteFile(filepath.Join(nd, f), nil, 0o644); err != nil {
			return err
		}
	}
	script := []string{"set -e", "hostname " + n.Name}
	for _, b := range machineBinds {
		script = append(script, fmt.Sprintf("mount --bind %s %s", filepath.Join(md, b.source), b.target))
	}
	cmd := exec.CommandContext(ctx, "unshare", "--mount="+filepath.Join(nd, "mnt"), "--uts="+filepath.Join(nd, "uts"),
		"--propagation", "private", "--", "sh", "-c", strings.Join(script, "\n"))
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("lab: namespaces of %s: %w: %s", n.Name, err, out)
	}
	// kubeadm's preflight wants forwarding on; it is per network namespace.
	if _, err := l.machineRun(ctx, n, "sysctl", "-qw", "net.ipv4.ip_forward=1"); err != nil {
		return err
	}
	return createCgroupRoot(cgroupRoot(n))
}

// hostMountMu orders ensureHostMountPoints: each mount point is created,
// and recorded for down, once.
var hostMountMu sync.Mutex

// ensureHostMountPoints creates the machine's mount points that the host
// lacks, and records them so that down removes them again.
func (l *Lab) ensureHostMountPoints() error {
	hostMountMu.Lock() // the recovery drill makes machines beside other work
	defer hostMountMu.Unlock()
	var created []string
	for _, b := range machineBinds {
		if _, err := os.Stat(b.target); err == nil {
			continue
		}
		// Every directory MkdirAll will create, parents first (/etc/cni
		// for /etc/cni/net.d), so that down removes them all.
		var missing []string
		for d := filepath.Dir(b.target); d != "/"; d = filepath.Dir(d) {
			if _, err := os.Stat(d); err == nil {
				break
			}
			missing = append([]string{d}, missing...)
		}
		var err error
		if b.file {
			if err = os.MkdirAll(filepath.Dir(b.target), 0o755); err == nil {
				err = os.WriteFile(b.target, nil, 0o644)
			}
		} else {
			err = os.MkdirAll(b.target, 0o755)
		}
		if err != nil {
			return fmt.Errorf("lab: mount point %s: %w", b.target, err)
		}
		created = append(append(created, missing...), b.target)
	}
	if len(created) == 0 {
		return nil
	}
	f, err := os.OpenFile(filepath.Join(l.dir, hostDirsFile), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = fmt.Fprintln(f, strings.Join(created, "\n"))
	return err
}

// createCgroupRoot makes path in every cgroup v1 hierarchy; a new cpuset
// has no CPUs or memory nodes until its parent's are copied in.
func createCgroupRoot(path string) error {
	hs, err := os.ReadDir(cgroupFS)
	if err != nil {
		return fmt.Errorf("lab: cgroups: %w", err)
	}
	for _, h := range hs {
		if !h.IsDir() || h.Name() == "unified" {
			continue
		}
		dir := filepath.Join(cgroupFS, h.Name(), path)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("lab: cgroup %s: %w", dir, err)
		}
		if h.Name() == "cpuset" {
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				b, err := os.ReadFile(filepath.Join(cgroupFS, "cpuset", f))
				if err != nil {
					return err
				}
				if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
					return fmt.Errorf("lab: cgroup %s/%s: %w", dir, f, err)
				}
			}
		}
	}
	return nil
}

// recordHostSysctls saves the host settings the kubelet changes, once.
func (l *Lab) recordHostSysctls() error {
	p := filepath.Join(l.dir, hostSysctlsFile)
	if _, err := os.Stat(p); err == nil {
		return nil
	}
	var b strings.Builder
	for _, k := range hostSysctls {
		v, err := os.ReadFile(filepath.Join("/proc/sys", k))
		if err != nil {
			return fmt.Errorf("lab: read %s: %w", k, err)
		}
		fmt.Fprintf(&b, "%s %s\n", k, strings.TrimSpace(string(v)))
	}
	return os.WriteFile(p, []byte(b.String()), 0o644)
}

// destroyMachines undoes what createMachine and the kubelets did, for every
// node, with or without the lab's state: it must run after every process in
// the lab's namespaces is gone.
func (l *Lab) destroyMachines() error {
	// The namespace files and their private parents, under the lab's
	// directory; then every machine's cgroup root.
	errs := []error{unmountUnder(l.dir), removeCgroupRoots(machineCgroupRoot + "*")}
	if b, err := os.ReadFile(filepath.Join(l.dir, hostSysctlsFile)); err == nil {
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			k, v, ok := strings.Cut(line, " ")
			if !ok {
				continue
			}
			if err := os.WriteFile(filepath.Join("/proc/sys", k), []byte(v), 0o644); err != nil {
				errs = append(errs, fmt.Errorf("restore %s: %w", k, err))
			}
		}
	}
	if b, err := os.ReadFile(filepath.Join(l.dir, hostDirsFile)); err == nil {
		paths := strings.Fields(string(b))
		slices.Sort(paths)
		for _, p := range slices.Backward(paths) {
			// Only what is still empty: a file or directory someone
			// filled in the meantime is theirs.
			if st, err := os.Stat(p); err == nil && (st.IsDir() || st.Size() == 0) {
				_ = os.Remove(p) // not empty: left alone
			}
		}
	}
	return errors.Join(errs...)
}

// unmountUnder detaches every mount at or below dir, deepest first.
func unmountUnder(dir string) error {
	mounts, err := mountsUnder(dir)
	errs := []error{err}
	for _, m := range mounts {
		if err := syscall.Unmount(m, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", m, err))
		}
	}
	return errors.Join(errs...)
}

// removeCgroupRoots removes, in every hierarchy, the cgroups matching the
// glob pattern (a path from the hierarchy's root) and their children.
func removeCgroupRoots(pattern string) error {
	hs, err := os.ReadDir(cgroupFS)
	if err != nil {
		return nil // no cgroup file system: nothing was created
	}
	var errs []error
	for _, h := range hs {
		roots, _ := filepath.Glob(filepath.Join(cgroupFS, h.Name(), pattern))
		for _, r := range roots {
			errs = append(errs, removeCgroupTree(r))
		}
	}
	return errors.Join(errs...)
}

// mountsUnder lists the mount points at or below dir, deepest first.
func mountsUnder(dir string) ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := fields[4]
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	slices.SortFunc(out, func(a, b string) int { return strings.Count(b, "/") - strings.Count(a, "/") })
	return slices.Compact(out), sc.Err()
}

// removeCgroupTree removes a cgroup directory and its children, children
// first, retrying briefly while the kernel still counts exiting tasks.
func removeCgroupTree(root string) error {
	var dirs []string
	_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	slices.SortFunc(dirs, func(a, b string) int { return strings.Count(b, "/") - strings.Count(a, "/") })
	var last error
	for _, d := range dirs {
		for i := 0; i < 50; i++ {
			last = syscall.Rmdir(d)
			if last == nil || errors.Is(last, syscall.ENOENT) {
				last = nil
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if last != nil {
			return fmt.Errorf("remove cgroup %s: %w", d, last)
		}
	}
	return nil
}
