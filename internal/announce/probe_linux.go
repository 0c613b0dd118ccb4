//go:build linux

package announce

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/ndp"
	"github.com/mdlayher/packet"
)

// Probe asks the segment behind ifi who answers for ip, and returns the
// hardware addresses that did within wait, sorted, without duplicates. IPv4
// sends an ARP probe (RFC 5227: sender address 0.0.0.0, so it works from an
// interface without an address of its own and updates nobody's cache); IPv6
// sends a neighbour solicitation to the solicited-node group. A host never
// hears its own probe, so the answers are the other holders of ip.
func Probe(ifi *net.Interface, ip netip.Addr, wait time.Duration) ([]net.HardwareAddr, error) {
	var (
		macs []net.HardwareAddr
		err  error
	)
	if ip.Is4() {
		macs, err = probeARP(ifi, ip, wait)
	} else {
		macs, err = probeNDP(ifi, ip, wait)
	}
	if err != nil {
		return nil, fmt.Errorf("probe %s on %s: %w", ip, ifi.Name, err)
	}
	slices.SortFunc(macs, func(a, b net.HardwareAddr) int { return slices.Compare(a, b) })
	return slices.CompactFunc(macs, func(a, b net.HardwareAddr) bool { return slices.Equal(a, b) }), nil
}

func probeARP(ifi *net.Interface, ip netip.Addr, wait time.Duration) ([]net.HardwareAddr, error) {
	c, err := packet.Listen(ifi, packet.Datagram, int(ethernet.EtherTypeARP), nil)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	req, err := arp.NewPacket(arp.OperationRequest, ifi.HardwareAddr, netip.IPv4Unspecified(), ethernet.Broadcast, ip)
	if err != nil {
		return nil, err
	}
	b, err := req.MarshalBinary()
	if err != nil {
		return nil, err
	}
	if _, err := c.WriteTo(b, &packet.Addr{HardwareAddr: ethernet.Broadcast}); err != nil {
		return nil, err
	}
	if err := c.SetReadDeadline(time.Now().Add(wait)); err != nil {
		return nil, err
	}
	var macs []net.HardwareAddr
	buf := make([]byte, 128)
	for {
		n, _, err := c.ReadFrom(buf)
		if isTimeout(err) {
			return macs, nil
		}
		if err != nil {
			return macs, err
		}
		var p arp.Packet
		if p.UnmarshalBinary(buf[:n]) != nil || p.Operation != arp.OperationReply || p.SenderIP != ip {
			continue
		}
		macs = append(macs, slices.Clone(p.SenderHardwareAddr))
	}
}

func probeNDP(ifi *net.Interface, ip netip.Addr, wait time.Duration) ([]net.HardwareAddr, error) {
	c, _, err := ndp.Listen(ifi, ndp.LinkLocal)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	snm, err := ndp.SolicitedNodeMulticast(ip)
	if err != nil {
		return nil, err
	}
	ns := &ndp.NeighborSolicitation{
		TargetAddress: ip,
		Options:       []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Source, Addr: ifi.HardwareAddr}},
	}
	if err := c.WriteTo(ns, nil, snm); err != nil {
		return nil, err
	}
	if err := c.SetReadDeadline(time.Now().Add(wait)); err != nil {
		return nil, err
	}
	var macs []net.HardwareAddr
	for {
		m, _, _, err := c.ReadFrom()
		if isTimeout(err) {
			return macs, nil
		}
		if err != nil {
			return macs, err
		}
		na, ok := m.(*ndp.NeighborAdvertisement)
		if !ok || na.TargetAddress != ip {
			continue
		}
		for _, o := range na.Options {
			if lla, ok := o.(*ndp.LinkLayerAddress); ok && lla.Direction == ndp.Target {
				macs = append(macs, slices.Clone(lla.Addr))
			}
		}
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
