//go:build linux

package vip

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

type netlinkLink struct {
	name string
}

func openLink(name string) (link, error) {
	if _, err := netlink.LinkByName(name); err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil, fmt.Errorf("%w: %q", ErrNoInterface, name)
		}
		return nil, fmt.Errorf("vip: look up interface %q: %w", name, err)
	}
	return &netlinkLink{name: name}, nil
}

// addr builds the netlink address. IPv6 VIPs skip duplicate address
// detection: the election already guarantees a single holder, and DAD would
// keep the address unusable for a second after every failover.
func addr(p netip.Prefix) *netlink.Addr {
	a := &netlink.Addr{IPNet: &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}}
	if p.Addr().Is6() {
		a.Flags = unix.IFA_F_NODAD
	}
	return a
}

func (l *netlinkLink) get() (netlink.Link, error) {
	lk, err := netlink.LinkByName(l.name)
	if err != nil {
		return nil, fmt.Errorf("look up %q: %w", l.name, err)
	}
	return lk, nil
}

func (l *netlinkLink) add(p netip.Prefix, lifetime time.Duration) (bool, error) {
	lk, err := l.get()
	if err != nil {
		return false, err
	}
	present, err := l.has(p)
	if err != nil {
		return false, err
	}
	a := addr(p)
	if lifetime > 0 {
		secs := int((lifetime + time.Second - 1) / time.Second)
		a.ValidLft, a.PreferedLft = secs, secs
	}
	// Replace adds the address, or resets the lifetime of the one there.
	if err := netlink.AddrReplace(lk, a); err != nil {
		return false, err
	}
	return !present, nil
}

// remove deletes every form of the VIP in this network namespace: on any
// interface (the configured one, lo, one it was renamed to), with any prefix
// length. Linux answers ARP and NDP on every interface for any local
// address, so an address left anywhere is one more node answering for the
// VIP.
func (l *netlinkLink) remove(p netip.Prefix) (bool, error) { return l.removeForms(p, false) }

// removeStrays deletes every form of the VIP but the managed one: p on the
// configured interface.
func (l *netlinkLink) removeStrays(p netip.Prefix) (bool, error) { return l.removeForms(p, true) }

func (l *netlinkLink) removeForms(p netip.Prefix, keepOwn bool) (bool, error) {
	forms, err := addrForms(p)
	if err != nil {
		return false, err
	}
	own := 0
	if lk, err := l.get(); err == nil {
		own = lk.Attrs().Index
	}
	removed := false
	var errs []error
	for _, a := range forms {
		if ones, _ := a.Mask.Size(); keepOwn && a.LinkIndex == own && ones == p.Bits() {
			continue
		}
		lk, err := netlink.LinkByIndex(a.LinkIndex)
		if err != nil {
			var nf netlink.LinkNotFoundError
			if !errors.As(err, &nf) { // gone with its interface: nothing to remove
				errs = append(errs, fmt.Errorf("look up interface %d: %w", a.LinkIndex, err))
			}
			continue
		}
		ok, err := delAddr(lk, &a)
		removed = removed || ok
		errs = append(errs, err)
	}
	return removed, errors.Join(errs...)
}

// addrForms lists the addresses in this network namespace with p's IP, on
// any interface and with any prefix length.
func addrForms(p netip.Prefix) ([]netlink.Addr, error) {
	family := netlink.FAMILY_V4
	if p.Addr().Is6() {
		family = netlink.FAMILY_V6
	}
	all, err := netlink.AddrList(nil, family)
	if err != nil {
		return nil, fmt.Errorf("list addresses: %w", err)
	}
	var forms []netlink.Addr
	for _, a := range all {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.Unmap() == p.Addr() {
			forms = append(forms, a)
		}
	}
	return forms, nil
}

func delAddr(lk netlink.Link, a *netlink.Addr) (bool, error) {
	if err := netlink.AddrDel(lk, a); err != nil {
		if errors.Is(err, unix.EADDRNOTAVAIL) || errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ESRCH) {
			return false, nil
		}
		return false, fmt.Errorf("remove %s from %s: %w", a.IPNet, lk.Attrs().Name, err)
	}
	return true, nil
}

// has reports whether the managed form of the VIP is there: p, with its
// prefix length, on the configured interface.
func (l *netlinkLink) has(p netip.Prefix) (bool, error) {
	lk, err := l.get()
	if err != nil {
		return false, err
	}
	forms, err := addrForms(p)
	if err != nil {
		return false, err
	}
	for _, a := range forms {
		if ones, _ := a.Mask.Size(); a.LinkIndex == lk.Attrs().Index && ones == p.Bits() {
			return true, nil
		}
	}
	return false, nil
}

// state reports whether the interface exists, is up and has carrier. A
// renamed interface counts as gone: the VIP is configured by name.
func (l *netlinkLink) state() error {
	lk, err := netlink.LinkByName(l.name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return fmt.Errorf("%w: %q is gone (removed or renamed)", ErrNoInterface, l.name)
		}
		return fmt.Errorf("look up interface %q: %w", l.name, err)
	}
	a := lk.Attrs()
	switch {
	case a.Flags&net.FlagUp == 0:
		return fmt.Errorf("%w: %q is administratively down", ErrLinkDown, l.name)
	case a.RawFlags&unix.IFF_LOWER_UP == 0:
		return fmt.Errorf("%w: %q has no carrier", ErrLinkDown, l.name)
	}
	return nil
}

// subscribe delivers a value whenever an address or a link changes in this
// network namespace, until ctx is done or stop is called. Events are only
// hints to look again: the channel drops what it cannot hold.
func subscribe(ctx context.Context) (<-chan struct{}, func(), error) {
	out := make(chan struct{}, 1)
	done := make(chan struct{})
	addrs := make(chan netlink.AddrUpdate, 64)
	links := make(chan netlink.LinkUpdate, 64)
	opts := netlink.AddrSubscribeOptions{ErrorCallback: func(error) {}, ReceiveBufferSize: 1 << 20}
	if err := netlink.AddrSubscribeWithOptions(addrs, done, opts); err != nil {
		close(done)
		return nil, nil, fmt.Errorf("subscribe to address events: %w", err)
	}
	if err := netlink.LinkSubscribeWithOptions(links, done, netlink.LinkSubscribeOptions{ErrorCallback: func(error) {}, ReceiveBufferSize: 1 << 20}); err != nil {
		close(done)
		return nil, nil, fmt.Errorf("subscribe to link events: %w", err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-ctx.Done():
				return
			case <-done:
				return
			case _, ok := <-addrs:
				if !ok {
					return
				}
			case _, ok := <-links:
				if !ok {
					return
				}
			}
			select {
			case out <- struct{}{}:
			default:
			}
		}
	}()
	var once sync.Once
	stop := func() {
		once.Do(func() { close(done) })
		wg.Wait()
	}
	return out, stop, nil
}
