package validate

import (
	"fmt"
	"net/netip"
	"strings"
)

// VIP parses one --vip: "10.0.0.10/24", "10.0.0.10" (a host address, /32)
// or the IPv6 equivalents.
func VIP(s string) (netip.Prefix, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return netip.Prefix{}, fmt.Errorf("`vip` is required, e.g. 10.0.0.100/24")
	}
	if !strings.Contains(s, "/") {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("`vip` %q is not an IP address or CIDR", s)
		}
		if a.Zone() != "" {
			return netip.Prefix{}, fmt.Errorf("`vip` %q must not have a zone", s)
		}
		s = netip.PrefixFrom(a, a.BitLen()).String()
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("`vip` %q is not an IP address or CIDR", s)
	}
	return p, nil
}

// VIPs parses --vip given once, or twice for dual-stack; see VIP and
// VIPSet.
func VIPs(ss []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range ss {
		p, err := VIP(s)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, VIPSet(out)
}

// VIPSet accepts one VIP, or two of different families (a dual-stack VIP,
// held as one).
func VIPSet(vips []netip.Prefix) error {
	switch {
	case len(vips) == 0:
		return fmt.Errorf("`vip` is required, e.g. 10.0.0.100/24")
	case len(vips) > 2:
		return fmt.Errorf("`vip` given %d times: give one VIP, or two for dual-stack (one IPv4, one IPv6)", len(vips))
	case len(vips) == 2 && vips[0].Addr().Is4() == vips[1].Addr().Is4():
		return fmt.Errorf("`vip` %s and %s are of the same family: a dual-stack VIP is one IPv4 and one IPv6 address", vips[0], vips[1])
	}
	for _, p := range vips {
		if !p.IsValid() {
			return fmt.Errorf("`vip` is required, e.g. 10.0.0.100/24")
		}
		if p.Addr().Is4In6() {
			return fmt.Errorf("`vip` %s: give an IPv4 VIP in dotted form, not IPv4-mapped IPv6", p)
		}
	}
	return nil
}
