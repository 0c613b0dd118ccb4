//go:build linux

package announce

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/ndp"
)

type osSender struct{}

func (osSender) send(ifi *net.Interface, ip netip.Addr) error {
	if ip.Is4() {
		return garp(ifi, ip)
	}
	return unsolicitedNA(ifi, ip)
}

// garp broadcasts the VIP's new hardware address twice: as an ARP request
// (sender = target = VIP) and as an ARP reply. Some hosts and switches only
// honour one form; Linux's override rule accepts both.
func garp(ifi *net.Interface, ip netip.Addr) error {
	c, err := arp.Dial(ifi)
	if err != nil {
		return fmt.Errorf("open arp socket: %w", err)
	}
	defer c.Close()
	for _, op := range []arp.Operation{arp.OperationRequest, arp.OperationReply} {
		p, err := arp.NewPacket(op, ifi.HardwareAddr, ip, ethernet.Broadcast, ip)
		if err != nil {
			return fmt.Errorf("build gratuitous arp: %w", err)
		}
		if err := c.WriteTo(p, ethernet.Broadcast); err != nil {
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
