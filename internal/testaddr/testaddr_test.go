package testaddr

import (
	"net"
	"strconv"
	"testing"
)

// Two claims never share a range: the second process (here, a second
// claim with the same process ID) takes the next one, and a range is free
// again once its claimant is gone.
func TestClaimIsExclusive(t *testing.T) {
	const pid = 4242
	a, err := claim(pid)
	if err != nil {
		t.Fatal(err)
	}
	b, err := claim(pid)
	if err != nil {
		t.Fatal(err)
	}
	if a.prefix == b.prefix {
		t.Fatalf("two claims got the same range %s0/24", a.prefix)
	}
	b.lock.Close()
	a.lock.Close()
	c, err := claim(pid)
	if err != nil {
		t.Fatal(err)
	}
	defer c.lock.Close()
	if c.prefix != a.prefix {
		t.Fatalf("after both closed, a claim got %s0/24, want the first choice %s0/24 again", c.prefix, a.prefix)
	}
}

// Ports are handed out once each, below the ephemeral range, and every
// address of the range can listen on them.
func TestPortsAreOurs(t *testing.T) {
	seen := map[int]bool{}
	first, last, err := portRange()
	if err != nil {
		t.Fatal(err)
	}
	for range 50 {
		p := Port(t)
		if seen[p] || p <= first || p > last {
			t.Fatalf("port %d: handed out twice, or outside %d-%d", p, first, last)
		}
		seen[p] = true
	}
	p := strconv.Itoa(Port(t))
	for _, h := range []string{Loopback(t), Host(t, 0), Host(t, 3)} {
		ln, err := net.Listen("tcp", net.JoinHostPort(h, p))
		if err != nil {
			t.Fatalf("listen on %s:%s: %v", h, p, err)
		}
		defer ln.Close()
	}
}
