// Package dnat sends the VIP's API server port to the load balancer's own
// port, on the VIP holder only, with nftables (through netlink: the image
// has no nft command).
//
// kubeadm starts kube-apiserver on 0.0.0.0:6443, so on a control-plane node
// nothing else can listen on VIP:6443. With --lb-listen-port the load
// balancer listens on VIP:LISTEN instead, and the holder installs
//
//	table ip vigil_dnat {
//	  chain prerouting { type nat hook prerouting priority dstnat; ip daddr VIP tcp dport 6443 dnat to VIP:LISTEN }
//	  chain output     { type nat hook output priority -100;      ip daddr VIP tcp dport 6443 dnat to VIP:LISTEN }
//	}
//
// (and the same in table ip6 vigil_dnat for an IPv6 VIP), so clients keep
// using VIP:6443 and reach the balancer, while every API server keeps its
// default flags. The rules go with the VIP: installed once it is up,
// removed when it goes, and removed at start, as a stale VIP is.
package dnat

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Table is the name of the table in each family.
const Table = "vigil_dnat"

// Rule sends TCP to VIP:From to VIP:To.
type Rule struct {
	VIP      netip.Addr
	From, To uint16
}

func (r Rule) String() string {
	return fmt.Sprintf("%s -> %s", netip.AddrPortFrom(r.VIP, r.From), netip.AddrPortFrom(r.VIP, r.To))
}

// Install replaces the tables with rules (one per VIP address), atomically
// per call: one netlink batch.
func Install(rules []Rule) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("dnat: netlink: %w", err)
	}
	defer c.CloseLasting()
	for _, fam := range []nftables.TableFamily{nftables.TableFamilyIPv4, nftables.TableFamilyIPv6} {
		var mine []Rule
		for _, r := range rules {
			if r.VIP.Is4() == (fam == nftables.TableFamilyIPv4) {
				mine = append(mine, r)
			}
		}
		// Drop what a previous call or process left (adding first, so
		// the deletion finds a table), then add.
		t := &nftables.Table{Name: Table, Family: fam}
		c.AddTable(t)
		c.DelTable(t)
		if len(mine) == 0 {
			continue
		}
		t = c.AddTable(&nftables.Table{Name: Table, Family: fam})
		for _, h := range []struct {
			name string
			hook *nftables.ChainHook
		}{{"prerouting", nftables.ChainHookPrerouting}, {"output", nftables.ChainHookOutput}} {
			ch := c.AddChain(&nftables.Chain{
				Name: h.name, Table: t, Type: nftables.ChainTypeNAT, Hooknum: h.hook, Priority: nftables.ChainPriorityNATDest,
			})
			for _, r := range mine {
				c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: exprs(r)})
			}
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("dnat: install %v: %w", rules, err)
	}
	return nil
}

// Remove deletes the tables, if any.
func Remove() error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("dnat: netlink: %w", err)
	}
	defer c.CloseLasting()
	tables, err := c.ListTables()
	if err != nil {
		return fmt.Errorf("dnat: list tables: %w", err)
	}
	n := 0
	for _, t := range tables {
		if t.Name == Table && (t.Family == nftables.TableFamilyIPv4 || t.Family == nftables.TableFamilyIPv6) {
			c.DelTable(t)
			n++
		}
	}
	if n == 0 {
		return nil
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("dnat: remove: %w", err)
	}
	return nil
}

// Installed lists the rules in place, for status and tests.
func Installed() ([]Rule, error) {
	c, err := nftables.New()
	if err != nil {
		return nil, fmt.Errorf("dnat: netlink: %w", err)
	}
	defer c.CloseLasting()
	var out []Rule
	for _, fam := range []nftables.TableFamily{nftables.TableFamilyIPv4, nftables.TableFamilyIPv6} {
		t := &nftables.Table{Name: Table, Family: fam}
		rules, err := c.GetRules(t, &nftables.Chain{Name: "prerouting", Table: t})
		if err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue
			}
			return nil, fmt.Errorf("dnat: list rules: %w", err)
		}
		for _, r := range rules {
			if x, ok := parse(r.Exprs); ok {
				out = append(out, x)
			}
		}
	}
	return out, nil
}

// exprs is r as nftables expressions: ip daddr VIP tcp dport From dnat to
// VIP:To.
func exprs(r Rule) []expr.Any {
	addr := r.VIP.AsSlice()
	off, nfproto := uint32(16), uint32(unix.NFPROTO_IPV4) // IPv4 destination
	if r.VIP.Is6() {
		off, nfproto = 24, unix.NFPROTO_IPV6
	}
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: uint32(len(addr))},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: addr},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: be16(r.From)},
		&expr.Immediate{Register: 1, Data: addr},
		&expr.Immediate{Register: 2, Data: be16(r.To)},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: nfproto, RegAddrMin: 1, RegProtoMin: 2, Specified: true},
	}
}

// parse reads back a rule exprs made.
func parse(es []expr.Any) (Rule, bool) {
	var r Rule
	var cmps, imms [][]byte
	for _, e := range es {
		switch x := e.(type) {
		case *expr.Cmp:
			cmps = append(cmps, x.Data)
		case *expr.Immediate:
			imms = append(imms, x.Data)
		}
	}
	if len(cmps) != 3 || len(imms) != 2 || len(cmps[2]) != 2 || len(imms[1]) != 2 {
		return r, false
	}
	a, ok := netip.AddrFromSlice(cmps[0])
	if !ok {
		return r, false
	}
	r.VIP, r.From, r.To = a, binary.BigEndian.Uint16(cmps[2]), binary.BigEndian.Uint16(imms[1])
	return r, true
}

func be16(v uint16) []byte { return binary.BigEndian.AppendUint16(nil, v) }
