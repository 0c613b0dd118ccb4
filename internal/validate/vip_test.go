package validate

import (
	"strings"
	"testing"
)

func TestVIPs(t *testing.T) {
	for _, tc := range []struct {
		in   []string
		want string // the error's words, or the parsed prefixes
	}{
		{[]string{"10.0.0.100/24"}, "[10.0.0.100/24]"},
		{[]string{" 10.0.0.100 "}, "[10.0.0.100/32]"},
		{[]string{"10.0.0.100/24", "fd00::100/64"}, "[10.0.0.100/24 fd00::100/64]"},
		{[]string{"fd00::100"}, "[fd00::100/128]"},
		{nil, "`vip` is required"},
		{[]string{""}, "`vip` is required"},
		{[]string{"10.0.0.300/24"}, "is not an IP address or CIDR"},
		{[]string{"fe80::1%eth0"}, "must not have a zone"},
		{[]string{"fe80::1%eth0/64"}, "is not an IP address or CIDR"},
		{[]string{"10.0.0.100", "10.0.0.101"}, "are of the same family"},
		{[]string{"10.0.0.100", "fd00::1", "fd00::2"}, "given 3 times"},
		{[]string{"::ffff:10.0.0.100"}, "not IPv4-mapped IPv6"},
	} {
		got, err := VIPs(tc.in)
		s := ""
		if err != nil {
			s = err.Error()
		} else {
			parts := make([]string, len(got))
			for i, p := range got {
				parts[i] = p.String()
			}
			s = "[" + strings.Join(parts, " ") + "]"
		}
		if !strings.Contains(s, tc.want) {
			t.Errorf("VIPs(%q) = %q, want %q", tc.in, s, tc.want)
		}
	}
}
