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
//
// At most MaxProbeMACs distinct addresses are kept: a flood of replies with
// random hardware addresses (anyone on the segment can send them) must not
// grow memory without bound. more counts the replies from addresses left
// out (distinct ones while it can tell, every reply after that).
func Probe(ifi *net.Interface, ip netip.Addr, wait time.Duration) (macs []net.HardwareAddr, more int, err error) {
	set := &macSet{seen: map[string]bool{}}
	if ip.Is4() {
		err = probeARP(ifi, ip, wait, set)
	} else {
		err = probeNDP(ifi, ip, wait, set)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("probe %s on %s: %w", ip, ifi.Name, err)
	}
	slices.SortFunc(set.macs, func(a, b net.HardwareAddr) int { return slices.Compare(a, b) })
	return set.macs, set.more, nil
}

// MaxProbeMACs bounds the distinct hardware addresses one Probe keeps.
const MaxProbeMACs = 64

// macSet collects distinct hardware addresses, up to MaxProbeMACs. Past
// the cap it remembers which it has counted only while the seen map is
// under twice the cap; beyond that each reply counts once more (an
// estimate, bounded in memory).
type macSet struct {
	macs []net.HardwareAddr
	seen map[string]bool
	more int
}

func (s *macSet) add(m net.HardwareAddr) {
	k := string(m)
	if s.seen[k] {
		return
	}
	if len(s.macs) < MaxProbeMACs {
		s.seen[k] = true
		s.macs = append(s.macs, slices.Clone(m))
		return
	}
	if len(s.seen) < 2*MaxProbeMACs {
		s.seen[k] = true
	}
	s.more++
}

func probeARP(ifi *net.Interface, ip netip.Addr, wait time.Duration, set *macSet) error {
	c, err := packet.Listen(ifi, packet.Datagram, int(ethernet.EtherTypeARP), nil)
	if err != nil {
		return err
	}
	defer c.Close()
	req, err := arp.NewPacket(arp.OperationRequest, ifi.HardwareAddr, netip.IPv4Unspecified(), ethernet.Broadcast, ip)
	if err != nil {
		return err
	}
	b, err := req.MarshalBinary()
	if err != nil {
		return err
	}
	if _, err := c.WriteTo(b, &packet.Addr{HardwareAddr: ethernet.Broadcast}); err != nil {
		return err
	}
	if err := c.SetReadDeadline(time.Now().Add(wait)); err != nil {
		return err
	}
	buf := make([]byte, 128)
	for {
		n, _, err := c.ReadFrom(buf)
		if isTimeout(err) {
			return nil
		}
		if err != nil {
			return err
		}
		var p arp.Packet
		if p.UnmarshalBinary(buf[:n]) != nil || p.Operation != arp.OperationReply || p.SenderIP != ip {
			continue
		}
		set.add(p.SenderHardwareAddr)
	}
}

func probeNDP(ifi *net.Interface, ip netip.Addr, wait time.Duration, set *macSet) error {
	c, _, err := ndp.Listen(ifi, ndp.LinkLocal)
	if err != nil {
		return err
	}
	defer c.Close()
	snm, err := ndp.SolicitedNodeMulticast(ip)
	if err != nil {
		return err
	}
	ns := &ndp.NeighborSolicitation{
		TargetAddress: ip,
		Options:       []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Source, Addr: ifi.HardwareAddr}},
	}
	if err := c.WriteTo(ns, nil, snm); err != nil {
		return err
	}
	if err := c.SetReadDeadline(time.Now().Add(wait)); err != nil {
		return err
	}
	for {
		m, _, _, err := c.ReadFrom()
		if isTimeout(err) {
			return nil
		}
		if err != nil {
			return err
		}
		na, ok := m.(*ndp.NeighborAdvertisement)
		if !ok || na.TargetAddress != ip {
			continue
		}
		for _, o := range na.Options {
			if lla, ok := o.(*ndp.LinkLayerAddress); ok && lla.Direction == ndp.Target {
				set.add(lla.Addr)
			}
		}
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
