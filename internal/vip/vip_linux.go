//go:build linux

package vip

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
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

func (l *netlinkLink) remove(p netip.Prefix) (bool, error) {
	lk, err := l.get()
	if err != nil {
		return false, err
	}
	if err := netlink.AddrDel(lk, addr(p)); err != nil {
		if errors.Is(err, unix.EADDRNOTAVAIL) || errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ESRCH) {
			return false, nil
		}
		return false, err
	}
	return true, nil
}

func (l *netlinkLink) has(p netip.Prefix) (bool, error) {
	lk, err := l.get()
	if err != nil {
		return false, err
	}
	family := netlink.FAMILY_V4
	if p.Addr().Is6() {
		family = netlink.FAMILY_V6
	}
	addrs, err := netlink.AddrList(lk, family)
	if err != nil {
		return false, fmt.Errorf("list addresses of %q: %w", l.name, err)
	}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.Unmap() == p.Addr() {
			return true, nil
		}
	}
	return false, nil
}
