// Package testaddr gives each test binary loopback addresses and ports of
// its own, so that servers started by tests never race another test
// binary for a port.
package testaddr

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
)

// Test binaries run side by side (go test runs packages in parallel), and a
// port that was free a moment ago may be taken by the time a server binds
// it. So each test binary that serves on loopback takes addresses of its
// own: a /24 in 127.128.0.0-127.254.255.255, which nothing but these tests
// uses, and ports below the kernel's ephemeral range, which no outgoing
// connection takes. The /24 is claimed by listening on its first address
// and first port for the life of the process: a bind either succeeds or
// fails at once, so two processes can never share one, and a process that
// finds its first choice claimed takes the next.
//
// Within the process, ports come from a counter: every address of the /24
// is free on every port the counter hands out.

// rangeCount is the number of /24s to choose from: 127.128.0.0/24 to
// 127.254.255.0/24.
const rangeCount = 127 * 256

type loopbackRange struct {
	prefix string // "127.A.B."
	lock   net.Listener
	next   atomic.Int32 // the next port to hand out
	last   int          // the last port of the range
}

var (
	claimOnce sync.Once
	claimed   *loopbackRange
	claimErr  error
)

// ourRange claims the process's range on first use.
func ourRange() (*loopbackRange, error) {
	claimOnce.Do(func() { claimed, claimErr = claim(os.Getpid()) })
	return claimed, claimErr
}

func claim(pid int) (*loopbackRange, error) {
	first, last, err := portRange()
	if err != nil {
		return nil, err
	}
	for i := range rangeCount {
		idx := (pid + i) % rangeCount
		prefix := fmt.Sprintf("127.%d.%d.", 128+idx/256, idx%256)
		ln, err := net.Listen("tcp", net.JoinHostPort(prefix+"1", strconv.Itoa(first)))
		if errors.Is(err, syscall.EADDRINUSE) {
			continue // another test binary's
		}
		if err != nil {
			return nil, fmt.Errorf("claim the loopback range %s0/24 for this test binary: %w", prefix, err)
		}
		r := &loopbackRange{prefix: prefix, lock: ln, last: last}
		r.next.Store(int32(first + 1))
		return r, nil
	}
	return nil, errors.New("every loopback range 127.128-254.x.0/24 is claimed by another test binary")
}

// portRange picks the ports to hand out: below the ephemeral range
// (net.ipv4.ip_local_port_range), or above it if it starts too low.
func portRange() (first, last int, err error) {
	lo, hi := 32768, 60999 // the kernel's default
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if l, err1 := strconv.Atoi(f[0]); err1 == nil {
				if h, err2 := strconv.Atoi(f[1]); err2 == nil {
					lo, hi = l, h
				}
			}
		}
	}
	const want = 2000 // ports a test binary may use
	switch {
	case lo-1 >= 20000+want:
		return 20000, lo - 1, nil
	case hi+1+want <= 65535:
		return hi + 1, 65535, nil
	}
	return 0, 0, fmt.Errorf("no room for test ports outside the ephemeral range %d-%d (net.ipv4.ip_local_port_range)", lo, hi)
}

func mustRange(t testing.TB) *loopbackRange {
	t.Helper()
	r, err := ourRange()
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// Loopback is this test binary's own loopback address, 127.A.B.1: servers
// that tests start listen there, on ports from Port.
func Loopback(t testing.TB) string {
	t.Helper()
	return mustRange(t).prefix + "1"
}

// Host is the i-th address of this test binary's loopback range,
// 127.A.B.(11+i): StartDistinct's member i, or a node's own address.
func Host(t testing.TB, i int) string {
	t.Helper()
	if i < 0 || 11+i > 254 {
		t.Fatalf("testaddr.Host(%d): out of the range's addresses", i)
	}
	return mustRange(t).prefix + strconv.Itoa(11+i)
}

// Port returns a port that no other test binary uses on this binary's
// loopback addresses (Loopback, Host), and that this binary has not handed
// out before. It is free on every one of them, unless a test of this binary
// listened there with a port of its own choosing. Not for 127.0.0.1, which
// every process shares.
func Port(t testing.TB) int {
	t.Helper()
	r := mustRange(t)
	p := int(r.next.Add(1) - 1)
	if p > r.last {
		t.Fatalf("this test binary has used all of its %d loopback ports", r.last)
	}
	return p
}
