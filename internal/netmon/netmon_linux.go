//go:build linux

package netmon

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Monitor follows the links and addresses of the network namespace it was
// created in. New reads them, Run keeps them current, Close ends it.
type Monitor struct {
	h    *netlink.Handle // bound to the namespace of New's thread
	ns   netns.NsHandle  // that namespace, for subscribing again (None if unknown)
	log  *slog.Logger
	hint chan struct{} // a netlink event arrived (coalesced)
	lost chan struct{} // a subscription ended by itself

	sub  chan struct{}  // closed to end the current subscriptions
	wg   sync.WaitGroup // their forwarders
	once sync.Once

	mu   sync.Mutex // guards cur and subs
	cur  state
	subs []chan struct{}
}

// resubscribeWait is how long Run waits before it tries again to subscribe.
const resubscribeWait = time.Second

// New subscribes to link and address events, then reads the current state
// (in that order, so no change falls between the two), in the network
// namespace of the calling thread.
func New(log *slog.Logger) (*Monitor, error) {
	// The handle and the first subscriptions are opened on this thread,
	// in its namespace: entering a namespace (setns) would need
	// CAP_SYS_ADMIN, which vigil's container does not have.
	h, err := netlink.NewHandle()
	if err != nil {
		return nil, fmt.Errorf("netmon: open netlink: %w", err)
	}
	ns, err := netns.Get()
	if err != nil {
		ns = netns.None() // subscribe again in the namespace of whichever thread does
	}
	m := &Monitor{h: h, ns: ns, log: log.With("part", "netmon"), hint: make(chan struct{}, 1), lost: make(chan struct{}, 1)}
	if err := m.subscribe(); err != nil {
		m.Close()
		return nil, err
	}
	if m.cur, err = m.read(); err != nil {
		m.Close()
		return nil, err
	}
	return m, nil
}

// subscribe starts a subscription to link events and one to address
// events, each forwarded as hints. If either ends by itself (a receive
// error, such as an overflow of its buffer), lost says so.
func (m *Monitor) subscribe() error {
	// Named only when this thread is in another namespace than the
	// monitor's (a test's netns.Do): then the library enters it, as root.
	var at *netns.NsHandle
	if cur, err := netns.Get(); err == nil {
		if m.ns.IsOpen() && !cur.Equal(m.ns) {
			at = &m.ns
		}
		_ = cur.Close()
	}
	sub := make(chan struct{}) // the forwarders' own copy: m.sub changes when Run subscribes again
	m.sub = sub
	links := make(chan netlink.LinkUpdate, 64)
	addrs := make(chan netlink.AddrUpdate, 64)
	errf := func(err error) { m.log.Debug("netlink subscription ended", "err", err) }
	if err := netlink.LinkSubscribeWithOptions(links, sub, netlink.LinkSubscribeOptions{Namespace: at, ErrorCallback: errf, ReceiveBufferSize: 1 << 20}); err != nil {
		close(m.sub)
		m.sub = nil
		return fmt.Errorf("netmon: subscribe to link events: %w", err)
	}
	if err := netlink.AddrSubscribeWithOptions(addrs, sub, netlink.AddrSubscribeOptions{Namespace: at, ErrorCallback: errf, ReceiveBufferSize: 1 << 20}); err != nil {
		close(m.sub) // ends the link subscription
		m.sub = nil
		for range links {
		}
		return fmt.Errorf("netmon: subscribe to address events: %w", err)
	}
	m.wg.Go(func() { forward(links, m.hint, sub, m.lost) })
	m.wg.Go(func() { forward(addrs, m.hint, sub, m.lost) })
	return nil
}

// unsubscribe ends the current subscriptions, if any, and waits for
// their forwarders.
func (m *Monitor) unsubscribe() {
	if m.sub != nil {
		close(m.sub)
		m.sub = nil
	}
	m.wg.Wait()
}

// forward turns every event on in into a hint, until in is closed; a close
// that stop did not ask for is reported on lost.
func forward[T any](in <-chan T, hint chan<- struct{}, stop <-chan struct{}, lost chan<- struct{}) {
	for range in {
		select {
		case hint <- struct{}{}:
		default:
		}
	}
	select {
	case <-stop:
	default:
		select {
		case lost <- struct{}{}:
		default:
		}
	}
}

// read asks the kernel for every link and address.
func (m *Monitor) read() (state, error) {
	lks, err := m.h.LinkList()
	if err != nil {
		return state{}, fmt.Errorf("netmon: list links: %w", err)
	}
	as, err := m.h.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return state{}, fmt.Errorf("netmon: list addresses: %w", err)
	}
	s := state{links: make(map[string]Link, len(lks))}
	for _, lk := range lks {
		a := lk.Attrs()
		s.links[a.Name] = Link{Name: a.Name, Index: a.Index, MTU: a.MTU, MAC: slices.Clone(a.HardwareAddr),
			Up: a.Flags&net.FlagUp != 0, Carrier: a.RawFlags&unix.IFF_LOWER_UP != 0}
	}
	for _, a := range as {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok {
			continue
		}
		ones, _ := a.Mask.Size()
		s.ifaddrs = append(s.ifaddrs, ifaddr{index: a.LinkIndex, prefix: netip.PrefixFrom(ip.Unmap(), ones)})
		s.addrs = append(s.addrs, ip.Unmap())
	}
	slices.SortFunc(s.ifaddrs, ifaddr.compare)
	slices.SortFunc(s.addrs, netip.Addr.Compare)
	s.addrs = slices.Compact(s.addrs)
	return s, nil
}

// Run reads the state again after every burst of events, and tells the
// subscribers when it changed, until ctx ends.
func (m *Monitor) Run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-m.hint:
		case <-m.lost:
			// Events may have been missed: subscribe again, then read
			// everything.
			m.unsubscribe()
			for {
				err := m.subscribe()
				if err == nil {
					break
				}
				m.log.Warn("cannot follow link and address events; trying again", "err", err)
				select {
				case <-ctx.Done():
					return
				case <-time.After(resubscribeWait):
				}
			}
			m.log.Info("following link and address events again")
		}
		s, err := m.read()
		if err != nil {
			m.log.Warn("cannot read links and addresses; keeping the last", "err", err)
			continue
		}
		m.mu.Lock()
		changed := !s.equal(m.cur)
		m.cur = s
		subs := m.subs
		m.mu.Unlock()
		if !changed {
			continue
		}
		for _, c := range subs {
			select {
			case c <- struct{}{}:
			default:
			}
		}
	}
}

// Changes returns a new channel that receives a value (coalesced) after
// every change Run reads.
func (m *Monitor) Changes() <-chan struct{} {
	c := make(chan struct{}, 1)
	m.mu.Lock()
	m.subs = append(m.subs, c)
	m.mu.Unlock()
	return c
}

// Link returns the interface called name.
func (m *Monitor) Link(name string) (Link, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	l, ok := m.cur.links[name]
	if !ok {
		return Link{}, fmt.Errorf("%w: %q", ErrNoLink, name)
	}
	l.MAC = slices.Clone(l.MAC)
	return l, nil
}

// InterfaceByName is net.InterfaceByName from the cache.
func (m *Monitor) InterfaceByName(name string) (*net.Interface, error) {
	l, err := m.Link(name)
	if err != nil {
		return nil, err
	}
	return l.Interface(), nil
}

// Addrs returns every address of every link (IPv4 unmapped), sorted.
func (m *Monitor) Addrs() []netip.Addr {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.cur.addrs)
}

// Close ends the subscriptions. Call it after Run has returned.
func (m *Monitor) Close() {
	m.once.Do(func() {
		m.unsubscribe()
		m.h.Close()
		_ = m.ns.Close()
	})
}
