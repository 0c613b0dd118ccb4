package lab

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
)

// Names and addresses of the lab. The subnet exists only inside namespaces
// the lab creates.
const (
	bridge    = "br0"
	nodeIface = "eth0"
	// vipIface is the node's second link in labs built with VIPLink: on the
	// same bridge, without an address of its own, carrying only the VIP, so
	// the VIP's link can fail while etcd's stays up.
	vipIface = "vip0"
	// vipPortSuffix names the switch side of a node's VIP link.
	vipPortSuffix = "v"
	// ResponderPort is where every node's UDP responder listens.
	ResponderPort = 7946
)

// InstanceEnv names the environment variable that picks the lab instance
// this process works on (vigil-lab --instance sets it): empty for the
// default lab, whose namespaces are vlab-*; a name of lowercase letters and
// digits for another, whose namespaces are vlab<name>-*. Every instance is
// a separate set of namespaces with the same addresses inside them, so two
// netns labs (not kubeadm labs, which bind host paths) can run side by
// side, and down removes only its own. Processes the lab starts inherit it.
const InstanceEnv = "VIGIL_LAB_INSTANCE"

var (
	// Prefix starts the name of every namespace of this process's lab
	// instance: "vlab-", or "vlab<instance>-".
	Prefix   = "vlab-"
	switchNS = Prefix + "sw"
	clientNS = Prefix + "cl"
	// instance is the instance's name ("" for the default) and
	// instanceErr what was wrong with the one the environment gave.
	instance    string
	instanceErr error
)

func init() { instanceErr = SetInstance(os.Getenv(InstanceEnv)) }

var instanceRE = regexp.MustCompile(`^[a-z0-9]{1,8}$`)

// SetInstance makes name the lab instance this process works on ("" for
// the default). A name is 1 to 8 lowercase letters and digits: no dash, so
// that no instance's prefix is the start of another's.
func SetInstance(name string) error {
	if name != "" && !instanceRE.MatchString(name) {
		return fmt.Errorf("lab instance %q: want 1 to 8 lowercase letters and digits (%s)", name, InstanceEnv)
	}
	instance = name
	Prefix = "vlab" + name + "-"
	switchNS = Prefix + "sw"
	clientNS = Prefix + "cl"
	machineCgroupRoot = "/" + Prefix
	return nil
}

// Instance returns the lab instance this process works on ("" for the
// default).
func Instance() string { return instance }

var (
	subnetBits = 24
	clientIP   = netip.MustParseAddr("10.250.0.2")
	// VIP is the lab's virtual IP.
	VIP = netip.MustParsePrefix("10.250.0.100/24")
	// VIP6 is the lab's IPv6 virtual IP (--ip-family ipv6 or dual), on
	// subnet6, which labs with IPv6 add beside the IPv4 subnet.
	VIP6      = netip.MustParsePrefix("fd00:250::100/64")
	subnet6   = netip.MustParsePrefix("fd00:250::/64")
	clientIP6 = netip.MustParseAddr("fd00:250::2")
)

// nodeIP returns the address of node i (1-based): 10.250.0.10+i.
func nodeIP(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, 250, 0, byte(10 + i)})
}

// nodeIP6 returns the IPv6 address of node i (1-based): fd00:250::10+i
// (the last byte is 10+i, as in nodeIP).
func nodeIP6(i int) netip.Addr {
	b := subnet6.Addr().As16()
	b[15] = byte(10 + i)
	return netip.AddrFrom16(b)
}

// labVIPs are every address the lab's VIP can have. The lab's own view of
// who holds the VIP counts a node that has any of them: one holder of
// either family, never two.
var labVIPs = []netip.Addr{VIP.Addr(), VIP6.Addr()}

// nodeNS is the namespace of a node.
func nodeNS(name string) string { return Prefix + name }

// ip runs iproute2 and returns its error output as part of the error.
func ip(ctx context.Context, args ...string) error {
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "ip", args...)
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return nil
}

// ipOut runs iproute2 and returns its output.
func ipOut(ctx context.Context, args ...string) (string, error) {
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "ip", args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return string(out), nil
}

// createSwitch makes the switch namespace and its bridge.
func createSwitch(ctx context.Context) error {
	steps := [][]string{
		{"netns", "add", switchNS},
		{"-n", switchNS, "link", "set", "lo", "up"},
		{"-n", switchNS, "link", "add", bridge, "type", "bridge", "forward_delay", "0", "stp_state", "0"},
		{"-n", switchNS, "link", "set", bridge, "up"},
	}
	for _, s := range steps {
		if err := ip(ctx, s...); err != nil {
			return err
		}
	}
	return nil
}

// The ephemeral port range inside the lab's namespaces. Every port a lab
// process listens on is below ephemeralFloor (TestListenPortsBelowEphemeral):
// etcd (2378-2381), the API servers (6443), the bulk and responder
// services, the benchmarks' balancers, vigil's feed and metrics (9557,
// 9558), Prometheus (9090), and in the kubeadm lab the kubelet and the
// control plane's health ports (10248-10259). 54,700 ports remain.
const (
	ephemeralFloor   = 10300
	ephemeralCeiling = 65000
)

// createHost makes a namespace for a host, plugs it into the bridge through
// a veth pair (port name = host name on the switch side, eth0 inside) and
// gives it addr, and addr6 when valid (labs with IPv6; without duplicate
// address detection, which would leave the address unusable for a second).
// Outgoing connections in it never draw a port in reserved.
func createHost(ctx context.Context, name string, addr, addr6 netip.Addr, reserved []int) error {
	ns := Prefix + name
	steps := [][]string{
		{"netns", "add", ns},
		{"-n", ns, "link", "set", "lo", "up"},
		{"-n", switchNS, "link", "add", name, "type", "veth", "peer", "name", nodeIface, "netns", ns},
		{"-n", switchNS, "link", "set", name, "master", bridge, "up"},
		{"-n", ns, "addr", "add", fmt.Sprintf("%s/%d", addr, subnetBits), "dev", nodeIface},
	}
	if addr6.IsValid() {
		steps = append(steps, []string{"-n", ns, "addr", "add", netip.PrefixFrom(addr6, subnet6.Bits()).String(), "dev", nodeIface, "nodad"})
	}
	steps = append(steps, []string{"-n", ns, "link", "set", nodeIface, "up"})
	for _, s := range steps {
		if err := ip(ctx, s...); err != nil {
			return err
		}
	}
	// Benchmarks open tens of thousands of short connections to one
	// address: a wide port range and reuse of TIME_WAIT ports keep the
	// client (and the balancers' side towards the backends) from running
	// out of ports. The range starts above every port a lab process
	// listens on (ephemeralFloor): an outgoing connection of the node's
	// etcd that drew 9558 once kept vigil's metrics server from binding.
	// Per namespace; the host is untouched.
	portRange := fmt.Sprintf("net.ipv4.ip_local_port_range=%d %d", ephemeralFloor, ephemeralCeiling)
	sysctls := []string{portRange, "net.ipv4.tcp_tw_reuse=1"}
	if len(reserved) > 0 {
		// Ports the user chose (--lb-listen-port 16443) may be inside it.
		ps := make([]string, len(reserved))
		for i, p := range reserved {
			ps[i] = strconv.Itoa(p)
		}
		sysctls = append(sysctls, "net.ipv4.ip_local_reserved_ports="+strings.Join(ps, ","))
	}
	for _, kv := range sysctls {
		if out, err := exec.CommandContext(ctx, "ip", "netns", "exec", ns, "sysctl", "-qw", kv).CombinedOutput(); err != nil {
			return fmt.Errorf("lab: sysctl %s in %s: %w: %s", kv, ns, err, strings.TrimSpace(string(out)))
		}
	}
	return nil
}

// addVIPLink gives node a second link, vip0, plugged into the bridge as port
// <node>v. arp_ignore=1 makes each link answer ARP only for its own
// addresses, so the VIP is reachable only through vip0 and a VIP link that
// fails really takes the VIP off the segment.
func addVIPLink(ctx context.Context, node string) error {
	ns := Prefix + node
	port := node + vipPortSuffix
	steps := [][]string{
		{"-n", switchNS, "link", "add", port, "type", "veth", "peer", "name", vipIface, "netns", ns},
		{"-n", switchNS, "link", "set", port, "master", bridge, "up"},
		{"-n", ns, "link", "set", vipIface, "up"},
	}
	for _, s := range steps {
		if err := ip(ctx, s...); err != nil {
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

// setPort brings a host's switch port up (plugged in) or down (cut).
func setPort(ctx context.Context, host string, up bool) error {
	state := "down"
	if up {
		state = "up"
	}
	return ip(ctx, "-n", switchNS, "link", "set", host, state)
}

// labNamespaces lists every namespace whose name starts with Prefix.
func labNamespaces(ctx context.Context) ([]string, error) {
	out, err := ipOut(ctx, "netns", "list")
	if err != nil {
		return nil, err
	}
	var ns []string
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) > 0 && strings.HasPrefix(f[0], Prefix) {
			ns = append(ns, f[0])
		}
	}
	return ns, nil
}

// nsPIDs lists the processes inside a namespace, this one excepted.
//
// `ip netns pids` goes by each process's main thread, and this process
// switches threads into the lab's namespaces for moments (internal/netns:
// every dial into the client namespace, a gRPC reconnect to an etcd member
// that is being killed included). When the main thread was the one, this
// process was listed, and killing the namespace's processes killed the
// caller. (A kubeadm lab test ended "signal: killed" in its clean-up, with
// no OOM kill logged: this is the one way the lab kills what it did not
// start.)
func nsPIDs(ctx context.Context, ns string) ([]int, error) {
	out, err := ipOut(ctx, "netns", "pids", ns)
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, f := range strings.Fields(out) {
		var p int
		if _, err := fmt.Sscanf(f, "%d", &p); err == nil && p != os.Getpid() {
			pids = append(pids, p)
		}
	}
	return pids, nil
}

// destroyAll kills every process in every lab namespace and deletes the
// namespaces (which deletes their veths and the bridge with them).
func destroyAll(ctx context.Context) error {
	nss, err := labNamespaces(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, ns := range nss {
		pids, err := nsPIDs(ctx, ns)
		if err != nil {
			errs = append(errs, err)
		}
		for _, p := range pids {
			killPID(p)
		}
	}
	for _, ns := range nss {
		waitNSEmpty(ctx, ns)
		if err := ip(ctx, "netns", "del", ns); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
