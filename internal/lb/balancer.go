package lb

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vigil-ha/vigil/internal/health"
)

// Errors.
var (
	ErrInvalidConfig = errors.New("lb: invalid configuration")
	// ErrPortInUse: something else listens on the VIP's port already; with
	// kubeadm that is a kube-apiserver bound to 0.0.0.0.
	ErrPortInUse = errors.New("lb: port in use")
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
		return fmt.Errorf("%w: --lb-max-conns %d: give a positive number, or -1 for no limit", ErrInvalidConfig, maxConns)
	case perSource < -1:
		return fmt.Errorf("%w: --lb-max-conns-per-source %d: give a positive number, or -1 for no limit", ErrInvalidConfig, perSource)
	case maxConns > 0 && perSource > maxConns:
		return fmt.Errorf("%w: --lb-max-conns-per-source %d is above --lb-max-conns %d", ErrInvalidConfig, perSource, maxConns)
	case idle < 0:
		return fmt.Errorf("%w: --lb-idle-timeout %v must be 0 (off) or positive", ErrInvalidConfig, idle)
	}
	return nil
}

// MaxLoops bounds Config.Loops.
const MaxLoops = 64

// CheckLoops validates the event loop count as --lb-event-loops gives it:
// 0 (one per CPU, at most 4), 1 to MaxLoops, or -1 (none: goroutines).
func CheckLoops(n int) error {
	if n < -1 || n > MaxLoops {
		return fmt.Errorf("%w: --lb-event-loops %d: give 0 (one per CPU, at most 4), 1 to %d, or -1 (serve connections with goroutines)", ErrInvalidConfig, n, MaxLoops)
	}
	return nil
}

// Balancer forwards TCP connections to usable backends. TLS passes through
// untouched: clients verify the API server's own certificate, whose SANs must
// include the VIP (kubeadm: controlPlaneEndpoint or apiServer.certSANs).
type Balancer struct {
	cfg Config
	log *slog.Logger
	ln  net.Listener
	// also are the listeners of cfg.AlsoListen.
	also []net.Listener
	m    *metrics

	runCtx   context.Context // Run's context, for connections handed to goroutines
	stopCh   chan struct{}   // closed by Close
	stopOnce sync.Once
	// handovers counts connections the loops handed over to goroutines
	// (for tests).
	handovers atomic.Int64

	mu      sync.Mutex // guards the fields below
	pool    *pool
	closing map[string]*pendingClose // by backend address
	closed  bool
	serving bool
	// clients holds every accepted connection until it ends (or is
	// evicted, admitLocked): its net.Conn, or its *lpair while an event
	// loop owns it.
	clients map[any]admitted
	sources map[netip.Addr]int // accepted connections per source address
	lastNoB time.Time
	lastCap time.Time // last "limit reached" log
	// lastEvict is the last "evicting" log.
	lastEvict time.Time
	loops     []*evloop // the event loops, once Run started them

	wg sync.WaitGroup // connection goroutines
}

// admitted is an accepted client connection's source, and when it came.
type admitted struct {
	src netip.Addr
	at  time.Time
}

// pendingClose closes a down backend's connections later, unless it comes
// back up first: when its drain timeout ends, or its unreachable grace.
type pendingClose struct {
	at    time.Time
	timer *time.Timer
}

// proxyConn is one client connection and its backend connection.
type proxyConn struct {
	// mu guards client, server and lp where an event loop hands the pair
	// over to goroutines.
	mu             sync.Mutex
	client, server net.Conn
	lp             *lpair // the loop's pair while a loop owns it
	once           sync.Once
	// finished counts the directions whose source ended cleanly (EOF).
	finished atomic.Int32
	// lastUp and lastDown are when the client's and the backend's last
	// bytes were read (unix nanoseconds); bulk counts the directions that
	// are splicing, whose reads are not timed. Busy reads them.
	lastUp, lastDown atomic.Int64
	bulk             atomic.Int32
}

// busy tells whether the pair is in the middle of an exchange at now: the
// client sent after the backend last answered, less than inFlight ago (a
// request in flight; a client that sent last long ago waits on a stream,
// as a watch whose client acknowledged the last event does), a byte moved
// within quiet, a bulk transfer runs, or the kernel holds bytes of the
// exchange (see queued).
func (c *proxyConn) busy(now int64, quiet time.Duration) bool {
	up, down := c.lastUp.Load(), c.lastDown.Load()
	if (up > down && now-up < int64(inFlight)) || now-max(up, down) < int64(quiet) || c.bulk.Load() > 0 {
		return true
	}
	return c.queued()
}

// queued tells whether the kernel holds bytes of the exchange (see
// queued).
func (c *proxyConn) queued() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if lp := c.lp; lp != nil {
		return !lp.closed && (fdQueued(lp.cfd, false) || fdQueued(lp.sfd, true))
	}
	return queued(c.client, false) || queued(c.server, true)
}

// inFlight bounds how long a client's unanswered bytes count as a request
// in flight: API requests are answered in milliseconds; what waits longer
// is a watch or a stream, which no moment of the move would spare.
const inFlight = time.Second

// touch pushes both read deadlines d out: the pair carried a byte.
func (c *proxyConn) touch(d time.Duration) {
	t := time.Now().Add(d)
	_ = c.client.SetReadDeadline(t)
	_ = c.server.SetReadDeadline(t)
}

// close closes both connections; a loop's pair is closed by its loop.
func (c *proxyConn) close() {
	c.mu.Lock()
	lp := c.lp
	open := lp != nil && !lp.closed
	c.mu.Unlock()
	if lp != nil {
		if open {
			lp.loop.post(loopCmd{p: lp})
		}
		return
	}
	c.once.Do(func() {
		c.client.Close()
		c.server.Close()
	})
}

// New validates cfg and opens the listener; the balancer forwards nothing
// until Run is called and a backend is usable.
func New(cfg Config, log *slog.Logger) (*Balancer, error) {
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = DefaultDialTimeout
	}
	if cfg.Attempts == 0 {
		cfg.Attempts = DefaultAttempts
	}
	if cfg.DrainTimeout == 0 {
		cfg.DrainTimeout = DefaultDrainTimeout
	}
	if cfg.UnreachableGrace == 0 {
		cfg.UnreachableGrace = DefaultUnreachableGrace
	}
	if cfg.MaxConns == 0 {
		cfg.MaxConns = DefaultMaxConns
	}
	if cfg.MaxConnsPerSource == 0 {
		cfg.MaxConnsPerSource = DefaultMaxConnsPerSource
	}
	if cfg.HalfCloseTimeout == 0 {
		cfg.HalfCloseTimeout = DefaultHalfCloseTimeout
	}
	cfg.customDial = cfg.Dial != nil
	if cfg.Dial == nil {
		// TCP keepalive towards backends too: a backend path that breaks
		// silently (a powered-off machine between health checks, a
		// firewall that drops state) is found and its connections end,
		// rather than leaking and skewing least-connections.
		control := dialControl
		if cfg.ServerSpeaksFirst {
			control = nil
		}
		cfg.Dial = (&net.Dialer{Control: control, KeepAliveConfig: net.KeepAliveConfig{
			Enable: true, Idle: keepAliveIdle * time.Second, Interval: keepAliveInterval * time.Second, Count: keepAliveCount,
		}}).DialContext
	}
	if cfg.DialTimeout < 0 || cfg.Attempts < 1 || cfg.DrainTimeout < 0 || cfg.HalfCloseTimeout < 0 || cfg.UnreachableGrace < 0 {
		return nil, fmt.Errorf("%w: dial timeout, attempts, drain and half-close timeouts and unreachable grace must be positive", ErrInvalidConfig)
	}
	if err := CheckLimits(cfg.MaxConns, cfg.MaxConnsPerSource, cfg.IdleTimeout); err != nil {
		return nil, err
	}
	if err := CheckLoops(cfg.Loops); err != nil {
		return nil, err
	}
	var lns []net.Listener
	for _, addr := range append([]string{cfg.Listen}, cfg.AlsoListen...) {
		ln, err := openListener(addr, cfg)
		if err != nil {
			for _, l := range lns {
				l.Close()
			}
			return nil, err
		}
		lns = append(lns, ln)
	}
	ln := lns[0]
	b := &Balancer{
		also:    lns[1:],
		cfg:     cfg,
		log:     log.With("listen", cfg.Listen),
		ln:      ln,
		pool:    newPool(cfg.Picker),
		closing: map[string]*pendingClose{},
		clients: map[any]admitted{},
		stopCh:  make(chan struct{}),
		sources: map[netip.Addr]int{},
		serving: !cfg.Standby,
		m:       newMetrics(),
	}
	if cfg.Metrics != nil {
		if err := b.m.register(cfg.Metrics); err != nil {
			b.Close()
			return nil, err
		}
	}
	return b, nil
}

func openListener(addr string, cfg Config) (net.Listener, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host == "" {
		return nil, fmt.Errorf("%w: listen address %q must be IP:PORT", ErrInvalidConfig, addr)
	}
	ln, err := listen(addr, cfg.FreeBind, cfg.ReusePort, !cfg.ServerSpeaksFirst)
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return nil, fmt.Errorf("%w: cannot listen on %s: something already listens on port %s of all or this address. "+
				"If it is kube-apiserver bound to 0.0.0.0, start it with --bind-address set to the node's own IP, "+
				"or give vigil --lb-listen-port (such as 16443: the holder then sends VIP:--lb-port there with nftables), "+
				"or another --lb-port (such as 8443) and use that in controlPlaneEndpoint", ErrPortInUse, addr, port)
		}
		return nil, fmt.Errorf("listen on %s: %w", addr, err)
	}
	return ln, nil
}

// Addr is the listener's address.
func (b *Balancer) Addr() net.Addr { return b.ln.Addr() }

// Addrs are the addresses of every listener, Listen's first.
func (b *Balancer) Addrs() []net.Addr {
	out := []net.Addr{b.ln.Addr()}
	for _, ln := range b.also {
		out = append(out, ln.Addr())
	}
	return out
}

// Run accepts and forwards connections until ctx is cancelled, then closes
// the listener and every connection and waits for them.
func (b *Balancer) Run(ctx context.Context) error {
	stop := context.AfterFunc(ctx, b.Close)
	defer stop()
	b.runCtx = ctx
	if b.startLoops() {
		b.log.Info("load balancer listening", "policy", fmt.Sprint(b.pool.picker), "also", b.cfg.AlsoListen, "event_loops", b.eventLoops())
		<-b.stopCh
	} else {
		b.log.Info("load balancer listening", "policy", fmt.Sprint(b.pool.picker), "also", b.cfg.AlsoListen)
		var loops sync.WaitGroup
		for _, ln := range b.also {
			loops.Go(func() { b.accept(ctx, ln) })
		}
		b.accept(ctx, b.ln)
		b.Close() // the other listeners too, if this one failed alone
		loops.Wait()
	}
	b.mu.Lock()
	b.closed = true
	for _, pc := range b.closing {
		pc.timer.Stop()
	}
	b.mu.Unlock()
	b.CloseAll("load balancer stopping")
	b.mu.Lock()
	loops := b.loops
	b.mu.Unlock()
	for _, l := range loops {
		l.postWait(loopCmd{stop: true})
	}
	b.wg.Wait()
	return nil
}

// accept takes connections from ln until it is closed.
func (b *Balancer) accept(ctx context.Context, ln net.Listener) {
	var backoff time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				break
			}
			// Out of file descriptors and the like: slow down, go on.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			b.log.Warn("accept failed", "err", err, "retry_in", backoff)
			if !sleep(ctx, backoff) {
				break
			}
			continue
		}
		backoff = 0
		src := sourceAddr(c)
		b.mu.Lock()
		limit, ok, evict := b.admitLocked(c, src)
		if ok {
			b.wg.Add(1)
		}
		b.mu.Unlock()
		b.evict(evict)
		if !ok {
			// Counted before the reset: a client that sees the reset
			// finds it counted.
			b.refused(limit)
			reset(c)
			continue
		}
		go func() {
			defer b.wg.Done()
			b.serve(ctx, c)
			b.mu.Lock()
			b.releaseLocked(c, src)
			b.mu.Unlock()
		}()
	}
}

// admitLocked admits a new client connection from src, under key (its
// net.Conn or loop pair): admitted and counted, or not (limit names the
// connection limit reached; empty when this node does not serve, and the
// connection is a stray). b.mu is held.
//
// At the total limit a source under its fair share still gets in: the
// oldest connection of the source holding the most is evicted for it
// (returned as evict, for the caller to close outside the lock), as long as
// that source holds at least two more than the newcomer's would. A flood of
// idle connections from a few addresses (or, with IPv6, many) then cannot
// keep a new client out: shares even out, and only a source already at
// its share is refused. Oldest, not most idle: the flood's first
// connections are its oldest, and the busy connections of a real client
// behind a NAT are its newest.
func (b *Balancer) admitLocked(key any, src netip.Addr) (limit string, ok bool, evict any) {
	switch {
	case !b.serving:
		return "", false, nil
	case b.cfg.MaxConnsPerSource > 0 && b.sources[src] >= b.cfg.MaxConnsPerSource:
		limit = "max_conns_per_source"
	case b.cfg.MaxConns > 0 && len(b.clients) >= b.cfg.MaxConns:
		limit = "max_conns"
		if victim, ok := b.victimLocked(src); ok {
			evict = victim
			b.releaseLocked(victim, b.clients[victim].src)
			limit = ""
		}
	}
	if limit != "" {
		if time.Since(b.lastCap) > 5*time.Second {
			b.lastCap = time.Now()
			b.log.Warn("connection limit reached; resetting new connections (logged every 5s)", "limit", limit,
				"connections", len(b.clients), "max_conns", b.cfg.MaxConns, "max_conns_per_source", b.cfg.MaxConnsPerSource, "client", src.String())
		}
		return limit, false, nil
	}
	b.clients[key] = admitted{src: src, at: time.Now()}
	b.sources[src]++
	return "", true, evict
}

// victimLocked picks the connection to evict for a newcomer from src at
// the total limit: the oldest of the source holding the most, if it holds
// at least two more than src would with the newcomer. b.mu is held.
func (b *Balancer) victimLocked(src netip.Addr) (any, bool) {
	var top netip.Addr
	most := 0
	for s, n := range b.sources {
		if n > most || (n == most && s.Less(top)) {
			top, most = s, n
		}
	}
	if top == src || most < b.sources[src]+2 {
		return nil, false
	}
	var victim any
	var oldest time.Time
	for k, a := range b.clients {
		if a.src == top && (victim == nil || a.at.Before(oldest)) {
			victim, oldest = k, a.at
		}
	}
	return victim, victim != nil
}

// evict closes a connection admitLocked evicted (nil: none), counted in
// vigil_lb_connections_closed_total{reason="fair_share"}.
func (b *Balancer) evict(key any) {
	switch c := key.(type) {
	case nil:
		return
	case net.Conn:
		reset(c) // its serve goroutine closes the backend side
	case *lpair:
		c.loop.post(loopCmd{p: c})
	}
	b.m.closed.WithLabelValues("fair_share").Inc()
	b.mu.Lock()
	log := time.Since(b.lastEvict) > 5*time.Second
	if log {
		b.lastEvict = time.Now()
	}
	b.mu.Unlock()
	if log {
		b.log.Warn("connection limit reached; evicting the oldest connection of the source with the most, for a source under its share (logged every 5s)", "max_conns", b.cfg.MaxConns)
	}
}

// refused counts a connection turned away (and reset) by admitLocked
// over a limit; a stray one (limit "") is not counted.
func (b *Balancer) refused(limit string) {
	if limit != "" {
		b.m.refused.WithLabelValues(limit).Inc()
	}
}

// eventLoops is how many event loops Run started (0: goroutines serve).
func (b *Balancer) eventLoops() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.loops)
}

// stillWantedLocked tells whether a connection to be, just established
// for the client key, may be proxied: be may have gone down or been
// removed while it was dialled, or this node may have stopped serving or
// reset the client. b.mu is held.
func (b *Balancer) stillWantedLocked(key any, be *backend, anyway bool) bool {
	_, ok := b.clients[key]
	return ok && !b.closed && b.serving && b.pool.m[be.addr] == be && (be.usable || anyway)
}

// releaseLocked forgets an admitted client connection and its slot of
// src; one forgotten already (evicted, or released) is left alone. b.mu is
// held.
func (b *Balancer) releaseLocked(key any, src netip.Addr) {
	if _, ok := b.clients[key]; !ok {
		return
	}
	delete(b.clients, key)
	if b.sources[src]--; b.sources[src] <= 0 {
		delete(b.sources, src)
	}
}

// SetBackends makes the backend set exactly addrs (host:port each). New
// backends take traffic once Update reports them up; connections to removed
// ones are closed at once so their clients reconnect to a member that is
// still in the cluster.
func (b *Balancer) SetBackends(addrs []string) {
	b.mu.Lock()
	removed := b.pool.set(addrs)
	for _, be := range b.pool.m {
		if be.m.active == nil {
			be.m = b.m.forBackend(be.addr)
		}
	}
	var conns []*proxyConn
	for _, be := range removed {
		for c := range be.conns {
			conns = append(conns, c)
		}
		b.cancelClose(be.addr)
		b.m.forget(be.addr)
		b.log.Info("backend removed", "backend", be.addr, "closing", len(be.conns))
	}
	b.m.usable.Set(float64(b.pool.usableCount()))
	b.m.known.Set(float64(len(b.pool.m)))
	b.mu.Unlock()
	closeAll(conns)
}

// Update applies a health change of one backend. Up takes new
// connections; down, for any cause, takes none. What happens to its
// established connections depends on the cause (see health.Cause):
//
//   - Dead (refused: the process is gone): closed at once, so their clients
//     reconnect to a live server now;
//   - Unreachable (silent: paused, overloaded, or powered off): left alone
//     until UnreachableGrace after it stopped answering, then closed;
//   - Draining (answering, failing /readyz): left to finish until
//     DrainTimeout.
//
// A backend that comes back up before its deadline keeps every connection.
func (b *Balancer) Update(st health.Status) {
	b.mu.Lock()
	be, ok := b.pool.m[st.Backend]
	if !ok || b.closed {
		b.mu.Unlock()
		return
	}
	be.usable = st.State == health.Up
	b.m.backendUp.WithLabelValues(be.addr).Set(boolFloat(be.usable))
	b.m.usable.Set(float64(b.pool.usableCount()))
	if be.usable || st.Cause == health.Dead {
		b.cancelClose(be.addr)
	}
	var conns []*proxyConn
	if st.State == health.Down && len(be.conns) > 0 {
		now := time.Now()
		switch st.Cause {
		case health.Dead:
			for c := range be.conns {
				conns = append(conns, c)
			}
		case health.Unreachable:
			since := st.FailingSince
			if since.IsZero() || since.After(now) {
				since = now
			}
			if b.closeAt(be.addr, since.Add(b.cfg.UnreachableGrace), "backend_unreachable") {
				b.log.Info("backend unreachable; its connections are kept for the grace period, in case it answers again",
					"backend", be.addr, "connections", len(be.conns), "grace", b.cfg.UnreachableGrace, "err", st.LastError)
			}
		case health.Draining:
			if b.closeAt(be.addr, now.Add(b.cfg.DrainTimeout), "drain_timeout") {
				b.log.Info("backend draining; its connections may finish", "backend", be.addr, "connections", len(be.conns), "timeout", b.cfg.DrainTimeout)
			}
		}
	}
	b.mu.Unlock()
	if len(conns) > 0 {
		b.log.Info("closing connections to a dead backend", "backend", st.Backend, "connections", len(conns))
		b.m.closed.WithLabelValues("backend_dead").Add(float64(len(conns)))
		closeAll(conns)
	}
}

// closeAt arranges for addr's connections to be closed at t, unless one is
// due earlier already; it reports whether it set a new deadline. b.mu is
// held.
func (b *Balancer) closeAt(addr string, t time.Time, reason string) bool {
	if p := b.closing[addr]; p != nil {
		if !p.at.After(t) {
			return false
		}
		p.timer.Stop()
	}
	p := &pendingClose{at: t}
	p.timer = time.AfterFunc(time.Until(t), func() { b.closeBackend(addr, p, reason) })
	b.closing[addr] = p
	return true
}

// cancelClose drops addr's pending close. b.mu is held.
func (b *Balancer) cancelClose(addr string) {
	if p := b.closing[addr]; p != nil {
		p.timer.Stop()
		delete(b.closing, addr)
	}
}

// SetServing turns forwarding on (this node holds the VIP) or off. Turning
// it off resets every client connection, including those still waiting for
// a backend: the daemon does so just before it removes the VIP, while the
// resets can still leave from the VIP. Once the address is gone this node
// cannot send from it, and a client whose request was already acknowledged
// would wait for an answer that never comes.
func (b *Balancer) SetServing(on bool) {
	b.mu.Lock()
	b.serving = on
	var clients []net.Conn
	n := 0
	loops := b.loops
	if !on {
		for c := range b.clients {
			if c, ok := c.(net.Conn); ok {
				clients = append(clients, c)
			}
		}
		n = len(b.clients)
	}
	b.mu.Unlock()
	if n > 0 {
		b.log.Info("resetting client connections: this node no longer serves the VIP", "connections", n)
		b.m.closed.WithLabelValues("vip_moved").Add(float64(n))
	}
	for _, c := range clients {
		reset(c) // its serve goroutine closes the backend side
	}
	if !on && n > len(clients) {
		// The loops' own: each resets its clients and is done before
		// this returns, while the resets can still leave from the VIP.
		for _, l := range loops {
			l.postWait(loopCmd{resetAll: true})
		}
	}
}

// proxied returns every established connection.
func (b *Balancer) proxied() []*proxyConn {
	b.mu.Lock()
	defer b.mu.Unlock()
	var conns []*proxyConn
	for _, be := range b.pool.m {
		for c := range be.conns {
			conns = append(conns, c)
		}
	}
	return conns
}

// CloseAll closes every established connection.
func (b *Balancer) CloseAll(reason string) {
	conns := b.proxied()
	if len(conns) > 0 {
		b.log.Info("closing all proxied connections", "reason", reason, "connections", len(conns))
	}
	closeAll(conns)
}

// Busy counts the proxied connections in the middle of an exchange (see
// proxyConn.busy) and returns how many there are in all. A planned
// handoff moves the VIP when none is busy: a connection idle at the move
// is closed cleanly (its client reconnects), one with a request in flight
// would lose it.
func (b *Balancer) Busy(quiet time.Duration) (busy, total int) {
	now := time.Now().UnixNano()
	conns := b.proxied()
	for _, c := range conns { // the kernel queues are read outside the lock
		if c.busy(now, quiet) {
			busy++
		}
	}
	return busy, len(conns)
}

// BackendInfo describes one backend for status output.
type BackendInfo struct {
	Address     string `json:"address"`
	Usable      bool   `json:"usable"`
	Connections int    `json:"connections"`
}

// Backends returns the current backends, sorted by address.
func (b *Balancer) Backends() []BackendInfo {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]BackendInfo, 0, len(b.pool.order))
	for _, a := range b.pool.order {
		be := b.pool.m[a]
		out = append(out, BackendInfo{Address: a, Usable: be.usable, Connections: len(be.conns)})
	}
	return out
}

// CloseConnections closes every connection to backend addr now, whatever
// its health: for a backend that stays in the set under the same address
// but is no longer what it was (an etcd member removed from the cluster
// whose address is also a seed).
func (b *Balancer) CloseConnections(addr, reason string) {
	b.mu.Lock()
	var conns []*proxyConn
	if be, ok := b.pool.m[addr]; ok {
		for c := range be.conns {
			conns = append(conns, c)
		}
	}
	b.mu.Unlock()
	if len(conns) > 0 {
		b.log.Info("closing connections to a backend", "backend", addr, "reason", reason, "connections", len(conns))
	}
	closeAll(conns)
}

// closeBackend closes addr's connections when its pending close p is due,
// if the backend is still down and p was not replaced or cancelled.
func (b *Balancer) closeBackend(addr string, p *pendingClose, reason string) {
	b.mu.Lock()
	if b.closing[addr] != p {
		b.mu.Unlock()
		return
	}
	delete(b.closing, addr)
	be, ok := b.pool.m[addr]
	var conns []*proxyConn
	if ok && !be.usable {
		for c := range be.conns {
			conns = append(conns, c)
		}
	}
	b.mu.Unlock()
	if len(conns) > 0 {
		b.log.Info("closing connections to a backend", "backend", addr, "reason", reason, "connections", len(conns))
		b.m.closed.WithLabelValues(reason).Add(float64(len(conns)))
	}
	closeAll(conns)
}

// serve forwards one client connection, trying up to Attempts backends.
func (b *Balancer) serve(ctx context.Context, client net.Conn) {
	tried := map[string]bool{}
	for range b.cfg.Attempts {
		b.mu.Lock()
		be, anyway := b.pool.pick(tried)
		b.mu.Unlock()
		if be == nil {
			break
		}
		tried[be.addr] = true
		dctx, cancel := context.WithTimeout(ctx, b.cfg.DialTimeout)
		server, err := b.cfg.Dial(dctx, "tcp", be.addr)
		cancel()
		if err != nil {
			b.mu.Lock()
			b.pool.done(be)
			b.mu.Unlock()
			if ctx.Err() != nil {
				break
			}
			b.m.dialErrors.WithLabelValues(be.addr).Inc()
			b.log.Debug("backend refused a connection; trying another", "backend", be.addr, "err", err)
			if b.cfg.OnDialError != nil {
				b.cfg.OnDialError(be.addr, err)
			}
			continue
		}
		b.proxy(be, &proxyConn{client: client, server: server}, anyway)
		return
	}
	if ctx.Err() == nil {
		b.noBackend(client.RemoteAddr().String())
	}
	reset(client)
}

// noBackend counts and logs (at most every 5 s) a client turned away
// because no backend took its connection.
func (b *Balancer) noBackend(client string) {
	b.m.rejected.Inc()
	b.mu.Lock()
	logIt := time.Since(b.lastNoB) > 5*time.Second
	if logIt {
		b.lastNoB = time.Now()
	}
	n := len(b.pool.m)
	b.mu.Unlock()
	if logIt {
		b.log.Warn("no usable backend; closing client connections (logged every 5s)", "backends_known", n, "client", client)
	}
}

// proxy copies both ways until both sides are done or the pair is closed.
// anyway: the picker chose be although it was not usable (a last resort).
func (b *Balancer) proxy(be *backend, pc *proxyConn, anyway bool) {
	b.mu.Lock()
	if !b.stillWantedLocked(pc.client, be, anyway) {
		b.pool.done(be)
		b.mu.Unlock()
		pc.close()
		return
	}
	be.conns[pc] = struct{}{}
	be.m.active.Inc()
	be.m.accepted.Inc()
	b.mu.Unlock()
	b.pump(be, pc, resume{})
}

// resume is where an event loop's connection stands when it is handed
// over to goroutines (see evloop.handOver); the zero value is a new one.
type resume struct {
	upDone, downDone       bool      // that direction finished (FIN passed on)
	halfCloseAt            time.Time // when one has: its deadline
	pendingUp, pendingDown []byte    // read, not yet written
	bulkUp, bulkDown       bool      // splice from the start
}

// pump copies both ways until both sides are done or the pair is closed,
// then releases be; be.conns holds pc already.
func (b *Balancer) pump(be *backend, pc *proxyConn, st resume) {
	if b.cfg.IdleTimeout > 0 {
		pc.touch(b.cfg.IdleTimeout)
	}
	// A direction that finished gives the other its half-close deadline:
	// its reads are from the side that has not finished.
	if st.upDone {
		pc.finished.Add(1)
		_ = pc.server.SetReadDeadline(st.halfCloseAt)
	}
	if st.downDone {
		pc.finished.Add(1)
		_ = pc.client.SetReadDeadline(st.halfCloseAt)
	}
	done := make(chan int64, 1)
	if st.upDone {
		done <- 0
	} else {
		go func() {
			done <- b.pipe(&copier{dst: pc.server, src: pc.client, idle: b.cfg.IdleTimeout, pc: pc, last: &pc.lastUp,
				pending: st.pendingUp, bulk: st.bulkUp})
		}()
	}
	var down int64
	if !st.downDone {
		down = b.pipe(&copier{dst: pc.client, src: pc.server, idle: b.cfg.IdleTimeout, pc: pc, last: &pc.lastDown,
			pending: st.pendingDown, bulk: st.bulkDown})
	}
	up := <-done
	pc.close()
	b.m.toBackend.Add(float64(up))
	b.m.toClient.Add(float64(down))

	b.mu.Lock()
	delete(be.conns, pc)
	b.pool.done(be)
	be.m.active.Dec()
	b.mu.Unlock()
}

// pipe runs one direction. On a clean end of its source it half-closes
// the destination, so the other direction can finish (a client that shut
// down writing still reads the answer), and gives that direction
// HalfCloseTimeout to do so: its reads from dst get that deadline. On an
// error, a deadline among them, it closes the pair, or the other direction
// could wait forever on a peer that is gone.
func (b *Balancer) pipe(c *copier) int64 {
	dst := c.dst
	n, err := c.copy()
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			b.m.closed.WithLabelValues("timeout").Inc()
		}
		c.pc.close()
		return n
	}
	if c.pc.finished.Add(1) == 2 {
		// The other direction ended cleanly too: both peers finished
		// sending and everything was forwarded, so closing sends the FIN
		// that a half-close would, one system call sooner (the common end
		// of a short connection, as HAProxy ends it).
		c.pc.close()
		return n
	}
	if cw, ok := dst.(interface{ CloseWrite() error }); ok {
		if cw.CloseWrite() == nil {
			// The other direction reads from dst. With an idle timeout,
			// its next read would push this deadline out again: the
			// idle timeout then stands in for this one only while bytes
			// still flow.
			_ = dst.SetReadDeadline(time.Now().Add(b.cfg.HalfCloseTimeout))
			return n
		}
	}
	c.pc.close()
	return n
}

// sourceAddr is c's remote IP address (IPv4-mapped IPv6 unmapped).
func sourceAddr(c net.Conn) netip.Addr {
	if ta, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		if ap := ta.AddrPort(); ap.IsValid() {
			return ap.Addr().Unmap()
		}
	}
	return netip.Addr{}
}

// reset closes c with an RST rather than a FIN, so a client learns at once
// that the connection is gone and does not take it for a clean end.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	c.Close()
}

func closeAll(conns []*proxyConn) {
	for _, c := range conns {
		c.close()
	}
}

func boolFloat(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// Close closes the listener of a balancer that never ran; Run closes it
// otherwise.
func (b *Balancer) Close() {
	b.stopOnce.Do(func() { close(b.stopCh) })
	b.ln.Close()
	for _, ln := range b.also {
		ln.Close()
	}
}
