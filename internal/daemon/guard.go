package daemon

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/vigil-ha/vigil/internal/vip"
)

// The guard is a small child process (`vigil guard`) that outlives `vigil
// run` by a few milliseconds: it holds the read end of a pipe whose write end
// only `vigil run` has. When `vigil run` dies, however it dies (SIGKILL, the
// OOM killer, a panic), the kernel closes the write end, the guard reads EOF
// and removes the VIP from this node. Without it a killed holder keeps
// answering ARP for the VIP until the address lifetime runs out, while a peer
// already holds it.
//
// The guard cannot help when both processes are killed together (a whole
// container killed, a machine powered off): the lifetime covers the first,
// the power-off takes the address with the machine.

// GuardConfig is what the guard needs to know.
type GuardConfig struct {
	VIP       string
	Interface string
}

// Guard waits until r reaches EOF or fails, then removes the VIP. It is the
// body of `vigil guard`; the caller ignores termination signals first, so
// that only the death of `vigil run` ends the guard.
func Guard(cfg GuardConfig, r io.Reader, log *slog.Logger) error {
	p, err := ParseVIP(cfg.VIP)
	if err != nil {
		return err
	}
	m, err := vip.New(vip.Config{Address: p, Interface: cfg.Interface}, log)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, r) // returns at EOF: vigil run is gone
	return m.Remove("vigil run exited")
}

// guardProc runs and, if it dies, restarts the guard child.
type guardProc struct {
	bin  string
	args []string
	log  *slog.Logger

	mu sync.Mutex // guards w
	w  *os.File   // write end of the current guard's pipe
	wg sync.WaitGroup
}

// startGuard starts `bin guard` and keeps it running until ctx is done.
func startGuard(ctx context.Context, bin string, cfg Config, log *slog.Logger) (*guardProc, error) {
	g := &guardProc{
		bin:  bin,
		args: []string{"guard", "--vip", cfg.VIP.String(), "--interface", cfg.Interface},
		log:  log,
	}
	cmd, err := g.spawn()
	if err != nil {
		return nil, err
	}
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		g.supervise(ctx, cmd)
	}()
	return g, nil
}

func (g *guardProc) spawn() (*exec.Cmd, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("guard pipe: %w", err)
	}
	cmd := exec.Command(g.bin, g.args...)
	cmd.Stdin = r
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	// Its own process group: a Ctrl-C meant for vigil must not reach it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		r.Close()
		w.Close()
		return nil, fmt.Errorf("start guard %s: %w", g.bin, err)
	}
	r.Close() // the child has its copy
	g.mu.Lock()
	if g.w != nil {
		_ = g.w.Close() // the pipe of a guard that died
	}
	g.w = w
	g.mu.Unlock()
	return cmd, nil
}

// supervise waits for the guard; one that dies while vigil runs is restarted
// after a second.
func (g *guardProc) supervise(ctx context.Context, cmd *exec.Cmd) {
	for {
		err := cmd.Wait()
		if ctx.Err() != nil {
			return
		}
		g.log.Warn("the VIP guard process exited; restarting it", "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
		next, serr := g.spawn()
		if serr != nil {
			g.log.Error("cannot restart the VIP guard", "err", serr)
			continue
		}
		cmd = next
	}
}

// Close tells the guard to remove the VIP and exit, and waits for it. The
// caller must cancel the context given to startGuard first. Safe to call twice.
func (g *guardProc) Close() {
	g.mu.Lock()
	if g.w != nil {
		_ = g.w.Close() // EOF for the guard
		g.w = nil
	}
	g.mu.Unlock()
	g.wg.Wait()
}
