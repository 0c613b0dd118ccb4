package bfd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/vigil-ha/vigil/internal/validate"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
)

// Port is where single-hop BFD control packets go (RFC 5881, 4).
const Port = 3784

// idleTx is the slowest a session that is not Up may send (RFC 5880,
// 6.8.3: at least one second).
const idleTx = time.Second

// Defaults for Config.
const (
	DefaultInterval   = 300 * time.Millisecond
	DefaultMultiplier = 3
	// MinInterval is the shortest interval accepted: below it, on a busy
	// node, a late packet is more likely than a dead router.
	MinInterval = 50 * time.Millisecond
)

// Config is one session: to Peer, from Local, each side sending every
// Interval once Up and declaring the other down after Multiplier intervals
// without a packet.
type Config struct {
	Local, Peer netip.Addr
	Interval    time.Duration
	Multiplier  uint8
}

// Validate checks c and names the flag that is wrong.
func (c Config) Validate() error {
	if err := ValidateTimers(c.Interval, c.Multiplier); err != nil {
		return err
	}
	if !c.Peer.IsValid() || !c.Local.IsValid() || c.Peer.Is4() != c.Local.Is4() {
		return fmt.Errorf("%w: BFD to %v from %v: give a peer and a local address of one family", validate.ErrInvalid, c.Peer, c.Local)
	}
	return nil
}

// ValidateTimers checks a session's interval and multiplier.
func ValidateTimers(interval time.Duration, multiplier uint8) error {
	switch {
	case interval < MinInterval || interval > time.Minute:
		return fmt.Errorf("%w: `bgpBfdInterval` %v: give %v to 1m (300ms is usual)", validate.ErrInvalid, interval, MinInterval)
	case interval%time.Microsecond != 0:
		return fmt.Errorf("%w: `bgpBfdInterval` %v: BFD counts in microseconds", validate.ErrInvalid, interval)
	case multiplier == 0:
		return fmt.Errorf("%w: `bgpBfdMultiplier` 0: give 1 to 255 (3 is usual): a peer is declared down after this many intervals without a packet", validate.ErrInvalid)
	}
	return nil
}

// validate.ErrInvalid is wrapped by every configuration error.

// Status is a session's state, for status reports and metrics.
type Status struct {
	Peer  string `json:"peer"`
	State string `json:"state"`
	// Diag is why the session last went down ("none" if it never did).
	Diag string `json:"diag"`
	Up   bool   `json:"up"`
}

// Mux receives every session's control packets on port 3784 and hands
// each to its session.
type Mux struct {
	log *slog.Logger

	mu       sync.Mutex
	byDisc   map[uint32]*Session
	byPeer   map[netip.Addr]*Session
	conns    []net.PacketConn
	closed   bool
	stopRecv context.CancelFunc
	wg       sync.WaitGroup
}

// Listen opens the receive sockets: IPv4 if v4, IPv6 if v6.
func Listen(v4, v6 bool, log *slog.Logger) (*Mux, error) {
	m := &Mux{log: log.With("component", "bfd"), byDisc: map[uint32]*Session{}, byPeer: map[netip.Addr]*Session{}}
	ctx, cancel := context.WithCancel(context.Background())
	m.stopRecv = cancel
	// open listens on network's port 3784, with wrap asking the kernel
	// for each packet's TTL (hop limit) and reading it.
	open := func(network, addr string, wrap func(net.PacketConn) (func([]byte) (int, int, net.Addr, error), error)) error {
		c, err := net.ListenPacket(network, addr)
		if err != nil {
			return fmt.Errorf("bfd: listen on UDP port %d: %w", Port, err)
		}
		read, err := wrap(c)
		if err != nil {
			c.Close()
			return fmt.Errorf("bfd: %w", err)
		}
		m.serve(ctx, c, read)
		return nil
	}
	if v4 {
		err := open("udp4", fmt.Sprintf("0.0.0.0:%d", Port), func(c net.PacketConn) (func([]byte) (int, int, net.Addr, error), error) {
			p := ipv4.NewPacketConn(c)
			return func(b []byte) (int, int, net.Addr, error) {
				n, cm, src, err := p.ReadFrom(b)
				if cm == nil {
					return n, -1, src, err
				}
				return n, cm.TTL, src, err
			}, p.SetControlMessage(ipv4.FlagTTL, true)
		})
		if err != nil {
			m.Close()
			return nil, err
		}
	}
	if v6 {
		err := open("udp6", fmt.Sprintf("[::]:%d", Port), func(c net.PacketConn) (func([]byte) (int, int, net.Addr, error), error) {
			p := ipv6.NewPacketConn(c)
			return func(b []byte) (int, int, net.Addr, error) {
				n, cm, src, err := p.ReadFrom(b)
				if cm == nil {
					return n, -1, src, err
				}
				return n, cm.HopLimit, src, err
			}, p.SetControlMessage(ipv6.FlagHopLimit, true)
		})
		if err != nil {
			m.Close()
			return nil, err
		}
	}
	return m, nil
}

// serve reads c's packets with read (which also gives the TTL or hop
// limit they arrived with) until ctx ends.
func (m *Mux) serve(ctx context.Context, c net.PacketConn, read func([]byte) (n, ttl int, src net.Addr, err error)) {
	m.conns = append(m.conns, c)
	m.wg.Go(func() {
		buf := make([]byte, 128)
		for ctx.Err() == nil {
			n, ttl, src, err := read(buf)
			if err != nil {
				if ctx.Err() == nil {
					m.log.Warn("BFD receive failed", "err", err)
				}
				return
			}
			m.receive(buf[:n], src, ttl)
		}
	})
}

// receive hands a packet to its session: by our discriminator when the
// peer knows it, by the peer's address before.
func (m *Mux) receive(b []byte, src net.Addr, ttl int) {
	ua, ok := src.(*net.UDPAddr)
	if !ok {
		return
	}
	from := ua.AddrPort().Addr().Unmap()
	// RFC 5881, 5: single-hop packets are sent with TTL 255, so one that
	// arrives with less came from further away (GTSM).
	if ttl != 255 {
		return
	}
	p, err := Parse(b)
	if err != nil {
		return
	}
	m.mu.Lock()
	s := m.byPeer[from]
	if p.YourDisc != 0 {
		s = m.byDisc[p.YourDisc]
	}
	m.mu.Unlock()
	if s == nil || s.cfg.Peer != from {
		return
	}
	select {
	case s.in <- p:
	default: // the session is behind; the next packet will do
	}
}

// Close stops every session (each tells its peer AdminDown) and the
// receive sockets.
func (m *Mux) Close() {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return
	}
	m.closed = true
	var sessions []*Session
	for _, s := range m.byDisc {
		sessions = append(sessions, s)
	}
	m.mu.Unlock()
	for _, s := range sessions {
		s.Close()
	}
	if m.stopRecv != nil {
		m.stopRecv()
	}
	for _, c := range m.conns {
		c.Close()
	}
	m.wg.Wait()
}

// Session is one BFD session.
type Session struct {
	cfg      Config
	m        *Mux
	log      *slog.Logger
	conn     net.PacketConn
	in       chan Packet
	onChange func(Status)
	cancel   context.CancelFunc
	done     chan struct{}

	mu    sync.Mutex
	state State
	diag  Diag
	// myDisc is ours, remoteDisc the peer's (0 until it told us).
	myDisc, remoteDisc uint32
}

// Add starts a session to cfg.Peer. onChange, if not nil, is called on
// every change of state, from the session's goroutine.
func (m *Mux) Add(cfg Config, onChange func(Status)) (*Session, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	conn, err := sendSocket(cfg.Local)
	if err != nil {
		return nil, err
	}
	s := &Session{cfg: cfg, m: m, log: m.log.With("peer", cfg.Peer), conn: conn, in: make(chan Packet, 16),
		onChange: onChange, done: make(chan struct{}), state: Down}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		conn.Close()
		return nil, errors.New("bfd: closed")
	}
	if _, dup := m.byPeer[cfg.Peer]; dup {
		m.mu.Unlock()
		conn.Close()
		return nil, fmt.Errorf("%w: two BFD sessions to %s", validate.ErrInvalid, cfg.Peer)
	}
	for s.myDisc == 0 || m.byDisc[s.myDisc] != nil {
		s.myDisc = rand.Uint32()
	}
	m.byDisc[s.myDisc] = s
	m.byPeer[cfg.Peer] = s
	m.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	go s.run(ctx)
	return s, nil
}

// sendSocket is a UDP socket from local, with a source port in 49152 to
// 65535 and TTL 255, as RFC 5881 asks.
func sendSocket(local netip.Addr) (net.PacketConn, error) {
	var lastErr error
	for range 32 {
		port := 49152 + rand.IntN(65536-49152)
		c, err := net.ListenPacket("udp", netip.AddrPortFrom(local, uint16(port)).String())
		if err != nil {
			lastErr = err
			continue
		}
		if local.Is4() {
			err = ipv4.NewPacketConn(c).SetTTL(255)
		} else {
			err = ipv6.NewPacketConn(c).SetHopLimit(255)
		}
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("bfd: TTL 255: %w", err)
		}
		return c, nil
	}
	return nil, fmt.Errorf("bfd: no free source port from %s: %w", local, lastErr)
}

// Status reports the session's state.
func (s *Session) Status() Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	return Status{Peer: s.cfg.Peer.String(), State: s.state.String(), Diag: s.diag.String(), Up: s.state == Up}
}

// Close stops the session, telling the peer AdminDown first.
func (s *Session) Close() {
	s.cancel()
	<-s.done
	s.m.mu.Lock()
	delete(s.m.byDisc, s.myDisc)
	delete(s.m.byPeer, s.cfg.Peer)
	s.m.mu.Unlock()
	s.conn.Close()
}

// run is the session: RFC 5880 6.8.6 on every packet, 6.8.4 on the
// detection timer, 6.8.7 for transmission.
func (s *Session) run(ctx context.Context) {
	defer close(s.done)
	var (
		remoteMinRx   = uint32(1)         // µs; 1 until the peer said (RFC 5880 6.8.1)
		remoteMinTx   uint32              // µs, the peer's desired interval
		remoteMult    uint8               // the peer's detect multiplier
		polling       bool                // our Poll Sequence is running
		lastDesiredTx = s.desiredTx(Down) // what we last advertised
		lastRx        time.Time
		txStopped     bool
	)
	tx := time.NewTimer(0)
	defer tx.Stop()
	detect := time.NewTimer(time.Hour)
	detect.Stop()
	defer detect.Stop()

	send := func(final bool) {
		s.mu.Lock()
		p := Packet{Diag: s.diag, State: s.state, DetectMult: s.cfg.Multiplier, MyDisc: s.myDisc, YourDisc: s.remoteDisc,
			DesiredMinTx: micros(s.desiredTx(s.state)), RequiredMinRx: micros(s.cfg.Interval)}
		s.mu.Unlock()
		p.Final = final
		p.Poll = polling && !final
		if _, err := s.conn.WriteTo(p.Marshal(), net.UDPAddrFromAddrPort(netip.AddrPortFrom(s.cfg.Peer, Port))); err != nil {
			s.log.Debug("BFD send failed", "err", err)
		}
	}
	// nextTx is the time to the next periodic packet: the larger of what
	// we want and what the peer accepts, less 0 to 25 % of jitter (up to
	// 10 % more with a multiplier of 1, RFC 5880 6.8.7).
	nextTx := func() time.Duration {
		s.mu.Lock()
		iv := max(s.desiredTx(s.state), time.Duration(remoteMinRx)*time.Microsecond)
		s.mu.Unlock()
		jitter := 0.75 + 0.25*rand.Float64()
		if s.cfg.Multiplier == 1 {
			jitter = 0.75 + 0.15*rand.Float64()
		}
		return time.Duration(float64(iv) * jitter)
	}
	detectionTime := func() time.Duration {
		return time.Duration(remoteMult) * max(s.cfg.Interval, time.Duration(remoteMinTx)*time.Microsecond)
	}
	setState := func(st State, d Diag) {
		s.mu.Lock()
		was := s.state
		s.state, s.diag = st, d
		s.mu.Unlock()
		if was == st {
			return
		}
		if now := s.desiredTx(st); now != lastDesiredTx {
			// A changed interval is announced with a Poll Sequence
			// (RFC 5880 6.8.3).
			lastDesiredTx, polling = now, true
		}
		switch {
		case st == Up:
			s.log.Info("BFD session up", "interval", s.cfg.Interval, "multiplier", s.cfg.Multiplier)
		case was == Up:
			s.log.Warn("BFD session down", "state", st, "diag", d)
		}
		if s.onChange != nil {
			s.onChange(s.Status())
		}
	}

	for {
		select {
		case <-ctx.Done():
			// Tell the peer this side stops on purpose (RFC 5880 6.8.16);
			// a peer does not count AdminDown as a failure of the path.
			setState(AdminDown, DiagAdminDown)
			for range 3 {
				send(false)
			}
			return
		case <-tx.C:
			send(false)
			tx.Reset(nextTx())
		case <-detect.C:
			s.mu.Lock()
			st := s.state
			s.remoteDisc = 0
			s.mu.Unlock()
			if st == Init || st == Up {
				setState(Down, DiagDetectionExpired)
				s.log.Debug("BFD detection time passed", "since_last_packet", time.Since(lastRx).Round(time.Millisecond))
			}
		case p := <-s.in:
			lastRx = time.Now()
			s.mu.Lock()
			st := s.state
			was := st
			s.remoteDisc = p.MyDisc
			s.mu.Unlock()
			remoteMinRx, remoteMinTx, remoteMult = p.RequiredMinRx, p.DesiredMinTx, p.DetectMult
			if p.Final {
				polling = false
			}
			switch {
			case p.State == AdminDown:
				if st != Down {
					setState(Down, DiagNeighborDown)
				}
			case st == Down && p.State == Down:
				setState(Init, DiagNone)
			case st == Down && p.State == Init, st == Init && (p.State == Init || p.State == Up):
				setState(Up, DiagNone)
			case st == Up && p.State == Down:
				setState(Down, DiagNeighborDown)
			}
			if p.Poll {
				// Answer a Poll at once, with Final (6.8.6).
				send(true)
			}
			s.mu.Lock()
			st = s.state
			s.mu.Unlock()
			if st == Init || st == Up {
				detect.Reset(detectionTime())
			} else {
				detect.Stop()
			}
			switch {
			case remoteMinRx == 0:
				// The peer asks for no periodic packets (6.8.7).
				tx.Stop()
				txStopped = true
			case txStopped || st != was:
				// Again, or at the new state's interval at once rather
				// than after the old one.
				txStopped = false
				tx.Reset(nextTx())
			}
		}
	}
}

// desiredTx is the interval advertised in state st: one second at least
// while the session is not Up (RFC 5880 6.8.3).
func (s *Session) desiredTx(st State) time.Duration {
	if st != Up {
		return max(s.cfg.Interval, idleTx)
	}
	return s.cfg.Interval
}

func micros(d time.Duration) uint32 { return uint32(d / time.Microsecond) }
