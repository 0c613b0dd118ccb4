package bgp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vigil-ha/vigil/internal/nstest"
	"github.com/vigil-ha/vigil/internal/testkit"
)

// The speaker against a real router: BIRD 2 in namespace B, the speaker in
// namespace A. A Go process cannot move all its threads into a namespace,
// so the test runs itself again inside A (childEnv set) for the speaker's
// half; BIRD's control socket is a file, reachable from both.
const childEnv = "VIGIL_BGP_TEST_BIRD_SOCKET"

// TestSpeakerAgainstBIRD: sessions over IPv4 (with a TCP MD5 password, read
// from a file) and IPv6; advertise, withdraw, close.
func TestSpeakerAgainstBIRD(t *testing.T) {
	if sock := os.Getenv(childEnv); sock != "" {
		speakerChild(t, sock)
		return
	}
	requireBIRD(t)
	p := nstest.NewPair(t)
	sock := startBIRD(t, p.B, `router id 192.0.2.2;
protocol device { }
protocol bgp vigil {
	local 192.0.2.2 as 65000;
	neighbor 192.0.2.1 as 65001;
	password "`+birdPassword+`";
	hold time 9;
	connect retry time 1;
	ipv4 { import all; export none; };
}
protocol bgp vigil6 {
	local fd00:192::2 as 65000;
	neighbor fd00:192::1 as 65001;
	hold time 9;
	connect retry time 1;
	ipv6 { import all; export none; };
}
`)
	child := exec.Command("ip", "netns", "exec", p.A, os.Args[0], "-test.run=^TestSpeakerAgainstBIRD$", "-test.v")
	child.Env = append(os.Environ(), childEnv+"="+sock)
	b, err := child.CombinedOutput()
	t.Logf("speaker (in %s):\n%s", p.A, b)
	if err != nil {
		t.Fatalf("speaker half: %v", err)
	}
}

// birdPassword is the TCP MD5 password of the IPv4 session of
// TestSpeakerAgainstBIRD: BIRD takes no segment without it.
const birdPassword = "vigil-md5-s3cret"

// speakerChild is the speaker's half, run inside namespace A.
func speakerChild(t *testing.T, sock string) {
	vip := netip.MustParseAddr("198.51.100.10")
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	// The IPv4 peer's password from a file, as vigil run reads it.
	pw := filepath.Join(t.TempDir(), "bgp-password")
	if err := os.WriteFile(pw, []byte(birdPassword+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	v4 := Peer{Address: netip.MustParseAddr("192.0.2.2"), AS: 65000}
	if err := v4.LoadPassword(pw); err != nil {
		t.Fatal(err)
	}
	sp, err := New(Config{
		LocalAS:  65001,
		RouterID: netip.MustParseAddr("192.0.2.1"),
		Peers: []Peer{
			v4,
			{Address: netip.MustParseAddr("fd00:192::2"), AS: 65000},
		},
	}, log)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := sp.Eligible(ctx); err == nil {
		t.Fatal("a speaker that was never started is eligible")
	}
	if err := sp.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer sp.Close()
	testkit.WaitNil(t, 20*time.Second, "an established session", func() error { return sp.Eligible(ctx) })

	// Advertised: BIRD holds the host route, next hop this side, with the
	// MED of the holder's transitions.
	if err := sp.Advertise(ctx, []netip.Addr{vip}, MED(7)); err != nil {
		t.Fatal(err)
	}
	testkit.WaitNil(t, 20*time.Second, "the route at the router", func() error { return routeIs(sock, vip, "192.0.2.1", MED(7)) })
	// A dual-stack VIP: the IPv6 host route goes out on the IPv6 session,
	// next hop this side's IPv6 address.
	vip6 := netip.MustParseAddr("2001:db8::10")
	if err := sp.Advertise(ctx, []netip.Addr{vip, vip6}, MED(7)); err != nil {
		t.Fatal(err)
	}
	testkit.WaitNil(t, 20*time.Second, "the IPv6 route at the router", func() error { return routeIs(sock, vip6, "fd00:192::1", MED(7)) })
	// Withdrawn while the sessions stay up: gone at once.
	start := time.Now()
	if err := sp.Withdraw(ctx); err != nil {
		t.Fatal(err)
	}
	testkit.WaitNil(t, 20*time.Second, "the withdrawal at the router", func() error { return errors.Join(noRoute(sock, vip), noRoute(sock, vip6)) })
	t.Logf("route gone from the router %v after Withdraw", time.Since(start).Round(time.Millisecond))
	if sp.Advertised() {
		t.Fatal("Advertised after Withdraw")
	}
	// Advertised again, then Close: the CEASE drops it without waiting for
	// the hold timer (9 s).
	if err := sp.Advertise(ctx, []netip.Addr{vip}, MED(8)); err != nil {
		t.Fatal(err)
	}
	testkit.WaitNil(t, 20*time.Second, "the route again", func() error {
		if err := noRoute(sock, vip); err == nil {
			return fmt.Errorf("no route yet")
		}
		return nil
	})
	start = time.Now()
	sp.Close()
	testkit.WaitNil(t, 20*time.Second, "the route gone after Close", func() error { return noRoute(sock, vip) })
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("the router dropped the route %v after Close; a CEASE should end it well before the 9 s hold timer", d)
	}
}

func birdRoute(sock string, a netip.Addr) (string, error) {
	out, err := exec.Command("birdc", "-s", sock, "show", "route", "for", a.String(), "all").CombinedOutput()
	if strings.Contains(string(out), "Network not found") {
		return "", nil // birdc exits 1 when it has no route
	}
	if err != nil {
		return "", fmt.Errorf("birdc: %w: %s", err, out)
	}
	return string(out), nil
}

// routeIs checks BIRD's route to a: a host route, next hop nh, MED med.
func routeIs(sock string, a netip.Addr, nh string, med uint32) error {
	r, err := birdRoute(sock, a)
	switch {
	case err != nil:
		return err
	case !strings.Contains(r, netip.PrefixFrom(a, a.BitLen()).String()):
		return fmt.Errorf("no route: %s", r)
	case !strings.Contains(r, "BGP.next_hop: "+nh):
		return fmt.Errorf("wrong next hop: %s", r)
	case !strings.Contains(r, fmt.Sprintf("BGP.med: %d", med)):
		return fmt.Errorf("wrong MED: %s", r)
	}
	return nil
}

func noRoute(sock string, a netip.Addr) error {
	r, err := birdRoute(sock, a)
	if err != nil {
		return err
	}
	if strings.Contains(r, netip.PrefixFrom(a, a.BitLen()).String()) {
		return fmt.Errorf("route still there: %s", r)
	}
	return nil
}

// policyEnv carries the policy test's mode and BIRD's socket to its
// speaker half, "MODE SOCKET".
const policyEnv = "VIGIL_BGP_TEST_POLICY"

// Timers and route policy, as a real router sees them: BIRD 2 in B has an
// eBGP session to a loopback address of A (multihop, --bgp-source-address)
// and an iBGP session to A's link address. The eBGP speaker offers a 6 s
// hold time and a 2 s keepalive, graceful restart and two communities; the
// iBGP one a local preference.
func TestSpeakerPolicyAgainstBIRD(t *testing.T) {
	if v := os.Getenv(policyEnv); v != "" {
		mode, sock, _ := strings.Cut(v, " ")
		policyChild(t, mode, sock)
		return
	}
	requireBIRD(t)
	p := nstest.NewPair(t)
	nstest.IP(t, "-n", p.A, "addr", "add", "203.0.113.1/32", "dev", "lo")
	nstest.IP(t, "-n", p.B, "route", "add", "203.0.113.1/32", "via", "192.0.2.1")
	sock := startBIRD(t, p.B, `router id 192.0.2.2;
protocol device { }
protocol direct { ipv4; interface "b0"; }
protocol static { ipv4; route 203.0.113.1/32 via 192.0.2.1; }
protocol bgp vigil_ebgp {
	local 192.0.2.2 as 65000;
	neighbor 203.0.113.1 as 65001;
	multihop 2;
	hold time 9;
	connect retry time 1;
	ipv4 { import all; export none; };
}
protocol bgp vigil_ibgp {
	local 192.0.2.2 as 65001;
	neighbor 192.0.2.1 as 65001;
	hold time 9;
	connect retry time 1;
	ipv4 { import all; export none; };
}
`)
	for _, mode := range []string{"ebgp", "ibgp"} {
		child := exec.Command("ip", "netns", "exec", p.A, os.Args[0], "-test.run=^TestSpeakerPolicyAgainstBIRD$", "-test.v")
		child.Env = append(os.Environ(), policyEnv+"="+mode+" "+sock)
		b, err := child.CombinedOutput()
		t.Logf("%s speaker (in %s):\n%s", mode, p.A, b)
		if err != nil {
			t.Fatalf("%s speaker half: %v", mode, err)
		}
	}
}

// policyChild is the policy test's speaker half, run inside namespace A.
func policyChild(t *testing.T, mode, sock string) {
	vip := netip.MustParseAddr("198.51.100.10")
	router := netip.MustParseAddr("192.0.2.2")
	cfg := Config{LocalAS: 65001, RouterID: netip.MustParseAddr("192.0.2.1")}
	switch mode {
	case "ebgp":
		cfg.Peers = []Peer{{Address: router, AS: 65000}}
		cfg.HoldTime, cfg.Keepalive = 6*time.Second, 2*time.Second
		cfg.Multihop, cfg.SourceAddress = 2, netip.MustParseAddr("203.0.113.1")
		cfg.Communities = []uint32{65001<<16 | 100, 0xFFFFFF01}
		cfg.GracefulRestart = true
	case "ibgp":
		cfg.Peers = []Peer{{Address: router, AS: 65001}}
		cfg.LocalPref = 200
	}
	sp, err := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := sp.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer sp.Close()
	testkit.WaitNil(t, 20*time.Second, "an established session", func() error { return sp.Eligible(ctx) })
	if err := sp.Advertise(ctx, []netip.Addr{vip}, MED(3)); err != nil {
		t.Fatal(err)
	}
	switch mode {
	case "ebgp":
		// From the loopback address, so it is the next hop too.
		testkit.WaitNil(t, 20*time.Second, "the route, with its communities", func() error {
			if err := routeIs(sock, vip, "203.0.113.1", MED(3)); err != nil {
				return err
			}
			r, err := birdRoute(sock, vip)
			if err == nil && !(strings.Contains(r, "(65001,100)") && strings.Contains(r, "(65535,65281)")) {
				err = fmt.Errorf("communities 65001:100 and no-export missing: %s", r)
			}
			return err
		})
		proto, err := exec.Command("birdc", "-s", sock, "show", "protocols", "all", "vigil_ebgp").CombinedOutput()
		if err != nil {
			t.Fatalf("birdc: %v: %s", err, proto)
		}
		// The session runs on the smaller hold time (ours), and BIRD
		// keeps alive at a third of it, as we do.
		for _, re := range []string{`Hold timer:\s+[0-9.]+/6\n`, `Keepalive timer:\s+[0-9.]+/2\n`, `(?s)Neighbor capabilities.*Graceful restart\s+Restart time: 9\n`} {
			if !regexp.MustCompile(re).Match(proto) {
				t.Errorf("BIRD's view of the session lacks %s:\n%s", re, proto)
			}
		}
	case "ibgp":
		testkit.WaitNil(t, 20*time.Second, "the route, with its local preference", func() error {
			r, err := birdRoute(sock, vip)
			if err == nil && !strings.Contains(r, "BGP.local_pref: 200") {
				err = fmt.Errorf("local preference 200 missing: %s", r)
			}
			return err
		})
	}
}

// bfdEnv carries BIRD's socket to the BFD test's speaker half.
const bfdEnv = "VIGIL_BGP_TEST_BFD"

// BFD with a real router: BIRD 2 ties its BGP session to a BFD session
// (100 ms x 3) with the speaker. When the speaker's process freezes
// (SIGSTOP: a hung node, whose kernel still keeps the TCP connection), no
// CEASE goes out and the BGP session stays, and without BFD the router
// would keep the route for its 9 s hold time; with it, the route must go
// within a second. (A killed process is no test of this: its kernel closes
// the connection, and the router drops the session at once.)
func TestBFDAgainstBIRD(t *testing.T) {
	if sock := os.Getenv(bfdEnv); sock != "" {
		bfdChild(t, sock)
		return
	}
	requireBIRD(t)
	p := nstest.NewPair(t)
	sock := startBIRD(t, p.B, `router id 192.0.2.2;
protocol device { }
protocol bfd {
	interface "b0" { min rx interval 100 ms; min tx interval 100 ms; multiplier 3; };
}
protocol bgp vigil {
	local 192.0.2.2 as 65000;
	neighbor 192.0.2.1 as 65001;
	hold time 9;
	connect retry time 1;
	bfd on;
	ipv4 { import all; export none; };
}
`)
	child := exec.Command("ip", "netns", "exec", p.A, os.Args[0], "-test.run=^TestBFDAgainstBIRD$", "-test.v")
	child.Env = append(os.Environ(), bfdEnv+"="+sock)
	var childOut strings.Builder
	pr, pw := io.Pipe()
	child.Stdout, child.Stderr = pw, pw
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	ready := make(chan struct{})
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := pr.Read(buf)
			childOut.Write(buf[:n])
			if strings.Contains(childOut.String(), "READY\n") {
				select {
				case <-ready:
				default:
					close(ready)
				}
			}
			if err != nil {
				return
			}
		}
	}()
	defer func() {
		_ = child.Process.Kill()
		_ = child.Process.Signal(syscall.SIGCONT)
		_ = child.Wait()
		pw.Close()
		if t.Failed() {
			t.Logf("speaker (in %s):\n%s", p.A, childOut.String())
		}
	}()
	select {
	case <-ready:
	case <-time.After(30 * time.Second):
		t.Fatal("the speaker half did not get its BGP and BFD sessions up and its route out within 30 s")
	}
	sessions, err := exec.Command("birdc", "-s", sock, "show", "bfd", "sessions").CombinedOutput()
	if err != nil || !regexp.MustCompile(`192\.0\.2\.1\s+b0\s+Up`).Match(sessions) {
		t.Fatalf("BIRD's BFD sessions (%v):\n%s", err, sessions)
	}
	vip := netip.MustParseAddr("198.51.100.10")
	// Frozen: no CEASE, no AdminDown, the TCP connection open.
	frozen := time.Now()
	if err := child.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	testkit.WaitNil(t, 20*time.Second, "the route gone after the freeze", func() error { return noRoute(sock, vip) })
	took := time.Since(frozen)
	t.Logf("the router dropped the frozen speaker's route %v after the freeze (BFD 100ms x 3; hold time 9 s)", took.Round(time.Millisecond))
	if took > 2*time.Second {
		t.Fatalf("the router dropped the route %v after the freeze; BFD should end the session in well under a second", took)
	}
	if proto, _ := exec.Command("birdc", "-s", sock, "show", "protocols", "all", "vigil").CombinedOutput(); !strings.Contains(string(proto), "BFD session down") {
		t.Errorf("BIRD ended the session, but not for BFD:\n%s", proto)
	}
}

// bfdChild is the BFD test's speaker half, run inside namespace A: it
// prints READY once the route is at the router, then waits to be killed.
func bfdChild(t *testing.T, sock string) {
	vip := netip.MustParseAddr("198.51.100.10")
	sp, err := New(Config{
		LocalAS:     65001,
		RouterID:    netip.MustParseAddr("192.0.2.1"),
		Peers:       []Peer{{Address: netip.MustParseAddr("192.0.2.2"), AS: 65000}},
		BFDInterval: 100 * time.Millisecond, BFDMultiplier: 3,
	}, slog.New(slog.NewTextHandler(os.Stderr, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := sp.Start(ctx); err != nil {
		t.Fatal(err)
	}
	// Eligible needs the BGP session and the BFD session up.
	testkit.WaitNil(t, 20*time.Second, "established BGP and BFD sessions", func() error { return sp.Eligible(ctx) })
	if ps := sp.Peers(ctx); len(ps) != 1 || ps[0].BFD != "up" {
		t.Fatalf("peers %+v, want BFD up", ps)
	}
	if err := sp.Advertise(ctx, []netip.Addr{vip}, MED(1)); err != nil {
		t.Fatal(err)
	}
	testkit.WaitNil(t, 20*time.Second, "the route at the router", func() error { return routeIs(sock, vip, "192.0.2.1", MED(1)) })
	fmt.Println("READY")
	// The parent kills this process now; a minute is its bound.
	wait, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	<-wait.Done()
	t.Fatal("not killed")
}

// requireBIRD skips (or fails, under hack/test.sh) without BIRD 2.
func requireBIRD(t *testing.T) {
	t.Helper()
	for _, bin := range []string{"bird", "birdc"} {
		if _, err := exec.LookPath(bin); err != nil {
			nstest.Unavailable(t, "%s is not installed (apt-get install bird2)", bin)
		}
	}
}

// startBIRD runs BIRD with conf in namespace ns until the test ends, and
// returns its control socket; its log is shown if the test fails.
func startBIRD(t *testing.T, ns, conf string) (sock string) {
	t.Helper()
	dir := t.TempDir()
	file := filepath.Join(dir, "bird.conf")
	sock = filepath.Join(dir, "bird.ctl")
	if err := os.WriteFile(file, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	bird := exec.Command("ip", "netns", "exec", ns, "bird", "-f", "-c", file, "-s", sock, "-P", filepath.Join(dir, "bird.pid"))
	out, err := os.Create(filepath.Join(dir, "bird.log"))
	if err != nil {
		t.Fatal(err)
	}
	bird.Stdout, bird.Stderr = out, out
	if err := bird.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = bird.Process.Kill()
		_ = bird.Wait()
		if t.Failed() {
			b, _ := os.ReadFile(out.Name())
			t.Logf("bird's log:\n%s", b)
		}
	})
	return sock
}
