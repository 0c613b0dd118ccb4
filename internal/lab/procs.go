package lab

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vigil-ha/vigil/internal/clock"
)

// Process roles on a node.
const (
	roleEtcd       = "etcd"
	roleVigil      = "vigil"
	roleResponder  = "responder"
	roleKeepalived = "keepalived"
	roleAPIServer  = "apiserver"
)

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	if pid <= 0 || syscall.Kill(pid, 0) != nil {
		return false
	}
	f, err := procStat(pid)
	return err == nil && (len(f) == 0 || f[0] != "Z")
}

// procStat returns the fields of /proc/PID/stat that follow the command
// name: the state is the first (field 3 of proc(5)), utime and stime the
// 12th and 13th, the start time the 20th. The command name is in
// parentheses and may hold spaces, so the fields are counted from its
// closing parenthesis.
func procStat(pid int) ([]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return nil, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	return strings.Fields(string(b[i+1:])), nil
}

// killPID sends SIGKILL; a process that is already gone is fine.
func killPID(pid int) {
	if pid > 0 {
		_ = syscall.Kill(pid, syscall.SIGKILL) // ESRCH: already gone
	}
}

// waitGone waits up to d for pid to exit.
func waitGone(ctx context.Context, pid int, d time.Duration) error {
	deadline := time.Now().Add(d)
	for alive(pid) {
		if time.Now().After(deadline) {
			return fmt.Errorf("process %d still running after %v", pid, d)
		}
		if !clock.Sleep(ctx, 5*time.Millisecond) {
			return ctx.Err()
		}
	}
	return nil
}

// waitNSEmpty waits briefly for the processes of ns to be gone.
func waitNSEmpty(ctx context.Context, ns string) {
	for i := 0; i < 200; i++ {
		pids, err := nsPIDs(ctx, ns)
		if err != nil || len(pids) == 0 {
			return
		}
		clock.Sleep(ctx, 10*time.Millisecond)
	}
}

// start runs bin with args inside node's namespace, detached into its own
// session so that it outlives this command, with output appended to
// dir/<node>/<role>.log. It records the pid in the node.
func (l *Lab) start(n *Node, role, bin string, args ...string) error {
	return l.startArgv(n, role, append([]string{"ip", "netns", "exec", nodeNS(n.Name), bin}, args...))
}

// startArgv is start with the whole command line given: argv must itself
// enter the node's namespaces.
func (l *Lab) startArgv(n *Node, role string, argv []string) error {
	logPath := filepath.Join(l.nodeDir(n), role+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("open %s: %w", logPath, err)
	}
	defer f.Close()
	fmt.Fprintf(f, "--- %s start %s\n", time.Now().Format(time.RFC3339Nano), strings.Join(argv, " "))
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s on %s: %w", role, n.Name, err)
	}
	// Reap it if it dies while we run; after we exit, init does.
	go func() { _ = cmd.Wait() }() // its exit status is in its log
	n.PIDs[role] = cmd.Process.Pid
	return l.save()
}

// signal sends sig to a role's process and, for SIGKILL or when wait is set,
// waits for it to exit.
func (l *Lab) signal(ctx context.Context, n *Node, role string, sig syscall.Signal, wait time.Duration) error {
	pid := n.PIDs[role]
	if pid == 0 || !alive(pid) {
		return fmt.Errorf("%s on %s is not running", role, n.Name)
	}
	if err := syscall.Kill(pid, sig); err != nil {
		return fmt.Errorf("signal %s on %s: %w", role, n.Name, err)
	}
	if wait > 0 {
		return waitGone(ctx, pid, wait)
	}
	return nil
}

// killNode SIGKILLs every process in the node's namespace.
func (l *Lab) killNode(ctx context.Context, n *Node) error {
	pids, err := nsPIDs(ctx, nodeNS(n.Name))
	if err != nil {
		return err
	}
	for _, p := range pids {
		killPID(p)
	}
	var errs []error
	for _, p := range pids {
		errs = append(errs, waitGone(ctx, p, 5*time.Second))
	}
	return errors.Join(errs...)
}

// killComm SIGKILLs every process of the node's namespace whose command name
// is comm, and waits for them to exit.
func (l *Lab) killComm(ctx context.Context, n *Node, comm string) error {
	pids, err := nsPIDs(ctx, nodeNS(n.Name))
	if err != nil {
		return err
	}
	var killed []int
	for _, p := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", p))
		if err == nil && strings.TrimSpace(string(b)) == comm {
			killPID(p)
			killed = append(killed, p)
		}
	}
	if len(killed) == 0 {
		return fmt.Errorf("no %s process on %s", comm, n.Name)
	}
	var errs []error
	for _, p := range killed {
		errs = append(errs, waitGone(ctx, p, 5*time.Second))
	}
	return errors.Join(errs...)
}

func (l *Lab) nodeDir(n *Node) string { return filepath.Join(l.dir, n.Name) }

func (l *Lab) statePath() string { return filepath.Join(l.dir, "state.json") }

// saveMu orders the writes of the state file: the recovery drill makes
// its new machines beside other work, and each records its processes.
var saveMu sync.Mutex

func (l *Lab) save() error {
	saveMu.Lock()
	defer saveMu.Unlock()
	b, err := json.MarshalIndent(l.st, "", "  ")
	if err != nil {
		return err
	}
	tmp := l.statePath() + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return fmt.Errorf("save lab state: %w", err)
	}
	return os.Rename(tmp, l.statePath())
}

func (l *Lab) load() error {
	b, err := os.ReadFile(l.statePath())
	if errors.Is(err, os.ErrNotExist) {
		return ErrNotUp
	}
	if err != nil {
		return fmt.Errorf("read lab state: %w", err)
	}
	if err := json.Unmarshal(b, &l.st); err != nil {
		return fmt.Errorf("decode lab state %s: %w", l.statePath(), err)
	}
	return nil
}

func itoa(i int) string { return strconv.Itoa(i) }
