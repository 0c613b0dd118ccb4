//go:build linux

package announce

import (
	"fmt"
	"net"
	"net/netip"
	"sync"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/ndp"
)

// osSender keeps its ARP socket open between announcements: opening one
// costs milliseconds, and the first announcement after a failover is on the
// critical path.
type osSender struct {
	mu  sync.Mutex // guards arp
	arp *arp.Client
}

func newSender() sender { return &osSender{} }

func (s *osSender) send(ifi *net.Interface, ip netip.Addr) error {
	if ip.Is4() {
		return s.garp(ifi, ip)
	}
	return unsolicitedNA(ifi, ip)
}

func (s *osSender) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.arp != nil {
		_ = s.arp.Close() // nothing useful to do on a close error
		s.arp = nil
	}
}

// prepare opens the ARP socket ahead of the first announcement.
func (s *osSender) prepare(ifi *net.Interface, ip netip.Addr) error {
	if !ip.Is4() {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	_, err := s.clientLocked(ifi)
	return err
}

func (s *osSender) clientLocked(ifi *net.Interface) (*arp.Client, error) {
	if s.arp != nil {
		return s.arp, nil
	}
	c, err := arp.Dial(ifi)
	if err != nil {
		return nil, fmt.Errorf("open arp socket: %w", err)
	}
	s.arp = c
	return c, nil
}

// garp broadcasts the VIP's new hardware address twice: as an ARP request
// (sender = target = VIP) and as an ARP reply. Some hosts and switches only
// honour one form; Linux's override rule accepts both.
func (s *osSender) garp(ifi *net.Interface, ip netip.Addr) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, err := s.clientLocked(ifi)
	if err != nil {
		return err
	}
	for _, op := range []arp.Operation{arp.OperationRequest, arp.OperationReply} {
		p, err := arp.NewPacket(op, ifi.HardwareAddr, ip, ethernet.Broadcast, ip)
		if err != nil {
			return fmt.Errorf("build gratuitous arp: %w", err)
		}
		if err := c.WriteTo(p, ethernet.Broadcast); err != nil {
			// The interface may have been recreated; reopen next time.
			_ = c.Close()
			s.arp = nil
			return fmt.Errorf("send gratuitous arp: %w", err)
		}
	}
	return nil
}

// unsolicitedNA sends an unsolicited neighbour advertisement with the
// override flag to all nodes (RFC 4861 7.2.6).
func unsolicitedNA(ifi *net.Interface, ip netip.Addr) error {
	c, _, err := ndp.Listen(ifi, ndp.LinkLocal)
	if err != nil {
		return fmt.Errorf("open ndp socket: %w", err)
	}
	defer c.Close()
	m := &ndp.NeighborAdvertisement{
		Override:      true,
		TargetAddress: ip,
		Options:       []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Target, Addr: ifi.HardwareAddr}},
	}
	if err := c.WriteTo(m, nil, netip.IPv6LinkLocalAllNodes()); err != nil {
		return fmt.Errorf("send neighbour advertisement: %w", err)
	}
	return nil
}
