package daemon

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vigil-ha/vigil/internal/vip"
)

// The guard is a small child process (`vigil guard`) that fences the VIP when
// `vigil run` cannot:
//
//   - vigil dies (SIGKILL, the OOM killer, a panic): the guard holds the read
//     end of a pipe whose write end only `vigil run` has; the kernel closes
//     it, the guard reads EOF and removes the VIP;
//   - vigil stops running without dying (SIGSTOP, a debugger, a page-fault
//     storm, a write blocked on a full stderr pipe): vigil sends the guard
//     its lease deadline after every renewal; when that deadline plus a small
//     slack passes without a newer one, the guard removes the VIP itself,
//     before any peer may take the lock.
//
// The guard never adds the VIP. It cannot help when both processes are
// stopped or killed together (a frozen cgroup, a pod killed whole, power
// loss): then the VIP's kernel lifetime is the fence (vip.DefaultLifetime).
//
// The pipe carries 8-byte big-endian CLOCK_MONOTONIC deadlines in
// nanoseconds; 0 means "not holding". CLOCK_MONOTONIC is one clock for every
// process of the machine, so a deadline means the same in both.

// GuardConfig is what the guard needs to know.
type GuardConfig struct {
	// VIPs are the addresses to remove: one, or two in dual-stack.
	VIPs      []string
	Interface string
	// Slack is how long after vigil's own deadline the guard acts: vigil
	// steps down at its deadline when it runs, so the guard does not race
	// it; peers take over only a safety margin later.
	Slack time.Duration
}

// guardSlack is the guard's slack for a lease and renew deadline: half the
// safety margin, at most 100 ms. With the defaults (800/500 ms) a stopped
// holder loses the VIP 600 ms after its last renewal began, 200 ms before any
// peer may take the lock.
func guardSlack(lease, renew time.Duration) time.Duration {
	return min((lease-renew)/2, 100*time.Millisecond)
}

// Guard removes the VIP when r reaches EOF or fails, and whenever the last
// deadline read from r has passed by cfg.Slack. It is the body of `vigil
// guard`; the caller ignores termination signals first, so that only the
// death of `vigil run` ends the guard.
func Guard(cfg GuardConfig, r io.Reader, log *slog.Logger) error {
	m, err := guardVIP(cfg, log)
	if err != nil {
		return err
	}
	return guardStream(m, r, cfg.Slack, log)
}

func guardVIP(cfg GuardConfig, log *slog.Logger) (*vip.Manager, error) {
	ps, err := ParseVIPs(cfg.VIPs)
	if err != nil {
		return nil, err
	}
	return vip.New(vip.Config{Address: ps[0], Also: ps[1:], Interface: cfg.Interface}, log)
}

// guardStream reads deadlines from r until EOF, removing the VIP when one
// passes by slack, and at EOF.
func guardStream(m *vip.Manager, r io.Reader, slack time.Duration, log *slog.Logger) error {
	deadlines := make(chan time.Duration)
	go func() {
		defer close(deadlines)
		var b [8]byte
		for {
			if _, err := io.ReadFull(r, b[:]); err != nil {
				return // EOF: vigil run is gone
			}
			deadlines <- time.Duration(binary.BigEndian.Uint64(b[:]))
		}
	}()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		select {
		case d, ok := <-deadlines:
			if !ok {
				return m.Remove("vigil run exited")
			}
			timer.Stop()
			if d > 0 {
				timer.Reset(d + slack - monoNow())
			}
		case <-timer.C:
			// Remove first, log after: the log may block.
			if err := m.Remove("vigil run did not renew its lease in time (stopped or starved); fenced by the guard"); err != nil {
				log.Error("guard cannot remove the VIP", "err", err)
			}
		}
	}
}

// ServeGuard is `vigil guard --listen`: the guard as a process of its own,
// for a pod, where `vigil run` is PID 1 of its container and a child guard
// would die with it. It serves the same protocol as the pipe on a Unix
// socket, one connection per `vigil run`, except that the first word of a
// connection is the slack (vigil run knows its own timings). A connection
// that ends, because vigil run exited or its container was killed, removes
// the VIP at once; the guard keeps serving the next vigil run. When ctx ends
// (the pod is stopping) it accepts no more connections but returns only
// once the vigil runs connected to it are gone: a vigil that hangs in its
// own shutdown is still fenced.
func ServeGuard(ctx context.Context, cfg GuardConfig, ln net.Listener, log *slog.Logger) error {
	m, err := guardVIP(cfg, log)
	if err != nil {
		ln.Close()
		return err
	}
	log.Info("guard listening", "socket", ln.Addr().String(), "vip", strings.Join(cfg.VIPs, ","), "interface", cfg.Interface)
	go func() {
		<-ctx.Done()
		ln.Close()
	}()
	var conns sync.WaitGroup
	defer conns.Wait()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("guard: accept: %w", err)
		}
		conns.Add(1)
		go func() {
			defer conns.Done()
			defer c.Close()
			var b [8]byte
			if _, err := io.ReadFull(c, b[:]); err != nil {
				return // it never said hello: it held nothing through us
			}
			slack := time.Duration(binary.BigEndian.Uint64(b[:]))
			log.Info("vigil run connected to the guard", "slack", slack)
			if err := guardStream(m, c, slack, log); err != nil {
				log.Error("guard cannot remove the VIP", "err", err)
			}
		}()
	}
}

// monoNow reads CLOCK_MONOTONIC, the clock deadlines on the pipe use.
func monoNow() time.Duration {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts) // cannot fail for CLOCK_MONOTONIC
	return time.Duration(ts.Nano())
}

// guardProc runs and, if it dies, restarts the guard child; or, with a
// socket, keeps a connection to a guard that runs on its own (vigil guard
// --listen) and reconnects when it breaks.
type guardProc struct {
	bin    string
	args   []string
	socket string
	slack  time.Duration
	log    *slog.Logger

	mu sync.Mutex     // guards w, latest, seq, written and wrote
	w  io.WriteCloser // the current guard's pipe or connection
	// latest is the last deadline to tell the guard (CLOCK_MONOTONIC ns, 0:
	// not holding), seq counts the changes to it; kick wakes the writer.
	latest time.Duration
	seq    uint64
	kick   chan struct{}
	// written is the seq of the last deadline written to a guard; wrote is
	// closed (and replaced) after every write, for Arm to wait on.
	written uint64
	wrote   chan struct{}
	wg      sync.WaitGroup
}

// errNoGuard is why a vigil with a guard it cannot reach does not hold the
// VIP: nothing would remove the address if that vigil were stopped or killed.
var errNoGuard = errors.New("not connected to the VIP guard: nothing would remove the VIP if this vigil were stopped or killed")

// Eligible returns errNoGuard while no guard listens to this vigil: the
// guard container has not started yet or is being restarted. A candidate
// does not campaign and a holder steps down, so no node ever holds the VIP
// unfenced.
func (g *guardProc) Eligible() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.w == nil {
		if g.socket != "" {
			return fmt.Errorf("%w (socket %s)", errNoGuard, g.socket)
		}
		return errNoGuard
	}
	return nil
}

// connectGuard keeps a connection to the guard listening on socket until ctx
// is done. A guard that is not there yet (its container starts after this
// one) is retried every guardRedial, with one warning; until it answers,
// Eligible keeps this vigil from campaigning.
func connectGuard(ctx context.Context, socket string, cfg Config, log *slog.Logger) *guardProc {
	g := &guardProc{socket: socket, slack: guardSlack(cfg.LeaseDuration, cfg.RenewDeadline), log: log,
		kick: make(chan struct{}, 1), wrote: make(chan struct{})}
	g.wg.Add(2)
	go func() {
		defer g.wg.Done()
		g.stayConnected(ctx)
	}()
	go func() {
		defer g.wg.Done()
		g.write(ctx)
	}()
	return g
}

// stayConnected connects to the guard's socket, says hello (the slack), and
// reconnects whenever the connection breaks.
func (g *guardProc) stayConnected(ctx context.Context) {
	warned := false
	for ctx.Err() == nil {
		c, err := (&net.Dialer{}).DialContext(ctx, "unix", g.socket)
		if err == nil {
			var b [8]byte
			binary.BigEndian.PutUint64(b[:], uint64(g.slack))
			if _, err = c.Write(b[:]); err != nil {
				c.Close()
			}
		}
		if err != nil {
			if !warned && ctx.Err() == nil {
				g.log.Warn("cannot reach the VIP guard; retrying (until it answers, this node does not hold the VIP)", "socket", g.socket, "err", err)
				warned = true
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(guardRedial):
			}
			continue
		}
		if warned {
			g.log.Info("connected to the VIP guard", "socket", g.socket)
			warned = false
		}
		g.mu.Lock()
		g.w = c
		g.mu.Unlock()
		select { // a new connection learns the current deadline
		case g.kick <- struct{}{}:
		default:
		}
		// The guard never writes: a read ends only when it goes away.
		_, _ = c.Read(make([]byte, 1))
		g.mu.Lock()
		if g.w == c {
			g.w = nil
		}
		g.mu.Unlock()
		c.Close()
		if ctx.Err() == nil {
			g.log.Warn("the connection to the VIP guard broke; reconnecting", "socket", g.socket)
			warned = true
		}
	}
}

// guardVIPArgs is "guard" and a --vip per VIP.
func guardVIPArgs(vips []netip.Prefix) []string {
	args := []string{"guard"}
	for _, v := range vips {
		args = append(args, "--vip", v.String())
	}
	return args
}

// startGuard starts `bin guard` and keeps it running until ctx is done.
func startGuard(ctx context.Context, bin string, cfg Config, log *slog.Logger) (*guardProc, error) {
	g := &guardProc{
		bin: bin,
		args: append(guardVIPArgs(cfg.VIPs), "--interface", cfg.Interface,
			"--slack", guardSlack(cfg.LeaseDuration, cfg.RenewDeadline).String()),
		log:   log,
		kick:  make(chan struct{}, 1),
		wrote: make(chan struct{}),
	}
	cmd, err := g.spawn()
	if err != nil {
		return nil, err
	}
	g.wg.Add(2)
	go func() {
		defer g.wg.Done()
		g.supervise(ctx, cmd)
	}()
	go func() {
		defer g.wg.Done()
		g.write(ctx)
	}()
	return g, nil
}

// guardRedial is how often a vigil retries a guard socket nobody listens on.
// It bounds how long a holder waits for a restarted guard container before
// it may campaign again.
const guardRedial = 200 * time.Millisecond

// Lease tells the guard the lease deadline (zero: not holding). It never
// blocks: a guard that does not read (stopped itself) gets the latest value
// when it reads again.
func (g *guardProc) Lease(deadline time.Time) { g.set(deadline) }

func (g *guardProc) set(deadline time.Time) uint64 {
	var d time.Duration
	if !deadline.IsZero() {
		d = monoNow() + time.Until(deadline)
	}
	g.mu.Lock()
	g.latest = d
	g.seq++
	seq := g.seq
	g.mu.Unlock()
	select {
	case g.kick <- struct{}{}:
	default:
	}
	return seq
}

// Arm tells the guard the first deadline of a tenure and waits, at most
// wait, until it is written to the guard. The VIP is added only after that:
// a vigil stopped between adding the address and its writer's next turn
// would otherwise leave the guard with no deadline to enforce. It reports
// whether the write happened in time; if not (the guard is gone, or stopped
// and its buffer full), the guard still learns the deadline when it reads.
func (g *guardProc) Arm(deadline time.Time, wait time.Duration) bool {
	seq := g.set(deadline)
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		g.mu.Lock()
		done, wrote := g.written >= seq, g.wrote
		g.mu.Unlock()
		if done {
			return true
		}
		select {
		case <-wrote:
		case <-timer.C:
			return false
		}
	}
}

// write sends the latest deadline to the current guard after every change.
func (g *guardProc) write(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-g.kick:
		}
		g.mu.Lock()
		w, d, seq := g.w, g.latest, g.seq
		g.mu.Unlock()
		if w == nil {
			continue
		}
		var b [8]byte
		binary.BigEndian.PutUint64(b[:], uint64(d))
		if _, err := w.Write(b[:]); err != nil {
			continue // a dead guard is restarted (or reconnected), which kicks again
		}
		g.mu.Lock()
		if seq > g.written {
			g.written = seq
		}
		close(g.wrote)
		g.wrote = make(chan struct{})
		g.mu.Unlock()
	}
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
	select { // a restarted guard learns the current deadline
	case g.kick <- struct{}{}:
	default:
	}
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
		// Until the next guard runs, this vigil is not fenced: Eligible
		// fails, so a holder steps down and a candidate waits.
		g.mu.Lock()
		if g.w != nil {
			_ = g.w.Close()
			g.w = nil
		}
		g.mu.Unlock()
		g.log.Warn("the VIP guard process exited; restarting it (this node does not hold the VIP until it runs)", "err", err)
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
