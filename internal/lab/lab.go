package lab

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/vigil-ha/vigil/internal/clock"
	"github.com/vigil-ha/vigil/internal/feed"
)

// Implementations the lab can run on its nodes.
const (
	ImplVigil           = "vigil"
	ImplKeepalived      = "keepalived"       // kubeadm's documented HA recipe
	ImplKeepalivedTuned = "keepalived-tuned" // VRRPv3 with 0.1 s adverts
)

// ErrNotUp is returned when no lab state exists.
var ErrNotUp = errors.New("lab: no lab is up (run vigil-lab up)")

// ErrNotRoot is returned when the lab is used without root.
var ErrNotRoot = errors.New("lab: network namespaces need root")

// DefaultDir holds the lab's state, data and logs.
const DefaultDir = "/run/vigil-lab"

// Node is one control-plane node of the lab.
type Node struct {
	Name  string         `json:"name"`
	Index int            `json:"index"`
	IP    netip.Addr     `json:"ip"`
	PIDs  map[string]int `json:"pids"`
	// Cut is true while the node's switch port is down.
	Cut bool `json:"cut"`
	// VigilBin, when set, is the vigil binary this node runs instead of
	// the lab's (the rolling-upgrade drill's old version).
	VigilBin string `json:"vigilBin,omitempty"`
}

type state struct {
	Settings Settings `json:"settings"`
	Nodes    []*Node  `json:"nodes"`
	// Retired are indexes of nodes replaced for good; they are not reused
	// while the lab is up.
	Retired []int `json:"retired,omitempty"`
	// Workers run vigil agent and the worker clients (no etcd, no VIP).
	Workers []*Node `json:"workers,omitempty"`
	// Router is the routed lab's router (--announce bgp), for its BIRD.
	Router *Node `json:"router,omitempty"`
}

// Config locates the lab's files and binaries.
type Config struct {
	Dir      string // DefaultDir when empty
	VigilBin string // the vigil binary run on each node
	// AgentBin is the vigil-agent binary run on each worker (default:
	// vigil-agent beside VigilBin).
	AgentBin string
	SelfBin  string // the vigil-lab binary, re-run as etcd and responder
	// Progress, when set, receives one line per step of long operations
	// (the kubeadm lab's up).
	Progress io.Writer
	// EtcdDataDir, when set, holds each kubeadm machine's /var/lib/etcd
	// (a directory per node), instead of the machine's directory under
	// Dir: the tests give a tmpfs, so that the members' fsyncs do not wait
	// behind the builds beside them.
	EtcdDataDir string
}

// Lab is a handle on the lab; it is not safe for concurrent use.
type Lab struct {
	dir      string
	vigilBin string
	agentBin string
	selfBin  string
	etcdData string // Config.EtcdDataDir
	// upgradeFrom is the old vigil of the rolling-upgrade drill.
	upgradeFrom string
	st          state
	log         *slog.Logger
	out         io.Writer
	// nodesMu guards st.Nodes where a drill changes it (scale, replace,
	// recover) while its samplers read it from their own goroutines
	// (liveNodes); the drill's own goroutine reads it freely.
	nodesMu sync.Mutex
	// flags caches knowsFlag's answers, by binary and flag.
	flagsMu sync.Mutex
	flags   map[string]bool
}

// editNodes changes the node list under nodesMu.
func (l *Lab) editNodes(f func([]*Node) []*Node) {
	l.nodesMu.Lock()
	defer l.nodesMu.Unlock()
	l.st.Nodes = f(l.st.Nodes)
}

// liveNodes is a copy of the node list, safe from any goroutine.
func (l *Lab) liveNodes() []*Node {
	l.nodesMu.Lock()
	defer l.nodesMu.Unlock()
	return slices.Clone(l.st.Nodes)
}

func appendNode(n *Node) func([]*Node) []*Node {
	return func(ns []*Node) []*Node { return append(ns, n) }
}

func dropNodes(drop func(*Node) bool) func([]*Node) []*Node {
	return func(ns []*Node) []*Node { return slices.DeleteFunc(ns, drop) }
}

// progress reports a step of a long operation.
func (l *Lab) progress(format string, args ...any) {
	if l.out != nil {
		fmt.Fprintf(l.out, format+"\n", args...)
	}
}

// New returns a handle; it touches nothing.
func New(cfg Config, log *slog.Logger) (*Lab, error) {
	if instanceErr != nil {
		return nil, instanceErr
	}
	if os.Geteuid() != 0 {
		return nil, ErrNotRoot
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return nil, errors.New("lab: the ip command (iproute2) is not installed")
	}
	if cfg.Dir == "" {
		cfg.Dir = DefaultDir
	}
	if cfg.AgentBin == "" {
		cfg.AgentBin = filepath.Join(filepath.Dir(cfg.VigilBin), "vigil-agent")
	}
	return &Lab{dir: cfg.Dir, vigilBin: cfg.VigilBin, agentBin: cfg.AgentBin, selfBin: cfg.SelfBin, etcdData: cfg.EtcdDataDir, log: log, out: cfg.Progress}, nil
}

// Open loads the state of a lab that is up.
func (l *Lab) Open() error { return l.load() }

// Up builds the lab and waits until it has a VIP holder. On failure it tears
// down whatever it built.
func (l *Lab) Up(ctx context.Context, s Settings) (err error) {
	if err := s.Validate(); err != nil {
		return err
	}
	if s.Kubeadm && instance != "" {
		return fmt.Errorf("lab: the kubeadm lab binds host paths and runs the host's containerd, so there is one at a time, in the default instance (unset %s)", InstanceEnv)
	}
	if l.st.Settings.Impl == ImplVigil || s.Impl == ImplVigil {
		if _, err := os.Stat(l.vigilBin); err != nil {
			return fmt.Errorf("lab: vigil binary: %w (pass --vigil-bin)", err)
		}
		if _, err := os.Stat(l.agentBin); err != nil && s.Workers > 0 && !s.Kubeadm {
			return fmt.Errorf("lab: vigil-agent binary for the workers: %w (build it beside vigil: hack/build.sh)", err)
		}
	}
	var kin kubeadmInputs
	if s.Kubeadm {
		// Missing binaries or images are refused before anything is built.
		var err error
		if kin, err = l.kubeadmInputs(); err != nil {
			return err
		}
	}
	if s.bgp() {
		for _, bin := range []string{"bird", "birdc"} {
			if _, err := exec.LookPath(bin); err != nil {
				return errors.New("lab: --announce bgp needs BIRD 2 (apt-get install bird2)")
			}
		}
	}
	if s.Impl != ImplVigil {
		if _, err := exec.LookPath("keepalived"); err != nil {
			return errors.New("lab: keepalived is not installed (apt-get install keepalived)")
		}
	}
	if nss, err := labNamespaces(ctx); err != nil {
		return err
	} else if len(nss) > 0 {
		return fmt.Errorf("lab: a lab is already up (namespaces %s); run vigil-lab down first", strings.Join(nss, " "))
	}
	defer func() {
		if err != nil {
			l.log.Warn("lab up failed; tearing down", "err", err)
			if derr := l.Down(context.Background()); derr != nil {
				l.log.Error("teardown failed", "err", derr)
			}
		}
	}()
	if err := os.MkdirAll(l.dir, 0o755); err != nil {
		return fmt.Errorf("lab: %w", err)
	}
	l.st = state{Settings: s}
	if err := createSwitch(ctx); err != nil {
		return err
	}
	if s.bgp() {
		if err := createRoutedClient(ctx, s); err != nil {
			return err
		}
	} else if err := createHost(ctx, "cl", clientIP, s.clientIP6(), s.reservedPorts()); err != nil {
		return err
	}
	ca, err := l.newPKI()
	if err != nil {
		return err
	}
	if s.Kubeadm {
		return l.upKubeadm(ctx, s, kin)
	}
	if s.kube() {
		if err := l.prepareKube(); err != nil {
			return err
		}
	}
	for i := 1; i <= s.Nodes; i++ {
		n := &Node{Name: "n" + itoa(i), Index: i, IP: nodeIP(i), PIDs: map[string]int{}}
		if err := os.MkdirAll(l.nodeDir(n), 0o755); err != nil {
			return fmt.Errorf("lab: %w", err)
		}
		if err := ca.issue(n.Name, []netip.Addr{n.IP, VIP.Addr(), VIP6.Addr(), netip.MustParseAddr("127.0.0.1")}, l.apiCert(n), l.apiKey(n)); err != nil {
			return err
		}
		if err := l.createNodeHost(ctx, n); err != nil {
			return err
		}
		l.editNodes(appendNode(n))
	}
	if err := l.save(); err != nil {
		return err
	}
	if s.bgp() {
		if err := l.startRouter(); err != nil {
			return err
		}
	}
	for _, n := range l.st.Nodes {
		if err := l.startNode(n); err != nil {
			return err
		}
	}
	if s.Impl == ImplVigil {
		if err := l.waitEtcdHealthy(ctx, 30*time.Second); err != nil {
			return err
		}
	}
	stable := 30 * time.Second
	if s.kube() {
		stable = 120 * time.Second // three kube-apiservers start on two cores
	}
	if s.bgp() {
		if err := l.waitRouterSessions(ctx, stable); err != nil {
			return err
		}
	}
	if s.ecmp() {
		// Every node carries the VIP: up once the router spreads over all.
		if _, err := l.waitNextHops(ctx, l.nodeIPs(), stable); err != nil {
			return err
		}
	} else if _, err := l.waitStable(ctx, stable); err != nil {
		return err
	}
	if s.Workers > 0 {
		return l.ensureWorkers(ctx, s.Workers)
	}
	return nil
}

// createNodeHost makes a control-plane node's namespace and links.
func (l *Lab) createNodeHost(ctx context.Context, n *Node) error {
	if err := createHost(ctx, n.Name, n.IP, l.st.Settings.addr6(n.Index), l.st.Settings.reservedPorts()); err != nil {
		return err
	}
	if l.st.Settings.bgp() {
		return routeNode(ctx, n.Name, l.st.Settings.has6())
	}
	if l.st.Settings.VIPLink {
		return addVIPLink(ctx, n.Name)
	}
	return nil
}

// setNodePorts plugs a node's switch ports in (up) or cuts them, the VIP
// link's included.
func (l *Lab) setNodePorts(ctx context.Context, n *Node, up bool) error {
	if err := setPort(ctx, n.Name, up); err != nil {
		return err
	}
	if l.st.Settings.VIPLink {
		return setPort(ctx, n.Name+vipPortSuffix, up)
	}
	return nil
}

// Workers returns the lab's worker nodes.
func (l *Lab) Workers() []*Node { return l.st.Workers }

// Down removes everything the lab created, whether or not its state file
// survived.
func (l *Lab) Down(ctx context.Context) error {
	err := destroyAll(ctx)
	// The kubeadm lab's machines: after their processes are gone.
	err = errors.Join(err, l.destroyMachines())
	if rerr := os.RemoveAll(l.dir); rerr != nil {
		err = errors.Join(err, rerr)
	}
	return err
}

// Nodes returns the lab's nodes.
func (l *Lab) Nodes() []*Node { return l.st.Nodes }

// Settings returns the settings the lab was built with.
func (l *Lab) Settings() Settings { return l.st.Settings }

func (l *Lab) node(name string) (*Node, error) {
	for _, n := range l.st.Nodes {
		if n.Name == name {
			return n, nil
		}
	}
	return nil, fmt.Errorf("lab: no node %q", name)
}

// startNode starts every process a node runs.
func (l *Lab) startNode(n *Node) error {
	if err := l.start(n, roleResponder, l.selfBin, "responder", "--name", n.Name, "--port", itoa(ResponderPort)); err != nil {
		return err
	}
	if l.st.Settings.Impl != ImplVigil {
		return l.startKeepalived(n)
	}
	if err := l.startEtcd(n); err != nil {
		return err
	}
	return l.startServices(n)
}

// startServices starts what runs on a vigil node besides etcd: the
// responder, the stand-in API server and vigil.
func (l *Lab) startServices(n *Node) error {
	if n.PIDs[roleResponder] == 0 || !alive(n.PIDs[roleResponder]) {
		if err := l.start(n, roleResponder, l.selfBin, "responder", "--name", n.Name, "--port", itoa(ResponderPort)); err != nil {
			return err
		}
	}
	if err := l.startAPIServer(n); err != nil {
		return err
	}
	return l.startVigil(n)
}

func (l *Lab) apiCert(n *Node) string    { return filepath.Join(l.nodeDir(n), "apiserver.crt") }
func (l *Lab) apiKey(n *Node) string     { return filepath.Join(l.nodeDir(n), "apiserver.key") }
func (l *Lab) apiControl(n *Node) string { return filepath.Join(l.nodeDir(n), "apiserver.sock") }

// startAPIServer starts the node's stand-in kube-apiserver, bound to the
// node's own address as vigil's load balancer requires.
func (l *Lab) startAPIServer(n *Node) error {
	if l.st.Settings.kube() {
		return l.startKubeAPIServer(n)
	}
	return l.start(n, roleAPIServer, l.selfBin, "apiserver", "--name", n.Name,
		"--listen", netip.AddrPortFrom(n.IP, APIServerPort).String(),
		"--bulk-listen", netip.AddrPortFrom(n.IP, BulkPort).String(),
		"--cert", l.apiCert(n), "--key", l.apiKey(n), "--control", l.apiControl(n))
}

func (l *Lab) etcdEndpoints() []string {
	var eps []string
	for _, n := range l.st.Nodes {
		eps = append(eps, fmt.Sprintf("http://%s:2379", n.IP))
	}
	return eps
}

func (l *Lab) startEtcd(n *Node) error {
	var cluster []string
	for _, m := range l.st.Nodes {
		cluster = append(cluster, fmt.Sprintf("%s=http://%s:2380", m.Name, m.IP))
	}
	return l.startEtcdWith(n, strings.Join(cluster, ","), "new")
}

// startEtcdWith starts n's etcd member; with state "existing" it joins a
// running cluster (its data dir, if any, takes precedence).
// Clients reach it through its front proxy (gray.go), which it
// advertises; on the node itself 127.0.0.1:2379 reaches etcd directly.
func (l *Lab) startEtcdWith(n *Node, cluster, clusterState string) error {
	if err := l.startEtcdFront(n); err != nil {
		return err
	}
	return l.start(n, roleEtcd, l.selfBin, "etcd",
		"--name", n.Name,
		"--data-dir", l.nodeDir(n)+"/etcd",
		"--listen-client-urls", fmt.Sprintf("http://%s:%d,http://127.0.0.1:2379", n.IP, etcdDirectPort),
		"--advertise-client-urls", fmt.Sprintf("http://%s:%d", n.IP, etcdFrontPort),
		"--listen-peer-urls", fmt.Sprintf("http://%s:2380", n.IP),
		"--initial-advertise-peer-urls", fmt.Sprintf("http://%s:2380", n.IP),
		"--initial-cluster", cluster,
		"--initial-cluster-state", clusterState,
		"--initial-cluster-token", "vigil-lab",
		"--log-level", cmp.Or(l.st.Settings.EtcdLogLevel, "warn"),
	)
}

// labMetricsPort is vigil run's metrics port on every lab node (its
// default, 9558).
const labMetricsPort = 9558

func (l *Lab) startVigil(n *Node) error {
	s := l.st.Settings
	election := ElectionEtcd
	if s.Election == ElectionKubernetes {
		election = ElectionKubernetes
	}
	args := []string{"run"}
	for _, v := range s.vips() {
		args = append(args, "--vip", v.String())
	}
	args = append(args, "--interface", s.vipIface(), "--node-name", n.Name,
		"--election", election, "--etcd-endpoints", strings.Join(l.etcdEndpoints(), ","),
	)
	if s.bgp() {
		// The router ID defaults to the node's address towards the peer.
		args = append(args, "--announce", AnnounceBGP, "--bgp-local-as", itoa(NodeAS),
			"--bgp-peer", fmt.Sprintf("%s,%d", routerIP, RouterAS))
		if s.BGPBFD {
			args = append(args, "--bgp-bfd", "--bgp-bfd-interval", s.bfdInterval().String())
		}
		if s.ecmp() {
			args = append(args, "--bgp-mode", BGPModeECMP)
		}
		if s.has6() {
			args = append(args, "--bgp-peer", fmt.Sprintf("%s,%d", routerIP6, RouterAS))
		}
	}
	if s.kube() {
		// This node's own API server: the Lease (with that election),
		// Events and the EndpointSlices; etcd stays for discovery,
		// membership and raft-leadership shedding.
		args = append(args, "--kubeconfig", l.kubeconfig(n))
	}
	if s.LeaseDuration > 0 {
		args = append(args, "--lease-duration", s.LeaseDuration.String())
	}
	if s.RenewDeadline > 0 {
		args = append(args, "--renew-deadline", s.RenewDeadline.String())
	}
	if s.RetryPeriod > 0 {
		args = append(args, "--retry-period", s.RetryPeriod.String())
	}
	args = append(args, "--health-ca", l.caPath())
	if s.LBPort > 0 {
		args = append(args, "--lb-port", itoa(s.LBPort))
	}
	if s.BackendPort > 0 {
		args = append(args, "--backend-port", itoa(s.BackendPort))
	}
	if s.HealthPort > 0 {
		args = append(args, "--health-port", itoa(s.HealthPort))
	}
	if s.HealthGrace > 0 {
		args = append(args, "--health-grace", s.HealthGrace.String())
	}
	if s.LBMaxConns != 0 {
		args = append(args, "--lb-max-conns", itoa(s.LBMaxConns))
	}
	if s.LBEventLoops != 0 {
		args = append(args, "--lb-event-loops", itoa(s.LBEventLoops))
	}
	if s.PruneAfter > 0 {
		args = append(args, "--prune-after", s.PruneAfter.String())
	}
	// Metrics on every address, for the prometheus drill's scrapes from
	// the client namespace (127.0.0.1:9558, where the lab reads /status,
	// is among them).
	metrics := fmt.Sprintf("0.0.0.0:%d", labMetricsPort)
	if !s.has4() {
		metrics = fmt.Sprintf("[::]:%d", labMetricsPort)
	}
	args = append(args, "--metrics-address", metrics)
	bin := l.vigilBin
	if n.VigilBin != "" {
		bin = n.VigilBin
	}
	// The worker agents' feed, as vigil manifest serves it: the agents
	// read it on the VIP, else on any node. A release from before the
	// feed (rolling-upgrade's) has no such flag, and serves none.
	if l.knowsFlag(bin, "agent-feed-listen") {
		args = append(args, "--agent-feed-listen", fmt.Sprintf(":%d", feed.DefaultPort))
	}
	return l.start(n, roleVigil, bin, args...)
}

// waitEtcdHealthy waits until every member answers and all follow one leader.
func (l *Lab) waitEtcdHealthy(ctx context.Context, d time.Duration) error {
	deadline := time.Now().Add(d)
	var last error
	for time.Now().Before(deadline) {
		st, err := l.etcdStatus(ctx)
		if err == nil {
			ok := len(st.Members) == len(l.st.Nodes) && st.Leader != ""
			for _, m := range st.Members {
				ok = ok && m.Reachable && m.Leader == st.Leader
			}
			if ok {
				return nil
			}
			err = fmt.Errorf("etcd not settled: %+v", st)
		}
		last = err
		if !clock.Sleep(ctx, 100*time.Millisecond) {
			return ctx.Err()
		}
	}
	return fmt.Errorf("lab: etcd did not become healthy in %v: %w", d, last)
}

// knowsFlag reports whether bin's "run" command has --flag, as its help
// says. Answers are kept per binary: a binary's flags do not change.
func (l *Lab) knowsFlag(bin, flag string) bool {
	l.flagsMu.Lock()
	defer l.flagsMu.Unlock()
	key := bin + " --" + flag
	if v, ok := l.flags[key]; ok {
		return v
	}
	out, _ := exec.Command(bin, "run", "--help").CombinedOutput()
	v := strings.Contains(string(out), "--"+flag+" ")
	if l.flags == nil {
		l.flags = map[string]bool{}
	}
	l.flags[key] = v
	return v
}
