package lab

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/vigil-ha/vigil/internal/clock"
)

// The routed lab (--announce bgp): a router namespace between the nodes'
// segment and the client, running BIRD 2, a real BGP daemon. The client
// reaches the VIP only through the router, by the host route the VIP
// holder advertises: the nodes answer ARP only for addresses on the link
// it arrives on (arp_ignore=1), and the VIP sits on their lo.
//
//	client 10.251.0.2 --- 10.251.0.1 router 10.250.0.254 --- br0 --- nodes 10.250.0.1x
const (
	AnnounceARP = "arp"
	AnnounceBGP = "bgp"

	routerName = "rt"
	// RouterAS is the router's AS; NodeAS is every vigil node's.
	RouterAS = 65000
	NodeAS   = 65001
	// routerLink is the router's link to the client.
	routerLink = "eth1"
	roleBird   = "bird"
)

var (
	routerIP       = netip.MustParseAddr("10.250.0.254")
	clientNet      = netip.MustParsePrefix("10.251.0.0/24")
	routerClientIP = netip.MustParseAddr("10.251.0.1")
	routedClientIP = netip.MustParseAddr("10.251.0.2")
	// The same for IPv6, in labs with IPv6.
	routerIP6       = netip.MustParseAddr("fd00:250::fe")
	clientNet6      = netip.MustParsePrefix("fd00:251::/64")
	routerClientIP6 = netip.MustParseAddr("fd00:251::1")
	routedClientIP6 = netip.MustParseAddr("fd00:251::2")
)

// clientIP6 is the client's IPv6 address in a lab with IPv6 (routed or
// not), else the zero Addr.
func (s Settings) clientIP6() netip.Addr {
	switch {
	case !s.has6():
		return netip.Addr{}
	case s.bgp():
		return routedClientIP6
	}
	return clientIP6
}

// bgp tells whether the lab announces the VIP over BGP through a router.
func (s Settings) bgp() bool { return s.Announce == AnnounceBGP }

// BGPModeECMP is Settings.BGPMode for vigil run --bgp-mode ecmp.
const BGPModeECMP = "ecmp"

func (s Settings) ecmp() bool { return s.BGPMode == BGPModeECMP }

// routerNode is the router's entry in the lab's state (its processes).
func (l *Lab) routerNode() *Node {
	if l.st.Router == nil {
		l.st.Router = &Node{Name: routerName, IP: routerIP, PIDs: map[string]int{}}
	}
	return l.st.Router
}

// createRoutedClient makes the router namespace, plugged into the bridge,
// and the client namespace behind it.
func createRoutedClient(ctx context.Context, s Settings) error {
	var rip6 netip.Addr
	if s.has6() {
		rip6 = routerIP6
	}
	if err := createHost(ctx, routerName, routerIP, rip6, nil); err != nil {
		return err
	}
	rt, cl := nodeNS(routerName), clientNS
	steps := [][]string{
		{"netns", "add", cl},
		{"-n", cl, "link", "set", "lo", "up"},
		{"-n", rt, "link", "add", routerLink, "type", "veth", "peer", "name", nodeIface, "netns", cl},
		{"-n", rt, "addr", "add", netip.PrefixFrom(routerClientIP, clientNet.Bits()).String(), "dev", routerLink},
		{"-n", rt, "link", "set", routerLink, "up"},
		{"-n", cl, "addr", "add", netip.PrefixFrom(routedClientIP, clientNet.Bits()).String(), "dev", nodeIface},
		{"-n", cl, "link", "set", nodeIface, "up"},
		{"-n", cl, "route", "add", "default", "via", routerClientIP.String()},
	}
	// Multipath routes (--bgp-mode ecmp) are spread by addresses and
	// ports: the client is one address.
	sysctls := []string{"net.ipv4.ip_forward=1", "net.ipv4.fib_multipath_hash_policy=1"}
	if s.has6() {
		steps = append(steps,
			[]string{"-n", rt, "addr", "add", netip.PrefixFrom(routerClientIP6, clientNet6.Bits()).String(), "dev", routerLink, "nodad"},
			[]string{"-n", cl, "addr", "add", netip.PrefixFrom(routedClientIP6, clientNet6.Bits()).String(), "dev", nodeIface, "nodad"},
			[]string{"-n", cl, "-6", "route", "add", "default", "via", routerClientIP6.String()})
		sysctls = append(sysctls, "net.ipv6.conf.all.forwarding=1")
	}
	for _, st := range steps {
		if err := ip(ctx, st...); err != nil {
			return err
		}
	}
	for _, kv := range sysctls {
		if out, err := exec.CommandContext(ctx, "ip", "netns", "exec", rt, "sysctl", "-qw", kv).CombinedOutput(); err != nil {
			return fmt.Errorf("lab: sysctl %s in %s: %w: %s", kv, rt, err, strings.TrimSpace(string(out)))
		}
	}
	return nil
}

// routeNode prepares a node of the routed lab: the way back to the client
// through the router, and ARP answered only for the link's own addresses,
// so the VIP on lo is reachable only by the router's BGP route.
func routeNode(ctx context.Context, node string, v6 bool) error {
	ns := nodeNS(node)
	if err := ip(ctx, "-n", ns, "route", "add", clientNet.String(), "via", routerIP.String()); err != nil {
		return err
	}
	if v6 {
		if err := ip(ctx, "-n", ns, "-6", "route", "add", clientNet6.String(), "via", routerIP6.String()); err != nil {
			return err
		}
	}
	for _, kv := range []string{"net.ipv4.conf.all.arp_ignore=1", "net.ipv4.conf.all.arp_announce=2"} {
		if out, err := exec.CommandContext(ctx, "ip", "netns", "exec", ns, "sysctl", "-qw", kv).CombinedOutput(); err != nil {
			return fmt.Errorf("lab: sysctl %s in %s: %w: %s", kv, ns, err, strings.TrimSpace(string(out)))
		}
	}
	return nil
}

// birdConf is the router's BIRD 2 configuration: one eBGP session per
// node and family, every route learned installed in the router's kernel
// table. BIRD compares MEDs of routes from one neighbouring AS (all nodes
// share NodeAS), which is how the newest holder's route wins at once.
//
// With bfd, BIRD runs BFD with every node (interval x 3) and ends a
// node's BGP session when its BFD session goes down. A table other than 0
// is the kernel table BIRD installs its IPv4 routes in (fib.go), instead
// of the main one.
func birdConf(nodes []*Node, v6, bfd, ecmp bool, table int, interval time.Duration) string {
	var b strings.Builder
	bfdOn := ""
	if bfd {
		bfdOn = "\tbfd on;\n"
	}
	merge := ""
	if ecmp {
		// Equal routes from several nodes become one multipath route.
		merge = "\tmerge paths on;\n"
	}
	if table != 0 {
		merge += fmt.Sprintf("\tkernel table %d;\n", table)
	}
	fmt.Fprintf(&b, `router id %s;
log stderr all;
protocol device { scan time 10; }
protocol kernel kernel4 {
	ipv4 { import none; export all; };
%s}
template bgp vigil {
	local %s as %d;
	hold time 9;
	keepalive time 3;
	connect retry time 1;
	error wait time 1, 10;
%s	ipv4 { import all; export none; };
}
`, routerIP, merge, routerIP, RouterAS, bfdOn)
	if bfd {
		ms := interval.Milliseconds()
		fmt.Fprintf(&b, `protocol bfd {
	interface "*" { min rx interval %d ms; min tx interval %d ms; multiplier 3; };
}
`, ms, ms)
	}
	if v6 {
		fmt.Fprintf(&b, `protocol kernel kernel6 {
	ipv6 { import none; export all; };
}
template bgp vigil6 {
	local %s as %d;
	hold time 9;
	keepalive time 3;
	connect retry time 1;
	error wait time 1, 10;
%s	ipv6 { import all; export none; };
}
`, routerIP6, RouterAS, bfdOn)
	}
	for _, n := range nodes {
		fmt.Fprintf(&b, "protocol bgp %s from vigil { neighbor %s as %d; }\n", n.Name, n.IP, NodeAS)
		if v6 {
			fmt.Fprintf(&b, "protocol bgp %s_6 from vigil6 { neighbor %s as %d; }\n", n.Name, nodeIP6(n.Index), NodeAS)
		}
	}
	return b.String()
}

// startRouter writes the BIRD configuration for the lab's nodes and starts
// BIRD in the router namespace.
func (l *Lab) startRouter() error {
	rt := l.routerNode()
	dir := l.nodeDir(rt)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("lab: %w", err)
	}
	conf := filepath.Join(dir, "bird.conf")
	table := 0
	if l.st.Settings.resilient() {
		table = routerBGPTable
		// The copy first, so that it sees BIRD's first route.
		vip := l.st.Settings.vipAddr()
		if err := l.start(rt, roleRouterFIB, l.selfBin, "router-fib", "--table", itoa(table), "--prefix", netip.PrefixFrom(vip, vip.BitLen()).String()); err != nil {
			return err
		}
	}
	if err := os.WriteFile(conf, []byte(birdConf(l.st.Nodes, l.st.Settings.has6(), l.st.Settings.BGPBFD, l.st.Settings.ecmp(), table, l.st.Settings.bfdInterval())), 0o644); err != nil {
		return fmt.Errorf("lab: %w", err)
	}
	return l.start(rt, roleBird, "bird", "-f", "-c", conf, "-s", l.birdSocket(), "-P", filepath.Join(dir, "bird.pid"))
}

func (l *Lab) birdSocket() string { return filepath.Join(l.nodeDir(l.routerNode()), "bird.ctl") }

// BFDInterval is the BFD interval of the routed lab with --bgp-bfd, on
// both sides.
const BFDInterval = 100 * time.Millisecond

// bfdInterval is the lab's BFD interval: Settings.BFDInterval, or
// BFDInterval.
func (s Settings) bfdInterval() time.Duration {
	if s.BFDInterval > 0 {
		return s.BFDInterval
	}
	return BFDInterval
}

// RouterRoute is the router's route to the VIP: the next hops it forwards
// to ("" when it has none) and every node whose advertisement it holds.
type RouterRoute struct {
	NextHop string `json:"nextHop"`
	// NextHops are a multipath route's next hops (--bgp-mode ecmp).
	NextHops []string `json:"nextHops,omitempty"`
	Learned  []string `json:"learned"`
}

// VIPRoute reads the router's route to the VIP: the kernel's forwarding
// entry (what packets follow) and BIRD's routes (from which nodes).
func (l *Lab) VIPRoute(ctx context.Context) (RouterRoute, error) {
	var r RouterRoute
	if !l.st.Settings.bgp() {
		return r, errors.New("lab: not a routed lab (vigil-lab up --announce bgp)")
	}
	vip := l.st.Settings.vipAddr()
	fam := "-4"
	if vip.Is6() {
		fam = "-6"
	}
	out, err := ipOut(ctx, "-n", nodeNS(routerName), fam, "route", "show", netip.PrefixFrom(vip, vip.BitLen()).String())
	if err != nil {
		return r, err
	}
	if f := strings.Fields(out); len(f) >= 3 && f[1] == "via" {
		r.NextHop = f[2]
	}
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) >= 3 && f[0] == "nexthop" && f[1] == "via" {
			r.NextHops = append(r.NextHops, f[2])
		}
	}
	cmd := exec.CommandContext(ctx, "birdc", "-s", l.birdSocket(), "show", "route", "for", vip.String(), "all")
	b, err := cmd.Output()
	if err != nil {
		return r, fmt.Errorf("lab: birdc: %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if i := strings.Index(line, "BGP.next_hop: "); i >= 0 {
			r.Learned = append(r.Learned, strings.TrimSpace(line[i+len("BGP.next_hop: "):]))
		}
	}
	return r, nil
}

// waitRouterSessions waits until BIRD has an established session to every
// node.
func (l *Lab) waitRouterSessions(ctx context.Context, d time.Duration) error {
	deadline := time.Now().Add(d)
	var last string
	for time.Now().Before(deadline) {
		out, err := exec.CommandContext(ctx, "birdc", "-s", l.birdSocket(), "show", "protocols").Output()
		if err == nil {
			up := 0
			for _, line := range strings.Split(string(out), "\n") {
				if strings.Contains(line, "BGP") && strings.Contains(line, "Established") {
					up++
				}
			}
			want := len(l.st.Nodes)
			if l.st.Settings.has6() {
				want *= 2
			}
			if up == want {
				return nil
			}
			last = string(out)
		} else {
			last = err.Error()
		}
		if !clock.Sleep(ctx, 100*time.Millisecond) {
			return ctx.Err()
		}
	}
	return fmt.Errorf("lab: the router did not establish a BGP session with every node in %v:\n%s", d, last)
}
