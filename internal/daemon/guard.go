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
//
// The guard answers: after it has taken a deadline (its timer is set), it
// writes back how many deadlines it has taken, as an 8-byte big-endian
// count (on its standard output as a child, on the connection with
// --listen). vigil writes at least every guardHeartbeat, and a guard that
// has left a deadline unanswered for guardAckBound is a guard that would
// not fence: stopped (SIGSTOP, a frozen container), starved, or wedged.
// Writes alone cannot tell: they land in the kernel's buffer whether or not
// anyone reads them. Such a vigil does not campaign, and a holder steps
// down and removes the VIP itself (guardProc.Eligible).

// writeWord writes one word of the guard's protocol (a deadline, the
// hello's slack, an answer's count): 8 bytes, big-endian, in one write.
func writeWord(w io.Writer, v uint64) error {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], v)
	_, err := w.Write(b[:])
	return err
}

// readWord reads one word of the guard's protocol (see writeWord).
func readWord(r io.Reader) (uint64, error) {
	var b [8]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return 0, err
	}
	return binary.BigEndian.Uint64(b[:]), nil
}

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
func Guard(cfg GuardConfig, r io.Reader, ack io.Writer, log *slog.Logger) error {
	m, err := guardVIP(cfg, log)
	if err != nil {
		return err
	}
	return guardStream(m, r, ack, cfg.Slack, log)
}

func guardVIP(cfg GuardConfig, log *slog.Logger) (*vip.Manager, error) {
	ps, err := ParseVIPs(cfg.VIPs)
	if err != nil {
		return nil, err
	}
	return vip.New(vip.Config{Address: ps[0], Also: ps[1:], Interface: cfg.Interface}, log)
}

// guardStream reads deadlines from r until EOF, removing the VIP when one
// passes by slack, and at EOF. After taking each deadline it tells ack how
// many it has taken. The answer never holds up the fence: it is written by
// a goroutine of its own, the latest count only, so a vigil that stopped
// reading answers (stopped itself) cannot block the timer.
func guardStream(m *vip.Manager, r io.Reader, ack io.Writer, slack time.Duration, log *slog.Logger) error {
	acks := make(chan uint64, 1)
	defer close(acks)
	go func() {
		for n := range acks {
			if err := writeWord(ack, n); err != nil {
				for range acks { // vigil is gone; EOF on r follows
				}
				return
			}
		}
	}()
	var taken uint64
	deadlines := make(chan time.Duration)
	go func() {
		defer close(deadlines)
		for {
			d, err := readWord(r)
			if err != nil {
				return // EOF: vigil run is gone
			}
			deadlines <- time.Duration(d)
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
			taken++
			select { // the latest count replaces one not yet written
			case <-acks:
			default:
			}
			acks <- taken
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
			hello, err := readWord(c)
			if err != nil {
				return // it never said hello: it held nothing through us
			}
			slack := time.Duration(hello)
			log.Info("vigil run connected to the guard", "slack", slack)
			if err := guardStream(m, c, c, slack, log); err != nil {
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

	mu sync.Mutex     // guards the fields below
	w  io.WriteCloser // the current guard's pipe or connection
	// gen counts the guards (pipes, connections) so far: answers from one
	// that was replaced are ignored.
	gen uint64
	// latest is the last deadline to tell the guard (CLOCK_MONOTONIC ns, 0:
	// not holding), seq counts the changes to it; kick wakes the writer.
	latest time.Duration
	seq    uint64
	kick   chan struct{}
	// written is the seq of the last deadline written to a guard, in the
	// word numbered writtenWord; changed is closed (and replaced) after
	// every write and every answer, for Arm to wait on.
	written     uint64
	writtenWord uint64
	changed     chan struct{}
	// words counts the deadlines written to the current guard, acked those
	// it has answered for; sentAt[i%len] is when word i was written.
	words, acked uint64
	sentAt       [64]time.Time
	// ackBound is how long a word may go unanswered before the guard counts
	// as not fencing (Eligible).
	ackBound time.Duration
	wg       sync.WaitGroup
}

// guardAckBound is how long the guard may leave a deadline unanswered
// before vigil counts it as not fencing: the renew deadline (500 ms at the
// defaults), under the lease. A guard stopped while its vigil runs then
// costs the holder the VIP within a renewal interval of that; a guard that
// is merely slow to be scheduled answers in microseconds, and in the
// kubeadm lab on two busy cores in up to a few hundred milliseconds (at
// the lease's safety margin, 300 ms, a guard starved for 362 ms during a
// kubeadm join cost the holder the VIP).
func guardAckBound(_, renew time.Duration) time.Duration {
	return renew
}

// guardHeartbeat is how often vigil writes to the guard when no deadline
// changed (a candidate's "not holding"), so that a stopped guard is noticed
// before this node campaigns.
func (g *guardProc) guardHeartbeat() time.Duration { return g.ackBound / 3 }

// errGuardSilent is why a vigil whose guard stopped answering does not hold
// the VIP.
var errGuardSilent = errors.New("the VIP guard does not answer (stopped, starved or wedged): it would not remove the VIP if this vigil were stopped")

// errNoGuard is why a vigil with a guard it cannot reach does not hold the
// VIP: nothing would remove the address if that vigil were stopped or killed.
var errNoGuard = errors.New("not connected to the VIP guard: nothing would remove the VIP if this vigil were stopped or killed")

// Eligible returns errNoGuard while no guard listens to this vigil: the
// guard container has not started yet or is being restarted. A candidate
// does not campaign and a holder steps down, so no node ever holds the VIP
// unfenced. It returns errGuardSilent once a deadline has gone unanswered
// for longer than ackBound.
func (g *guardProc) Eligible() error { return g.answeredWithin(g.ackBound) }

// EligibleToCampaign is Eligible for a candidate, with half the bound: a
// candidate whose guard has left a deadline unanswered for that long would
// take the VIP only to drop it a moment later, once the holder's bound
// passed. In the lab, on two starved cores, a candidate whose guard had
// been silent for about 490 ms took the lock, added the VIP and removed it
// 7 ms later ("5 deadlines unanswered for 589ms"): clients saw the VIP go
// to that node and on to a third within 183 ms. A guard that is scheduled
// at all answers in microseconds, so the stricter bound only keeps a
// starved node out of the race while a peer's guard answers.
func (g *guardProc) EligibleToCampaign() error { return g.answeredWithin(g.ackBound / 2) }

// answeredWithin returns errNoGuard without a guard, and errGuardSilent if
// the oldest deadline the guard has not answered was written more than
// bound ago.
func (g *guardProc) answeredWithin(bound time.Duration) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.w == nil {
		if g.socket != "" {
			return fmt.Errorf("%w (socket %s)", errNoGuard, g.socket)
		}
		return errNoGuard
	}
	if g.acked < g.words {
		// The oldest word not answered for; with more in the backlog than
		// sentAt holds, the oldest it holds (the guard is far behind).
		oldest, ring := g.acked+1, uint64(len(g.sentAt))
		if g.words-g.acked > ring {
			oldest = g.words - ring + 1
		}
		if silent := time.Since(g.sentAt[oldest%ring]); silent > bound {
			return fmt.Errorf("%w: %d deadlines unanswered for %v (bound %v)", errGuardSilent, g.words-g.acked, silent.Round(time.Millisecond), bound)
		}
	}
	return nil
}

// attach makes w the current guard's pipe or connection and returns its
// generation, for its answers.
func (g *guardProc) attach(w io.WriteCloser) uint64 {
	g.mu.Lock()
	if g.w != nil && g.w != w {
		_ = g.w.Close() // the pipe of a guard that died
	}
	g.w = w
	g.gen++
	g.words, g.acked = 0, 0
	gen := g.gen
	g.mu.Unlock()
	select { // a new guard learns the current deadline
	case g.kick <- struct{}{}:
	default:
	}
	return gen
}

// readAcks reads the guard's answers from r until it fails (the guard is
// gone), and records them for the guard of generation gen.
func (g *guardProc) readAcks(r io.Reader, gen uint64) {
	for {
		n, err := readWord(r)
		if err != nil {
			return
		}
		g.mu.Lock()
		if g.gen == gen && n > g.acked && n <= g.words {
			g.acked = n
			close(g.changed)
			g.changed = make(chan struct{})
		}
		g.mu.Unlock()
	}
}

// connectGuard keeps a connection to the guard listening on socket until ctx
// is done. A guard that is not there yet (its container starts after this
// one) is retried every guardRedial, with one warning; until it answers,
// Eligible keeps this vigil from campaigning.
func connectGuard(ctx context.Context, socket string, cfg Config, log *slog.Logger) *guardProc {
	g := &guardProc{socket: socket, slack: guardSlack(cfg.LeaseDuration, cfg.RenewDeadline), log: log,
		kick: make(chan struct{}, 1), changed: make(chan struct{}),
		ackBound: guardAckBound(cfg.LeaseDuration, cfg.RenewDeadline)}
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
			if err = writeWord(c, uint64(g.slack)); err != nil {
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
		// The guard's answers; the read ends when it goes away.
		g.readAcks(c, g.attach(c))
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
		log:      log,
		kick:     make(chan struct{}, 1),
		changed:  make(chan struct{}),
		ackBound: guardAckBound(cfg.LeaseDuration, cfg.RenewDeadline),
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
// wait, until the guard has answered for it. The VIP is added only after
// that: a vigil stopped between adding the address and its writer's next
// turn would otherwise leave the guard with no deadline to enforce. It
// reports whether the guard answered in time; if not (the guard is gone,
// or stopped), the guard still learns the deadline when it reads, and
// Eligible soon ends the tenure.
func (g *guardProc) Arm(deadline time.Time, wait time.Duration) bool {
	seq := g.set(deadline)
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		g.mu.Lock()
		done, changed := g.written >= seq && g.acked >= g.writtenWord, g.changed
		g.mu.Unlock()
		if done {
			return true
		}
		select {
		case <-changed:
		case <-timer.C:
			return false
		}
	}
}

// write sends the latest deadline to the current guard after every change,
// and at least every guardHeartbeat (the guard answers each one).
func (g *guardProc) write(ctx context.Context) {
	beat := time.NewTicker(g.guardHeartbeat())
	defer beat.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-g.kick:
		case <-beat.C:
		}
		g.mu.Lock()
		w, d, seq, gen := g.w, g.latest, g.seq, g.gen
		g.mu.Unlock()
		if w == nil {
			continue
		}
		sent := time.Now()
		if err := writeWord(w, uint64(d)); err != nil {
			continue // a dead guard is restarted (or reconnected), which kicks again
		}
		g.mu.Lock()
		if g.gen == gen {
			g.words++
			g.sentAt[g.words%uint64(len(g.sentAt))] = sent
			if seq > g.written {
				g.written = seq
			}
			g.writtenWord = g.words
			close(g.changed)
			g.changed = make(chan struct{})
		}
		g.mu.Unlock()
	}
}

func (g *guardProc) spawn() (*exec.Cmd, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("guard pipe: %w", err)
	}
	ackR, ackW, err := os.Pipe()
	if err != nil {
		r.Close()
		w.Close()
		return nil, fmt.Errorf("guard pipe: %w", err)
	}
	cmd := exec.Command(g.bin, g.args...)
	cmd.Stdin = r
	cmd.Stdout, cmd.Stderr = ackW, os.Stderr // its answers on stdout
	// Its own process group: a Ctrl-C meant for vigil must not reach it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		for _, f := range []*os.File{r, w, ackR, ackW} {
			f.Close()
		}
		return nil, fmt.Errorf("start guard %s: %w", g.bin, err)
	}
	r.Close() // the child has its copies
	ackW.Close()
	gen := g.attach(w) // a restarted guard learns the current deadline
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		defer ackR.Close()
		g.readAcks(ackR, gen)
	}()
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
