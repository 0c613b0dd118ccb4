// Package netmon follows this network namespace's links and addresses
// through one netlink subscription, for every part of vigil that needs
// them: the VIP keeper looks again when anything changed; the announcer and
// the VIP conflict probe send from the interface's current index and MAC;
// placement tells its own API servers by the host's current addresses; the
// lock record carries the MAC peers check ARP answers against.
//
// What it gives is a cache, refreshed within milliseconds of the kernel's
// notification: right for choosing where to send from, not for deciding
// whether the VIP is present (vip.Manager asks the kernel for that).
package netmon

import (
	"errors"
	"net"
	"net/netip"
	"slices"
)

// Link is one network interface as the monitor last read it.
type Link struct {
	Name    string
	Index   int
	MTU     int
	MAC     net.HardwareAddr
	Up      bool // administratively up
	Carrier bool // the lower layer is up
}

// Interface is the link in the form package net (and the announcer's
// sockets) use.
func (l Link) Interface() *net.Interface {
	ifi := &net.Interface{Index: l.Index, MTU: l.MTU, Name: l.Name, HardwareAddr: slices.Clone(l.MAC)}
	if l.Up {
		ifi.Flags |= net.FlagUp
	}
	if l.Carrier {
		ifi.Flags |= net.FlagRunning
	}
	return ifi
}

// ErrNoLink: no interface has that name (now).
var ErrNoLink = errors.New("no such network interface")

// state is what one read of the kernel gave.
type state struct {
	links map[string]Link
	// ifaddrs is every address with its prefix length and link, sorted:
	// the same address added again with another prefix, or on another
	// link, is a change.
	ifaddrs []ifaddr
	addrs   []netip.Addr // the addresses alone, sorted, IPv4 unmapped
}

type ifaddr struct {
	index  int
	prefix netip.Prefix
}

func (a ifaddr) compare(b ifaddr) int {
	if c := a.prefix.Addr().Compare(b.prefix.Addr()); c != 0 {
		return c
	}
	if a.prefix.Bits() != b.prefix.Bits() {
		return a.prefix.Bits() - b.prefix.Bits()
	}
	return a.index - b.index
}

func (s state) equal(o state) bool {
	if len(s.links) != len(o.links) || !slices.Equal(s.ifaddrs, o.ifaddrs) {
		return false
	}
	for name, l := range s.links {
		m, ok := o.links[name]
		if !ok || l.Index != m.Index || l.MTU != m.MTU || l.Up != m.Up || l.Carrier != m.Carrier || l.MAC.String() != m.MAC.String() {
			return false
		}
	}
	return true
}
