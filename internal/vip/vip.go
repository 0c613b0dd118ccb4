// Package vip adds and removes the virtual IP on a network interface. Every
// operation is idempotent, so a step-down can always call Remove and a new
// leader can always call Add, whatever state a crash left behind.
//
// A dual-stack VIP is one IPv4 and one IPv6 address that move together: a
// Manager holds the set, adds and removes all of it in every operation, and
// counts it present only when every address is there.
package vip

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"time"
)

// ErrNoInterface is returned by New when the interface does not exist.
var ErrNoInterface = errors.New("vip: interface not found")

// ErrLinkDown is returned by Keeper.Eligible while the interface is down or
// has no carrier.
var ErrLinkDown = errors.New("vip: interface cannot carry traffic")

// Config names the addresses and where they live.
type Config struct {
	// Address is the VIP with its prefix length, e.g. 10.250.0.100/24. A /32
	// (or /128) adds no route; a wider prefix adds the subnet route as a
	// secondary address would.
	Address netip.Prefix
	// Also are further addresses held with Address: the other family's VIP
	// of a dual-stack cluster.
	Also      []netip.Prefix
	Interface string
	// Lifetime, when positive, is the address's valid lifetime in the
	// kernel (rounded up to whole seconds). The holder refreshes it by calling
	// Add; if the holder dies without removing the address, the kernel removes
	// it when the lifetime runs out. Zero keeps the address until removed.
	Lifetime time.Duration
}

// DefaultLifetime is the kernel lifetime the daemon gives the VIP, refreshed
// every RefreshInterval. It is the last fence: when vigil and its guard are
// both stopped (a frozen cgroup, a paused container), nothing in user space
// runs, and the kernel removes the address when the lifetime runs out. One
// second is the shortest lifetime the kernel takes (it counts whole seconds);
// its expiry check then runs up to about a second late (docs/election.md
// gives the measured bound). Four refreshes fit in it, so a holder that is
// merely slow never loses the address.
const DefaultLifetime = time.Second

// link is the OS side: netlink on Linux.
type link interface {
	add(p netip.Prefix, lifetime time.Duration) (added bool, err error)
	// remove removes every form of p: on any interface, any prefix length.
	remove(p netip.Prefix) (removed bool, err error)
	// removeStrays removes every form of p but p on the interface.
	removeStrays(p netip.Prefix) (removed bool, err error)
	// has tells whether p, with its prefix length, is on the interface.
	has(p netip.Prefix) (bool, error)
	// state returns why the interface cannot carry the VIP (gone, down, no
	// carrier), or nil.
	state() error
}

// Manager owns the VIP on one interface.
type Manager struct {
	cfg  Config
	link link
	log  *slog.Logger
}

// New checks that the interface exists and that the addresses are valid.
func New(cfg Config, log *slog.Logger) (*Manager, error) {
	if !cfg.Address.IsValid() {
		return nil, errors.New("vip: no address")
	}
	for _, p := range cfg.all() {
		if !p.IsValid() || p.Addr().IsUnspecified() || p.Addr().IsLoopback() || p.Addr().IsMulticast() {
			return nil, fmt.Errorf("vip: %s cannot be a virtual IP (unspecified, loopback or multicast)", p)
		}
	}
	l, err := openLink(cfg.Interface)
	if err != nil {
		return nil, err
	}
	return &Manager{cfg: cfg, link: l, log: log.With("vip", cfg.String(), "interface", cfg.Interface)}, nil
}

func (c Config) all() []netip.Prefix { return append([]netip.Prefix{c.Address}, c.Also...) }

// String lists the addresses, comma-separated.
func (c Config) String() string {
	s := make([]string, 0, 1+len(c.Also))
	for _, p := range c.all() {
		s = append(s, p.String())
	}
	return strings.Join(s, ",")
}

// Addresses returns the managed addresses, Address first.
func (m *Manager) Addresses() []netip.Prefix { return m.cfg.all() }

// Interface returns the interface name.
func (m *Manager) Interface() string { return m.cfg.Interface }

// Add puts the VIP on the interface, or refreshes its lifetime if it is
// there already.
func (m *Manager) Add() error {
	added, err := m.add()
	if err != nil {
		return fmt.Errorf("add vip %s to %s: %w", m.cfg, m.cfg.Interface, err)
	}
	if added {
		m.log.Info("VIP added")
	}
	return nil
}

// Remove takes the VIP off the node: off the interface, and off any other
// interface or with any other prefix length (a stray form: Linux answers
// ARP and NDP for any local address on every interface). Absent already is
// fine.
func (m *Manager) Remove(reason string) error {
	removed, err := m.remove()
	if err != nil {
		return fmt.Errorf("remove vip %s from %s: %w", m.cfg, m.cfg.Interface, err)
	}
	if removed {
		m.log.Info("VIP removed", "reason", reason)
	}
	return nil
}

// Present reports whether every address of the VIP is on the interface.
func (m *Manager) Present() (bool, error) { return m.has() }

// add adds every address (or refreshes its lifetime) and reports whether
// any was missing. It tries them all even when one fails.
func (m *Manager) add() (added bool, err error) {
	return m.each(func(p netip.Prefix) (bool, error) { return m.link.add(p, m.cfg.Lifetime) })
}

// remove removes every address and reports whether any was there. It
// tries them all even when one fails.
func (m *Manager) remove() (removed bool, err error) { return m.each(m.link.remove) }

// removeStrays removes every form of every address but the managed one,
// and reports whether any was there.
func (m *Manager) removeStrays() (removed bool, err error) { return m.each(m.link.removeStrays) }

// each runs op on every address, all of them even when one fails, and
// reports whether any op said true, and the errors joined.
func (m *Manager) each(op func(netip.Prefix) (bool, error)) (some bool, err error) {
	var errs []error
	for _, p := range m.cfg.all() {
		ok, err := op(p)
		some = some || ok
		errs = append(errs, err)
	}
	return some, errors.Join(errs...)
}

// has reports whether every address is on the interface.
func (m *Manager) has() (bool, error) {
	for _, p := range m.cfg.all() {
		if ok, err := m.link.has(p); err != nil || !ok {
			return false, err
		}
	}
	return true, nil
}
