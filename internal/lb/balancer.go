package lb

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
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
	// DefaultDialTimeout bounds a connection attempt to one backend. A live
	// API server on the same L2 segment answers a SYN in well under a
	// millisecond; a second leaves room for a busy one, and a silent backend
	// (powered off) costs one second before the next one is tried.
	DefaultDialTimeout = time.Second
	// DefaultAttempts is how many backends one client connection may try.
	DefaultAttempts = 3
	// DefaultDrainTimeout bounds how long connections to a draining backend
	// (answering, but failing /readyz) are left to finish. kube-apiserver's
	// --shutdown-delay-duration is typically up to 70 s in managed clusters,
	// and the server closes its connections itself when it exits.
	DefaultDrainTimeout = 90 * time.Second
)

// Config configures a Balancer.
type Config struct {
	// Listen is the address the balancer accepts on, VIP:port.
	Listen string
	Policy Policy
	// FreeBind lets the listener bind the VIP while this node does not hold
	// it (IP_FREEBIND), so it is open, and any port conflict found, before
	// the node ever leads.
	FreeBind     bool
	DialTimeout  time.Duration
	Attempts     int
	DrainTimeout time.Duration
	// Dial connects to a backend; nil uses net.Dialer.
	Dial func(ctx context.Context, network, address string) (net.Conn, error)
	// OnDialError is told about every failed connection attempt to a
	// backend (passive health checking: the checker marks it dead).
	OnDialError func(backend string, err error)
	// Metrics receives the balancer's metrics; nil keeps them private.
	Metrics prometheus.Registerer
	// Standby starts the balancer not serving (see SetServing).
	Standby bool
	// TryAllWhenNoneUsable: when no backend passes its checks, try the
	// known ones anyway (least connections first) instead of resetting the
	// client. Health checks can all fail at once for reasons that are not
	// the backends' (an overloaded or briefly cut-off client host); a
	// client turned away then backs off, often for many seconds (gRPC's
	// reconnect backoff), while a dial would have worked. Backends that
	// refuse still fail fast.
	TryAllWhenNoneUsable bool
	// ReusePort sets SO_REUSEPORT on the listener, so that a new process
	// can bind the same address before the old one exits (an upgrade of
	// the worker agent without a moment with nothing listening).
	ReusePort bool
}

// Balancer forwards TCP connections to usable backends. TLS passes through
// untouched: clients verify the API server's own certificate, whose SANs must
// include the VIP (kubeadm: controlPlaneEndpoint or apiServer.certSANs).
type Balancer struct {
	cfg Config
	log *slog.Logger
	ln  net.Listener
	m   *metrics

	mu      sync.Mutex // guards the fields below
	pool    *pool
	drains  map[string]*time.Timer
	closed  bool
	serving bool
	clients map[net.Conn]struct{} // every accepted connection until it ends
	lastNoB time.Time

	wg sync.WaitGroup // connection goroutines
}

// proxyConn is one client connection and its backend connection.
type proxyConn struct {
	client, server net.Conn
	once           sync.Once
}

func (c *proxyConn) close() {
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
	if cfg.Dial == nil {
		// No TCP keepalive towards backends: they are health-checked, and a
		// dead one has its connections closed. That saves four setsockopt
		// calls per connection.
		cfg.Dial = (&net.Dialer{KeepAlive: -1}).DialContext
	}
	if cfg.DialTimeout < 0 || cfg.Attempts < 1 || cfg.DrainTimeout < 0 {
		return nil, fmt.Errorf("%w: dial timeout, attempts and drain timeout must be positive", ErrInvalidConfig)
	}
	host, port, err := net.SplitHostPort(cfg.Listen)
	if err != nil || host == "" {
		return nil, fmt.Errorf("%w: listen address %q must be IP:PORT", ErrInvalidConfig, cfg.Listen)
	}
	ln, err := listen(cfg.Listen, cfg.FreeBind, cfg.ReusePort)
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return nil, fmt.Errorf("%w: cannot listen on %s: something already listens on port %s of all or this address. "+
				"If it is kube-apiserver bound to 0.0.0.0, start it with --bind-address set to the node's own IP, "+
				"or give vigil another --lb-port (such as 8443) and use that in controlPlaneEndpoint", ErrPortInUse, cfg.Listen, port)
		}
		return nil, fmt.Errorf("listen on %s: %w", cfg.Listen, err)
	}
	b := &Balancer{
		cfg:     cfg,
		log:     log.With("listen", cfg.Listen),
		ln:      ln,
		pool:    newPool(cfg.Policy),
		drains:  map[string]*time.Timer{},
		clients: map[net.Conn]struct{}{},
		serving: !cfg.Standby,
		m:       newMetrics(),
	}
	if cfg.Metrics != nil {
		if err := b.m.register(cfg.Metrics); err != nil {
			ln.Close()
			return nil, err
		}
	}
	return b, nil
}

// Addr is the listener's address.
func (b *Balancer) Addr() net.Addr { return b.ln.Addr() }

// Run accepts and forwards connections until ctx is cancelled, then closes
// the listener and every connection and waits for them.
func (b *Balancer) Run(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() { b.ln.Close() })
	defer stop()
	b.log.Info("load balancer listening", "policy", b.cfg.Policy.String())
	var backoff time.Duration
	for {
		c, err := b.ln.Accept()
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
		b.mu.Lock()
		ok := b.serving
		if ok {
			b.clients[c] = struct{}{}
		}
		b.mu.Unlock()
		if !ok {
			// Not the VIP holder (or just stopped being it): a stray
			// connection, told at once.
			reset(c)
			continue
		}
		b.wg.Add(1)
		go func() {
			defer b.wg.Done()
			b.serve(ctx, c)
			b.mu.Lock()
			delete(b.clients, c)
			b.mu.Unlock()
		}()
	}
	b.mu.Lock()
	b.closed = true
	for _, t := range b.drains {
		t.Stop()
	}
	b.mu.Unlock()
	b.CloseAll("load balancer stopping")
	b.wg.Wait()
	return nil
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
		if t := b.drains[be.addr]; t != nil {
			t.Stop()
			delete(b.drains, be.addr)
		}
		b.m.forget(be.addr)
		b.log.Info("backend removed", "backend", be.addr, "closing", len(be.conns))
	}
	b.m.usable.Set(float64(b.pool.usableCount()))
	b.m.known.Set(float64(len(b.pool.m)))
	b.mu.Unlock()
	closeAll(conns)
}

// Update applies a health change of one backend: up takes new connections;
// down takes none; dead also closes its connections at once, draining
// closes them only after the drain timeout.
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
	if t := b.drains[be.addr]; t != nil && (be.usable || st.Cause == health.Dead) {
		t.Stop()
		delete(b.drains, be.addr)
	}
	var conns []*proxyConn
	switch {
	case st.State == health.Down && st.Cause == health.Dead:
		for c := range be.conns {
			conns = append(conns, c)
		}
	case st.State == health.Down && st.Cause == health.Draining && len(be.conns) > 0 && b.drains[be.addr] == nil:
		addr := be.addr
		b.drains[addr] = time.AfterFunc(b.cfg.DrainTimeout, func() { b.closeBackend(addr, "drain timeout") })
		b.log.Info("backend draining; its connections may finish", "backend", addr, "connections", len(be.conns), "timeout", b.cfg.DrainTimeout)
	}
	b.mu.Unlock()
	if len(conns) > 0 {
		b.log.Info("closing connections to a dead backend", "backend", st.Backend, "connections", len(conns))
		b.m.closed.WithLabelValues("backend_dead").Add(float64(len(conns)))
		closeAll(conns)
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
	if !on {
		for c := range b.clients {
			clients = append(clients, c)
		}
	}
	b.mu.Unlock()
	if len(clients) > 0 {
		b.log.Info("resetting client connections: this node no longer serves the VIP", "connections", len(clients))
		b.m.closed.WithLabelValues("vip_moved").Add(float64(len(clients)))
	}
	for _, c := range clients {
		reset(c) // its serve goroutine closes the backend side
	}
}

// CloseAll closes every established connection.
func (b *Balancer) CloseAll(reason string) {
	b.mu.Lock()
	var conns []*proxyConn
	for _, be := range b.pool.m {
		for c := range be.conns {
			conns = append(conns, c)
		}
	}
	b.mu.Unlock()
	if len(conns) > 0 {
		b.log.Info("closing all proxied connections", "reason", reason, "connections", len(conns))
	}
	closeAll(conns)
}

// BackendInfo describes one backend for status output.
type BackendInfo struct {
	Address     string `json:"address"`
	Usable      bool   `json:"usable"`
	Tier        int    `json:"tier"`
	Connections int    `json:"connections"`
}

// SetTiers sets each named backend's preference tier (lower is preferred;
// see pool). Backends not named keep their tier.
func (b *Balancer) SetTiers(tiers map[string]int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for addr, t := range tiers {
		if be, ok := b.pool.m[addr]; ok {
			be.tier = t
		}
	}
}

// Backends returns the current backends in round-robin order.
func (b *Balancer) Backends() []BackendInfo {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]BackendInfo, 0, len(b.pool.order))
	for _, a := range b.pool.order {
		be := b.pool.m[a]
		out = append(out, BackendInfo{Address: a, Usable: be.usable, Tier: be.tier, Connections: len(be.conns)})
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

func (b *Balancer) closeBackend(addr, reason string) {
	b.mu.Lock()
	delete(b.drains, addr)
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
	}
	closeAll(conns)
}

// serve forwards one client connection, trying up to Attempts backends.
func (b *Balancer) serve(ctx context.Context, client net.Conn) {
	tried := map[string]bool{}
	for range b.cfg.Attempts {
		b.mu.Lock()
		be := b.pool.pick(tried)
		if be == nil && b.cfg.TryAllWhenNoneUsable && b.pool.usableCount() == 0 {
			be = b.pool.pickAny(tried)
		}
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
		b.proxy(be, &proxyConn{client: client, server: server})
		return
	}
	b.m.rejected.Inc()
	b.mu.Lock()
	logIt := time.Since(b.lastNoB) > 5*time.Second
	if logIt {
		b.lastNoB = time.Now()
	}
	n := len(b.pool.m)
	b.mu.Unlock()
	if logIt && ctx.Err() == nil {
		b.log.Warn("no usable backend; closing client connections (logged every 5s)", "backends_known", n, "client", client.RemoteAddr().String())
	}
	reset(client)
}

// proxy copies both ways until both sides are done or the pair is closed.
func (b *Balancer) proxy(be *backend, pc *proxyConn) {
	b.mu.Lock()
	// The backend may have gone down or been removed while we dialled,
	// or this node may have stopped serving.
	lastResort := b.cfg.TryAllWhenNoneUsable && b.pool.usableCount() == 0
	if _, ok := b.clients[pc.client]; b.closed || !ok || !b.serving || b.pool.m[be.addr] != be || (!be.usable && !lastResort) {
		b.pool.done(be)
		b.mu.Unlock()
		pc.close()
		return
	}
	be.conns[pc] = struct{}{}
	be.m.active.Inc()
	be.m.accepted.Inc()
	b.mu.Unlock()

	done := make(chan int64, 1)
	go func() { done <- pipe(pc.server, pc.client, pc) }()
	down := pipe(pc.client, pc.server, pc)
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

// pipe copies src to dst. On a clean end of src it half-closes dst, so the
// other direction can finish (a client that shut down writing still reads
// the answer); on an error it closes the pair, or the other direction could
// wait forever on a peer that is gone. See copyAdaptive for how bytes move.
func pipe(dst, src net.Conn, pc *proxyConn) int64 {
	n, err := copyAdaptive(dst, src)
	if err != nil {
		pc.close()
		return n
	}
	if cw, ok := dst.(interface{ CloseWrite() error }); ok {
		if cw.CloseWrite() == nil {
			return n
		}
	}
	pc.close()
	return n
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
func (b *Balancer) Close() { b.ln.Close() }
