package lab

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/vigil-ha/vigil/internal/clock"
	"github.com/vigil-ha/vigil/internal/netfault"
)

// Gray faults: nothing dies, something gets slow, lossy or one-sided.
//
// Latency. This kernel has no netem, and nftables' queue verdict (NFQUEUE)
// has no module here, so packets cannot be held in the kernel. Instead
// every etcd member listens for clients on NODEIP:2378 and advertises
// NODEIP:2379, where a small proxy of the lab's (`vigil-lab etcd-front`,
// netfault.Proxy) forwards to it. vigil follows the advertised URLs, so
// every etcd answer any vigil gets passes the proxy, which holds it back by
// the delay in force (and only for the clients named, for a per-path
// delay). Raft between the members (2380) is untouched: etcd itself stays
// healthy, exactly the case of a loaded VM, a slow disk behind a busy
// member, or a member far away. A proxy, unlike a delay in the kernel,
// delays whole answers rather than packets, and adds no loss.
//
// Loss and one-way partitions are nftables rules in a node's namespace,
// in a table of their own (grayTable), so that healing one never touches
// the drills' table.

// etcdFrontPort is where each member's front proxy listens (what the
// member advertises); etcdDirectPort is where etcd itself listens.
const (
	etcdFrontPort  = etcdClientPort
	etcdDirectPort = 2378
	roleEtcdFront  = "etcd-front"
	// grayTable holds the loss and one-way rules.
	grayTable = "vigil_gray"
)

func (l *Lab) frontControl(n *Node) string { return l.nodeDir(n) + "/etcd-front.sock" }

// startEtcdFront starts n's front proxy unless it runs.
func (l *Lab) startEtcdFront(n *Node) error {
	if pid := n.PIDs[roleEtcdFront]; pid != 0 && alive(pid) {
		return nil
	}
	return l.start(n, roleEtcdFront, l.selfBin, "etcd-front",
		"--listen", netip.AddrPortFrom(n.IP, etcdFrontPort).String(),
		"--to", netip.AddrPortFrom(n.IP, etcdDirectPort).String(),
		"--control", l.frontControl(n))
}

// EtcdFrontConfig configures `vigil-lab etcd-front`.
type EtcdFrontConfig struct {
	Listen, To, Control string
}

// ServeEtcdFront runs a node's etcd front proxy until ctx ends. Its control
// socket takes PUT /delay with a netfault.Delay as JSON, and answers GET
// /delay with the one in force.
func ServeEtcdFront(ctx context.Context, cfg EtcdFrontConfig, log *slog.Logger) error {
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("etcd-front: %w", err)
	}
	p := netfault.NewProxy(ln, cfg.To, log)
	defer p.Close()
	_ = os.Remove(cfg.Control)
	ctl, err := net.Listen("unix", cfg.Control)
	if err != nil {
		return fmt.Errorf("etcd-front: control socket: %w", err)
	}
	defer ctl.Close()
	go func() {
		_ = http.Serve(ctl, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPut {
				var d netfault.Delay
				if err := json.NewDecoder(r.Body).Decode(&d); err != nil {
					http.Error(w, "bad delay: "+err.Error(), http.StatusBadRequest)
					return
				}
				if err := p.Set(d); err != nil {
					http.Error(w, err.Error(), http.StatusBadRequest)
					return
				}
				log.Info("delay", "latency", d.Latency, "jitter", d.Jitter, "from", d.From)
			}
			_ = json.NewEncoder(w).Encode(p.Delay())
		}))
	}()
	<-ctx.Done()
	return nil
}

// SetEtcdLatency puts delay d on the etcd answers of every node in nodes
// (every node when empty). With d.From naming nodes' addresses, only
// answers to those are late: a per-path delay.
func (l *Lab) SetEtcdLatency(ctx context.Context, nodes []string, d netfault.Delay) error {
	if err := d.Validate(); err != nil {
		return err
	}
	targets, err := l.nodesNamed(nodes)
	if err != nil {
		return err
	}
	body, _ := json.Marshal(d)
	var errs []error
	for _, n := range targets {
		if n.PIDs[roleEtcdFront] == 0 {
			errs = append(errs, fmt.Errorf("lab: %s has no etcd front proxy (a lab from an older vigil-lab; run vigil-lab down and up)", n.Name))
			continue
		}
		c := unixClient(l.frontControl(n))
		req, err := http.NewRequestWithContext(ctx, http.MethodPut, "http://front/delay", bytes.NewReader(body))
		if err != nil {
			return err
		}
		resp, err := c.Do(req)
		if err != nil {
			errs = append(errs, fmt.Errorf("lab: set the etcd latency of %s: %w", n.Name, err))
			continue
		}
		msg, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			errs = append(errs, fmt.Errorf("lab: set the etcd latency of %s: %s", n.Name, strings.TrimSpace(string(msg))))
		}
	}
	return errors.Join(errs...)
}

// unixClient is an HTTP client of the control socket at path (the stand-in
// API server's, the etcd front's).
func unixClient(path string) *http.Client {
	return &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", path)
	}}, Timeout: 5 * time.Second}
}

// nodesNamed returns the named nodes, or all of them for none.
func (l *Lab) nodesNamed(names []string) ([]*Node, error) {
	if len(names) == 0 {
		return l.st.Nodes, nil
	}
	var out []*Node
	for _, name := range names {
		n, err := l.node(name)
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, nil
}

// Directions of a gray nftables rule, seen from the node it is put on.
const (
	DirIn   = "in"  // what reaches the node
	DirOut  = "out" // what the node sends
	DirBoth = "both"
)

// Loss drops pct % of the IP packets of node n in dir, to and from peers
// (every other lab address when empty): nftables' numgen random. Loopback
// is never touched.
type Loss struct {
	Node  string
	Pct   int
	Dir   string
	Peers []string
}

// Validate refuses a share outside 0–100 or an unknown direction.
func (x Loss) Validate() error {
	if x.Pct < 0 || x.Pct > 100 {
		return fmt.Errorf("lab: packet loss %d%% is outside 0-100", x.Pct)
	}
	switch x.Dir {
	case DirIn, DirOut, DirBoth:
	default:
		return fmt.Errorf("lab: direction %q is not in, out or both", x.Dir)
	}
	return nil
}

// grayRules builds the nftables script for a rule verdict on n's traffic
// with the peers' addresses in dir.
func grayRules(dir string, peers []netip.Addr, verdict string) string {
	var set []string
	for _, p := range peers {
		set = append(set, p.String())
	}
	match := func(field string) string {
		if len(set) == 0 {
			return ""
		}
		return fmt.Sprintf("ip %s { %s } ", field, strings.Join(set, ", "))
	}
	var b strings.Builder
	fmt.Fprintf(&b, "table inet %s {\n", grayTable)
	if dir == DirIn || dir == DirBoth {
		fmt.Fprintf(&b, "\tchain gray_in {\n\t\ttype filter hook input priority -10; policy accept;\n\t\tiifname != \"lo\" %s%s\n\t}\n", match("saddr"), verdict)
	}
	if dir == DirOut || dir == DirBoth {
		fmt.Fprintf(&b, "\tchain gray_out {\n\t\ttype filter hook output priority -10; policy accept;\n\t\toifname != \"lo\" %s%s\n\t}\n", match("daddr"), verdict)
	}
	b.WriteString("}\n")
	return b.String()
}

// peerAddrs returns the addresses of the named nodes, or of every node but
// self for none.
func (l *Lab) peerAddrs(self string, names []string) ([]netip.Addr, error) {
	if len(names) == 0 {
		for _, n := range l.st.Nodes {
			if n.Name != self {
				names = append(names, n.Name)
			}
		}
	}
	var out []netip.Addr
	for _, name := range names {
		n, err := l.node(name)
		if err != nil {
			return nil, err
		}
		out = append(out, n.IP)
	}
	return out, nil
}

// SetLoss puts the loss rule on its node, replacing any gray rule there.
func (l *Lab) SetLoss(ctx context.Context, x Loss) error {
	if err := x.Validate(); err != nil {
		return err
	}
	peers, err := l.peerAddrs(x.Node, x.Peers)
	if err != nil {
		return err
	}
	verdict := fmt.Sprintf("numgen random mod 100 < %d drop", x.Pct)
	return l.setGray(ctx, x.Node, grayRules(x.Dir, peers, verdict))
}

// SetOneWay cuts one direction between node and peers (every other node
// when empty): DirIn, node hears nothing from them and they still hear
// it; DirOut the reverse. ARP is not IP and still flows: the link stays
// up, only the conversation becomes one-sided.
func (l *Lab) SetOneWay(ctx context.Context, node, dir string, peers []string) error {
	if dir != DirIn && dir != DirOut {
		return fmt.Errorf("lab: a one-way partition is in or out, not %q", dir)
	}
	addrs, err := l.peerAddrs(node, peers)
	if err != nil {
		return err
	}
	return l.setGray(ctx, node, grayRules(dir, addrs, "drop"))
}

// needNft says what to install when the nft command, which the loss and
// one-way faults and the firewall drills use, is missing.
func needNft(what string) error {
	if _, err := exec.LookPath("nft"); err != nil {
		return fmt.Errorf("lab: %s needs the nft command (apt-get install nftables)", what)
	}
	return nil
}

// setGray replaces the gray table of a node with script.
func (l *Lab) setGray(ctx context.Context, node, script string) error {
	if err := needNft("a loss or one-way fault"); err != nil {
		return err
	}
	n, err := l.node(node)
	if err != nil {
		return err
	}
	if err := l.ClearGray(ctx, node); err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", nodeNS(n.Name), "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("nft in %s: %w: %s", n.Name, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// ClearGray removes the loss and one-way rules of the named nodes (every
// node when none).
func (l *Lab) ClearGray(ctx context.Context, nodes ...string) error {
	targets, err := l.nodesNamed(nodes)
	if err != nil {
		return err
	}
	var errs []error
	for _, n := range targets {
		out, err := exec.CommandContext(context.WithoutCancel(ctx), "ip", "netns", "exec", nodeNS(n.Name), "nft", "delete", "table", "inet", grayTable).CombinedOutput()
		if err != nil && !strings.Contains(string(out), "No such file") {
			errs = append(errs, fmt.Errorf("nft in %s: %w: %s", n.Name, err, strings.TrimSpace(string(out))))
		}
	}
	return errors.Join(errs...)
}

// SlowProcess starves one process: it is stopped for stop and let run for
// run, over and over, until ctx ends or for d, as a CPU starved by its
// neighbours would run it. It leaves the process running.
func SlowProcess(ctx context.Context, pid int, stop, run, d time.Duration) error {
	if stop <= 0 || run <= 0 {
		return fmt.Errorf("lab: slow-process needs positive stop and run times, not %v and %v", stop, run)
	}
	if !alive(pid) {
		return fmt.Errorf("lab: process %d is not running", pid)
	}
	defer func() { _ = syscall.Kill(pid, syscall.SIGCONT) }()
	end := time.Now().Add(d)
	for time.Now().Before(end) && ctx.Err() == nil {
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			return fmt.Errorf("lab: stop %d: %w", pid, err)
		}
		clock.Sleep(ctx, stop)
		if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
			return fmt.Errorf("lab: continue %d: %w", pid, err)
		}
		clock.Sleep(ctx, run)
	}
	return nil
}

// NodeIP returns the address of node name.
func (l *Lab) NodeIP(name string) (netip.Addr, error) {
	n, err := l.node(name)
	if err != nil {
		return netip.Addr{}, err
	}
	return n.IP, nil
}

// NodeNames returns the names given, checked, or every node's for none.
func (l *Lab) NodeNames(names []string) ([]string, error) {
	ns, err := l.nodesNamed(names)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, n := range ns {
		out = append(out, n.Name)
	}
	return out, nil
}
