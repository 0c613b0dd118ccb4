package lab

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/vigil-ha/vigil/internal/netns"
)

// Respond runs the node-side UDP responder: every datagram is answered with
// its first 8 bytes (the probe's sequence number) followed by the node name.
func Respond(ctx context.Context, name string, port int) error {
	// "udp" on the wildcard address: one socket for both families.
	conn, err := net.ListenUDP("udp", &net.UDPAddr{Port: port})
	if err != nil {
		return fmt.Errorf("responder: %w", err)
	}
	go func() {
		<-ctx.Done()
		conn.Close()
	}()
	buf := make([]byte, 64)
	for {
		n, from, err := conn.ReadFromUDP(buf)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("responder: %w", err)
		}
		if n < 8 {
			continue
		}
		out := append(append([]byte{}, buf[:8]...), name...)
		_, _ = conn.WriteToUDP(out, from) // a lost reply is a lost probe; the prober counts it
	}
}

// reply is one answer received by the prober.
type reply struct {
	at   time.Time
	node string
}

// prober sends a datagram to one VIP address every interval from the
// client namespace and records who answered and when.
type prober struct {
	vip  netip.Addr
	conn *net.UDPConn
	wg   sync.WaitGroup
	stop chan struct{}

	mu      sync.Mutex // guards replies, maxSeq and late
	replies []reply
	maxSeq  uint64
	// late counts replies that arrived after a reply to a later probe: a
	// node that was cut off can hold a reply in its ARP queue (waiting to
	// resolve the client's address) and deliver it when its link comes
	// back, seconds later. Such a reply says where a probe went before the
	// fault, not who holds the VIP now, so it is left out.
	late int
}

// listenInClient opens a UDP socket in the client namespace, on the
// wildcard address of vip's family.
func listenInClient(vip netip.Addr) (*net.UDPConn, error) {
	wildcard := net.IPv4zero
	if vip.Is6() {
		wildcard = net.IPv6unspecified
	}
	return netns.ListenUDP(clientNS, &net.UDPAddr{IP: wildcard})
}

func startProber(interval time.Duration, vip netip.Addr) (*prober, error) {
	conn, err := listenInClient(vip)
	if err != nil {
		return nil, fmt.Errorf("prober: %w", err)
	}
	p := &prober{vip: vip, conn: conn, stop: make(chan struct{})}
	dst := &net.UDPAddr{IP: vip.AsSlice(), Port: ResponderPort}
	p.wg.Add(2)
	go func() {
		defer p.wg.Done()
		t := time.NewTicker(interval)
		defer t.Stop()
		var seq uint64
		buf := make([]byte, 8)
		for {
			seq++
			binary.BigEndian.PutUint64(buf, seq)
			_, _ = conn.WriteToUDP(buf, dst) // unreachable while ARP resolves: that is the outage being measured
			select {
			case <-p.stop:
				return
			case <-t.C:
			}
		}
	}()
	go func() {
		defer p.wg.Done()
		buf := make([]byte, 64)
		for {
			n, _, err := conn.ReadFromUDP(buf)
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				continue
			}
			if n <= 8 {
				continue
			}
			seq := binary.BigEndian.Uint64(buf[:8])
			r := reply{at: time.Now(), node: string(buf[8:n])}
			p.mu.Lock()
			if seq < p.maxSeq {
				p.late++
			} else {
				p.maxSeq = seq
				p.replies = append(p.replies, r)
			}
			p.mu.Unlock()
		}
	}()
	return p, nil
}

func (p *prober) snapshot() []reply {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]reply(nil), p.replies...)
}

// lateReplies counts the replies left out as late.
func (p *prober) lateReplies() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.late
}

// close stops the prober and returns every reply. Safe to call twice.
func (p *prober) close() []reply {
	select {
	case <-p.stop:
	default:
		close(p.stop)
		p.conn.Close()
	}
	p.wg.Wait()
	return p.snapshot()
}

// probeOnce asks the VIP address vip once and returns the name of the node
// that answered.
func probeOnce(ctx context.Context, vip netip.Addr, timeout time.Duration) (string, error) {
	conn, err := listenInClient(vip)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	dst := &net.UDPAddr{IP: vip.AsSlice(), Port: ResponderPort}
	deadline := time.Now().Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	_ = conn.SetReadDeadline(deadline)
	if _, err := conn.WriteToUDP(make([]byte, 8), dst); err != nil {
		return "", err
	}
	buf := make([]byte, 64)
	n, _, err := conn.ReadFromUDP(buf)
	if err != nil {
		return "", err
	}
	if n <= 8 {
		return "", errors.New("short reply")
	}
	return string(buf[8:n]), nil
}

// monitor samples, every interval, which live nodes have the VIP and
// remembers every moment two or more had it at once.
type monitor struct {
	w    *vipWatch
	live func() []*Node
	wg   sync.WaitGroup
	stop chan struct{}

	mu     sync.Mutex // guards the fields below
	double []doubleHold
	errs   int
	// holder, once expect names it, is where the VIP should stay; left is
	// the first sample since then that found it anywhere else (or
	// nowhere).
	holder string
	left   time.Time
}

type doubleHold struct {
	at      time.Time
	holders []string
}

func startMonitor(w *vipWatch, live func() []*Node, interval time.Duration) *monitor {
	m := &monitor{w: w, live: live, stop: make(chan struct{})}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			h, err := w.holders(m.live())
			m.mu.Lock()
			if err != nil {
				m.errs++
			} else {
				if len(h) > 1 {
					m.double = append(m.double, doubleHold{at: time.Now(), holders: h})
				}
				if m.holder != "" && m.left.IsZero() && !slices.Equal(h, []string{m.holder}) {
					m.left = time.Now()
				}
			}
			m.mu.Unlock()
			select {
			case <-m.stop:
				return
			case <-t.C:
			}
		}
	}()
	return m
}

// expect starts watching for the VIP to leave holder (leftAt).
func (m *monitor) expect(holder string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.holder, m.left = holder, time.Time{}
}

// leftAt is when a sample first found the VIP off the holder that expect
// named: zero if none did.
func (m *monitor) leftAt() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.left
}

// close stops sampling and returns the double holds seen. Safe to call twice.
func (m *monitor) close() []doubleHold {
	select {
	case <-m.stop:
	default:
		close(m.stop)
	}
	m.wg.Wait()
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]doubleHold(nil), m.double...)
}
