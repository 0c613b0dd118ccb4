package lb

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vigil-ha/vigil/internal/validate"
)

// Defaults.
const (
	// DefaultDialTimeout bounds a connection attempt to one backend. The
	// SYN is answered by the backend's kernel, not by its process: a live
	// API server answers in well under a millisecond on one segment, and a
	// few tens across regions, however busy it is. What takes longer is a
	// lost SYN (resent after 1 s), a full accept queue (an overloaded
	// server drops it), or a backend that is powered off or cut off, and
	// in each the client is better served by the next backend at once. A
	// silent backend costs 250 ms before the next one is tried (it was a
	// second), until the health checks take it out: with one of three
	// machines powered off, a third of new connections would otherwise
	// wait a second each for that long.
	DefaultDialTimeout = 250 * time.Millisecond
	// DefaultAttempts is how many backends one client connection may try.
	DefaultAttempts = 3
	// DefaultDrainTimeout bounds how long connections to a draining backend
	// (answering, but failing /readyz) are left to finish. kube-apiserver's
	// --shutdown-delay-duration is typically up to 70 s in managed clusters,
	// and the server closes its connections itself when it exits.
	DefaultDrainTimeout = 90 * time.Second
	// DefaultUnreachableGrace is how long a backend may go without
	// answering (health checks time out, connections to it time out) before
	// its established connections are closed. A kube-apiserver paused by a
	// long GC, a full disk or a SIGSTOP, or an overloaded one, answers again
	// within seconds, and every watch it holds is worth keeping: a reset
	// one costs the server a relist. A backend whose process is gone
	// refuses connections and is closed at once instead (health.Dead); one
	// that stays silent for this long is most likely powered off, and its
	// clients are better off reconnecting elsewhere than waiting for TCP
	// keepalive.
	DefaultUnreachableGrace = 5 * time.Second
	// DefaultMaxConns bounds the client connections served at once. An idle
	// proxied connection costs about MemoryPerConn (two goroutines and two
	// sockets; no copy buffer while idle), so the default fits
	// DefaultMemoryBudget. The generated static pod has a 128Mi limit and
	// vigil run itself used about 52 MiB in the lab: 48 MiB of connections
	// leave room for bursts of copy buffers and the garbage collector.
	DefaultMaxConns = int(DefaultMemoryBudget / MemoryPerConn)
	// DefaultMaxConnsPerSource bounds the connections from one source IP: a
	// quarter of the total, so one misbehaving client (or NAT) cannot take
	// every slot while it leaves room for a large NATed client population.
	DefaultMaxConnsPerSource = DefaultMaxConns / 4
	// DefaultHalfCloseTimeout bounds how long the other side may go on
	// sending after one side finished (sent its FIN): kube-apiserver's
	// clients do not half-close to keep a stream open, so a half-closed
	// connection that lingers is one whose peer is gone.
	DefaultHalfCloseTimeout = time.Minute
	// DefaultMemoryBudget is the memory the default connection limit is
	// sized for.
	DefaultMemoryBudget = 48 << 20
	// MemoryPerConn is what one idle proxied connection was measured to
	// cost vigil in RSS (bench/lb), rounded up.
	MemoryPerConn = 16 << 10
)

// TCP keepalive on both sides, in seconds: a peer that vanished without a
// FIN (a node that lost power while watching, a backend behind a path that
// broke) is found after 30 + 3*10 s.
const (
	keepAliveIdle     = 30
	keepAliveInterval = 10
	keepAliveCount    = 3
)

// Config configures a Balancer.
type Config struct {
	// Listen is the address the balancer accepts on, VIP:port.
	Listen string
	// AlsoListen are further addresses accepted on, with the same backends,
	// limits and metrics: the other family's VIP:port of a dual-stack
	// cluster.
	AlsoListen []string
	// Picker chooses the backend of each new connection (nil: LeastConn).
	Picker Picker
	// FreeBind lets the listener bind the VIP while this node does not hold
	// it (IP_FREEBIND), so it is open, and any port conflict found, before
	// the node ever leads.
	FreeBind bool
	// ServerSpeaksFirst is for protocols whose server may speak before
	// the client (SSH, SMTP, a banner): the listener then hands over a
	// connection before its first bytes (no TCP_DEFER_ACCEPT, which would
	// hold a silent client for a second), and the handshake with the
	// backend completes at once instead of riding on the client's first
	// bytes. Off, the balancer assumes the client speaks first, as TLS
	// does: one wake-up and one packet fewer per connection.
	ServerSpeaksFirst bool
	DialTimeout       time.Duration
	Attempts          int
	DrainTimeout      time.Duration
	// UnreachableGrace: see DefaultUnreachableGrace (0: that default).
	UnreachableGrace time.Duration
	// Dial connects to a backend; nil uses net.Dialer.
	Dial func(ctx context.Context, network, address string) (net.Conn, error)
	// OnDialError is told about every failed connection attempt to a
	// backend (passive health checking: health.Checker.DialFailed).
	OnDialError func(backend string, err error)
	// Metrics receives the balancer's metrics; nil keeps them private.
	Metrics prometheus.Registerer
	// Standby starts the balancer not serving (see SetServing).
	Standby bool
	// MaxConns bounds the client connections served at once (0:
	// DefaultMaxConns, -1: no bound). A connection beyond it is reset at
	// once: the process, and the VIP it holds, must not run out of memory
	// because one client opened too many.
	MaxConns int
	// MaxConnsPerSource bounds those from one source IP address (0:
	// DefaultMaxConnsPerSource, -1: no bound).
	MaxConnsPerSource int
	// IdleTimeout closes a connection that carried no byte either way for
	// this long (0: never, the default: a watch can be quiet for minutes).
	IdleTimeout time.Duration
	// HalfCloseTimeout closes a connection this long after one side
	// finished sending, if the other has not finished too (0:
	// DefaultHalfCloseTimeout).
	HalfCloseTimeout time.Duration
	// ReusePort sets SO_REUSEPORT on the listener, so that a new process
	// can bind the same address before the old one exits (an upgrade of
	// the worker agent without a moment with nothing listening).
	ReusePort bool
	// Loops is how many event loops serve connections (see loop_linux.go;
	// 0: one per CPU, at most 4). -1 serves every connection with
	// goroutines instead, as do an IdleTimeout, a custom Dial, and systems
	// other than Linux.
	Loops int

	customDial bool // Dial was given
}

// CheckLimits validates the connection limits and the idle timeout as
// their flags (--lb-max-conns, --lb-max-conns-per-source,
// --lb-idle-timeout) give them: a limit is positive, or -1 for none (0
// means the default); the per-source limit is not above the total; the
// timeout is 0 (off) or positive.
func CheckLimits(maxConns, perSource int, idle time.Duration) error {
	switch {
	case maxConns < -1:
		return fmt.Errorf("%w: `lbMaxConns` %d: give a positive number, or -1 for no limit", validate.ErrInvalid, maxConns)
	case perSource < -1:
		return fmt.Errorf("%w: `lbMaxConnsPerSource` %d: give a positive number, or -1 for no limit", validate.ErrInvalid, perSource)
	case maxConns > 0 && perSource > maxConns:
		return fmt.Errorf("%w: `lbMaxConnsPerSource` %d is above `lbMaxConns` %d", validate.ErrInvalid, perSource, maxConns)
	case idle < 0:
		return fmt.Errorf("%w: `lbIdleTimeout` %v must be 0 (off) or positive", validate.ErrInvalid, idle)
	}
	return nil
}

// MaxLoops bounds Config.Loops.
const MaxLoops = 64

// CheckLoops validates the event loop count as --lb-event-loops gives it:
// 0 (one per CPU, at most 4), 1 to MaxLoops, or -1 (none: goroutines).
func CheckLoops(n int) error {
	if n < -1 || n > MaxLoops {
		return fmt.Errorf("%w: `lbEventLoops` %d: give 0 (one per CPU, at most 4), 1 to %d, or -1 (serve connections with goroutines)", validate.ErrInvalid, n, MaxLoops)
	}
	return nil
}
