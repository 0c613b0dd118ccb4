package lb

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vigil-ha/vigil/internal/clock"
	"github.com/vigil-ha/vigil/internal/validate"
)

// Errors.
var (
	// ErrPortInUse: something else listens on the VIP's port already; with
	// kubeadm that is a kube-apiserver bound to 0.0.0.0.
	ErrPortInUse = errors.New("lb: port in use")
)

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
		return nil, fmt.Errorf("%w: dial timeout, attempts, drain and half-close timeouts and unreachable grace must be positive", validate.ErrInvalid)
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
		return nil, fmt.Errorf("%w: listen address %q must be IP:PORT", validate.ErrInvalid, addr)
	}
	ln, err := listen(addr, cfg.FreeBind, cfg.ReusePort, !cfg.ServerSpeaksFirst)
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return nil, fmt.Errorf("%w: cannot listen on %s: something already listens on port %s of all or this address. "+
				"If it is kube-apiserver bound to 0.0.0.0, start it with --bind-address set to the node's own IP, "+
				"or give vigil `lbListenPort` (such as 16443: the holder then sends VIP:`lbPort` there with nftables), "+
				"or another `lbPort` (such as 8443) and use that in controlPlaneEndpoint", ErrPortInUse, addr, port)
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
			if !clock.Sleep(ctx, backoff) {
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

// eventLoops is how many event loops Run started (0: goroutines serve).
func (b *Balancer) eventLoops() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.loops)
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

// Close closes the listener of a balancer that never ran; Run closes it
// otherwise.
func (b *Balancer) Close() {
	b.stopOnce.Do(func() { close(b.stopCh) })
	b.ln.Close()
	for _, ln := range b.also {
		ln.Close()
	}
}
