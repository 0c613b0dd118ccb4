// Package manifest generates the Kubernetes objects that install vigil: the
// kubeadm static pod that runs `vigil run` on control-plane nodes, the
// DaemonSet that runs vigil-agent on workers, and the RBAC both need.
//
// The objects are built as typed API structs and printed as YAML, so what is
// printed is what the API server validates (tests send each one to a real
// kube-apiserver with a server-side dry run). Privileges are minimal: host
// network, NET_ADMIN and NET_RAW for the VIP daemon (add an address, send
// gratuitous ARP), nothing for the agent; never privileged.
package manifest

import (
	"bytes"
	"cmp"
	"fmt"
	"math"
	"net/netip"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"github.com/vigil-ha/vigil"
	"github.com/vigil-ha/vigil/internal/bfd"
	"github.com/vigil-ha/vigil/internal/bgp"
	"github.com/vigil-ha/vigil/internal/feed"
	"github.com/vigil-ha/vigil/internal/validate"
)

// Names and defaults shared by the manifests.
const (
	Namespace          = "kube-system"
	DaemonName         = "vigil"
	AgentName          = "vigil-agent"
	PKIDir             = "/etc/kubernetes/pki"
	DefaultEtcdURL     = "https://127.0.0.1:2379"
	DefaultAgentCache  = "/var/lib/vigil-agent"
	controlPlaneLabel  = "node-role.kubernetes.io/control-plane"
	appLabel           = "app.kubernetes.io/name"
	componentLabel     = "app.kubernetes.io/component"
	metricsPortDaemon  = 9558
	metricsPortAgent   = 9559
	leaseResourceGroup = "coordination.k8s.io"
)

// PodOptions configures the static pod.
type PodOptions struct {
	// MetricsAddress is vigil run's --metrics-address ("": its default,
	// 127.0.0.1:9558). Give 0.0.0.0:9558 for Prometheus to scrape it.
	MetricsAddress string
	VIPs           []string // address, or address/prefix; one, or one per family (dual-stack)
	Interface      string
	Image          string
	// LBPort runs vigil's load balancer on VIP:LBPort (0: none).
	LBPort int
	// BackendPort is vigil run --backend-port (0: its default, 6443).
	BackendPort int
	// MorePorts are further vigil run --lb-port values (PORT or
	// PORT:BACKENDPORT), and PortChecks its --lb-port-check values.
	MorePorts  []string
	PortChecks []string
	// LBListenPort is vigil run --lb-listen-port (0: none): the balancer
	// listens there and the holder sends VIP:LBPort to it, so kubeadm's
	// API servers keep their default bind address.
	LBListenPort int
	// EtcdEndpoints are the etcd client URLs; the local member by default.
	EtcdEndpoints []string
	// Kubeconfig, when set, is a host file given to vigil run as
	// --kubeconfig (Events, EndpointSlice discovery). It must exist before
	// the pod starts: add it after kubeadm init (docs/kubeadm.md).
	Kubeconfig string
	// PruneAfter, when not 0, is vigil run's --prune-after: the VIP holder
	// removes etcd members that a majority of the vigils have seen
	// unreachable for this long (docs/kubeadm.md, "A control-plane node
	// died").
	PruneAfter time.Duration
	// Election is vigil run's --election: "etcd" (the default, and the only
	// one that works before kubeadm init is done) or "kubernetes", the
	// Lease election, which needs Kubeconfig pointing at this node's own
	// API server. The etcd flags stay: the etcd election is retired
	// through them (docs/kubeadm.md, "Moving to the Lease election").
	Election string
	// Announce is vigil run's --announce ("" or "arp", or "bgp" with
	// BGPLocalAS and BGPPeers, each ADDRESS,AS[,password-file=…][,port=…]; the
	// router ID is left to vigil run's default, the node's address towards
	// the first peer, so one manifest fits every node).
	Announce   string
	BGPLocalAS int
	BGPPeers   []string
	// BGPPasswordFile is vigil run's --bgp-password-file: a path on every
	// node, mounted read-only (as is each peer's password-file).
	BGPPasswordFile string
	// BGP's timers, route policy and BFD, as vigil run's --bgp-* flags of
	// the same names (zero values: vigil run's defaults). The source
	// address is left out: it differs per node.
	BGPHoldTime, BGPKeepalive time.Duration
	BGPMultihop               int
	BGPCommunities            []string
	BGPLocalPref              int64
	BGPGracefulRestart        bool
	BGPBFD                    bool
	BGPBFDInterval            time.Duration
	BGPBFDMultiplier          int
	// BGPMode is vigil run --bgp-mode ("": single).
	BGPMode string
}

// bgpPasswordFiles are the files the BGP passwords come from, each once:
// --bgp-password-file and the peers' password-file.
func (o PodOptions) bgpPasswordFiles() []string {
	var files []string
	if o.BGPPasswordFile != "" {
		files = append(files, o.BGPPasswordFile)
	}
	for _, s := range o.BGPPeers {
		if p, err := bgp.ParsePeer(s); err == nil && p.PasswordFile != "" && !slices.Contains(files, p.PasswordFile) {
			files = append(files, p.PasswordFile)
		}
	}
	return files
}

// bgpTuned tells whether any of the BGP timer, policy or BFD options is
// set.
func (o PodOptions) bgpTuned() bool {
	return o.BGPHoldTime != 0 || o.BGPKeepalive != 0 || o.BGPMultihop != 0 || len(o.BGPCommunities) > 0 || o.BGPLocalPref != 0 ||
		o.BGPGracefulRestart || o.BGPBFD || o.BGPBFDInterval != 0 || o.BGPBFDMultiplier != 0 || o.BGPMode != ""
}

// Election backends the pod can run.
const (
	ElectionEtcd       = "etcd"
	ElectionKubernetes = "kubernetes"
)

// minPruneAfter is vigil run's own lower bound on --prune-after.
const minPruneAfter = 10 * time.Second

// announceArgs checks the announcement options as vigil run will, so a
// manifest never crash-loops on them, and returns vigil run's flags.
func announceArgs(o PodOptions, vips []string) ([]string, error) {
	switch o.Announce {
	case "", "arp":
		if o.BGPLocalAS != 0 || len(o.BGPPeers) > 0 || o.BGPPasswordFile != "" || o.bgpTuned() {
			return nil, fmt.Errorf("%w: `bgpLocalAs`, `bgpPeer` and the other BGP settings need `announce` bgp", validate.ErrInvalid)
		}
		return nil, nil
	case "bgp":
	default:
		return nil, fmt.Errorf("%w: `announce` %q: use arp or bgp", validate.ErrInvalid, o.Announce)
	}
	for _, vip := range vips {
		host := false // a bare address is a host address to vigil run
		if p, err := netip.ParsePrefix(vip); err == nil {
			host = p.Bits() == p.Addr().BitLen()
		} else if _, err := netip.ParseAddr(vip); err == nil {
			host = true
		}
		if !host {
			return nil, fmt.Errorf("%w: `vip` %s: with `announce` bgp give the VIP as a host address (/32 or /128), and `interface` lo", validate.ErrInvalid, vip)
		}
	}
	if o.BGPLocalAS < 1 || o.BGPLocalAS > 4294967294 {
		return nil, fmt.Errorf("%w: `bgpLocalAs` %d: give the nodes' AS number, 1 to 4294967294", validate.ErrInvalid, o.BGPLocalAS)
	}
	if len(o.BGPPeers) == 0 {
		return nil, fmt.Errorf("%w: `announce` bgp needs at least one `bgpPeer` ADDRESS,AS", validate.ErrInvalid)
	}
	args := []string{"--announce", "bgp", "--bgp-local-as", strconv.Itoa(o.BGPLocalAS)}
	// The speaker's own checks, on what every node will share; the
	// router ID is each node's own, a stand-in here.
	cfg := bgp.Config{LocalAS: uint32(o.BGPLocalAS), RouterID: netip.MustParseAddr("192.0.2.1"),
		HoldTime: o.BGPHoldTime, Keepalive: o.BGPKeepalive, GracefulRestart: o.BGPGracefulRestart}
	for _, s := range o.BGPPeers {
		p, err := bgp.ParsePeer(s)
		if err != nil {
			return nil, validate.Invalid(err)
		}
		cfg.Peers = append(cfg.Peers, p)
		args = append(args, "--bgp-peer", s)
	}
	if o.BGPPasswordFile != "" {
		if !path.IsAbs(o.BGPPasswordFile) {
			return nil, fmt.Errorf("%w: `bgpPasswordFile` %q must be an absolute path on the host", validate.ErrInvalid, o.BGPPasswordFile)
		}
		args = append(args, "--bgp-password-file", o.BGPPasswordFile)
	}
	if o.BGPMultihop < 0 || o.BGPMultihop > 255 || o.BGPLocalPref < 0 || o.BGPLocalPref > math.MaxUint32 || o.BGPBFDMultiplier < 0 || o.BGPBFDMultiplier > 255 {
		return nil, fmt.Errorf("%w: `bgpMultihop` (0-255), `bgpLocalPref` (0-4294967295) or `bgpBfdMultiplier` (1-255) out of range", validate.ErrInvalid)
	}
	cfg.Multihop, cfg.LocalPref = uint8(o.BGPMultihop), uint32(o.BGPLocalPref)
	for _, c := range o.BGPCommunities {
		x, err := bgp.ParseCommunity(c)
		if err != nil {
			return nil, validate.Invalid(err)
		}
		cfg.Communities = append(cfg.Communities, x)
		args = append(args, "--bgp-community", c)
	}
	switch {
	case o.BGPBFD:
		cfg.BFDInterval, cfg.BFDMultiplier = cmp.Or(o.BGPBFDInterval, bfd.DefaultInterval), uint8(cmp.Or(o.BGPBFDMultiplier, bfd.DefaultMultiplier))
		args = append(args, "--bgp-bfd", "--bgp-bfd-interval", cfg.BFDInterval.String(), "--bgp-bfd-multiplier", strconv.Itoa(int(cfg.BFDMultiplier)))
	case o.BGPBFDInterval != 0 || o.BGPBFDMultiplier != 0:
		return nil, fmt.Errorf("%w: `bgpBfdInterval` and `bgpBfdMultiplier` need `bgpBfd`", validate.ErrInvalid)
	}
	if err := cfg.Validate(); err != nil {
		return nil, validate.Invalid(err)
	}
	if o.BGPHoldTime != 0 {
		args = append(args, "--bgp-hold-time", o.BGPHoldTime.String())
	}
	if o.BGPKeepalive != 0 {
		args = append(args, "--bgp-keepalive", o.BGPKeepalive.String())
	}
	if o.BGPMultihop != 0 {
		args = append(args, "--bgp-multihop", strconv.Itoa(o.BGPMultihop))
	}
	if o.BGPLocalPref != 0 {
		args = append(args, "--bgp-local-pref", strconv.FormatInt(o.BGPLocalPref, 10))
	}
	if o.BGPGracefulRestart {
		args = append(args, "--bgp-graceful-restart")
	}
	switch o.BGPMode {
	case "", "single":
	case "ecmp":
		if o.LBListenPort != 0 {
			return nil, fmt.Errorf("%w: `lbListenPort` needs one VIP holder; `bgpMode` ecmp has none", validate.ErrInvalid)
		}
		args = append(args, "--bgp-mode", "ecmp")
	default:
		return nil, fmt.Errorf("%w: `bgpMode` %q: use single or ecmp", validate.ErrInvalid, o.BGPMode)
	}
	return args, nil
}

// Pod is the kubeadm static pod for /etc/kubernetes/manifests/vigil.yaml.
// It elects over the local etcd with kubeadm's apiserver-etcd-client
// certificate, so the VIP is up before the API server exists and `kubeadm
// init` with controlPlaneEndpoint: VIP works from its first second.
func Pod(o PodOptions) (*corev1.Pod, error) {
	if o.Interface == "" {
		return nil, fmt.Errorf("%w: `interface` is required (the interface that carries the VIP, e.g. eth0)", validate.ErrInvalid)
	}
	vips, err := parseVIPs(o.VIPs)
	if err != nil {
		return nil, err
	}
	if o.LBPort < 0 || o.LBPort > 65535 {
		return nil, fmt.Errorf("%w: `lbPort` %d is out of range", validate.ErrInvalid, o.LBPort)
	}
	if err := checkPorts(o); err != nil {
		return nil, err
	}
	switch {
	case o.LBListenPort < 0 || o.LBListenPort > 65535:
		return nil, fmt.Errorf("%w: `lbListenPort` %d is out of range", validate.ErrInvalid, o.LBListenPort)
	case o.LBListenPort != 0 && (o.LBPort == 0 || o.LBListenPort == o.LBPort):
		return nil, fmt.Errorf("%w: `lbListenPort` needs `lbPort`, and another port than it", validate.ErrInvalid)
	}
	if o.PruneAfter != 0 && o.PruneAfter < minPruneAfter {
		return nil, fmt.Errorf("%w: `pruneAfter` %v: use 0 (off) or at least %v", validate.ErrInvalid, o.PruneAfter, minPruneAfter)
	}
	switch o.Election {
	case "":
		o.Election = ElectionEtcd
	case ElectionEtcd:
	case ElectionKubernetes:
		if o.Kubeconfig == "" {
			return nil, fmt.Errorf("%w: `election` kubernetes needs `kubeconfig`, a kubeconfig for this node's own API server (not the VIP)", validate.ErrInvalid)
		}
	default:
		return nil, fmt.Errorf("%w: `election` %q: use etcd or kubernetes", validate.ErrInvalid, o.Election)
	}
	bgpArgs, err := announceArgs(o, vips)
	if err != nil {
		return nil, err
	}
	if len(o.EtcdEndpoints) == 0 {
		o.EtcdEndpoints = []string{DefaultEtcdURL}
	}
	if err := validate.EtcdEndpoints(o.EtcdEndpoints); err != nil {
		return nil, fmt.Errorf("%w: `etcdEndpoints`: %w", validate.ErrInvalid, err)
	}
	args := append([]string{"run"}, vipArgs(vips)...)
	args = append(args,
		"--interface", o.Interface,
		"--election", o.Election,
		"--etcd-endpoints", join(o.EtcdEndpoints),
		"--etcd-cacert", PKIDir+"/etcd/ca.crt",
		"--etcd-cert", PKIDir+"/apiserver-etcd-client.crt",
		"--etcd-key", PKIDir+"/apiserver-etcd-client.key",
	)
	if o.LBPort > 0 {
		args = append(args, "--lb-port", strconv.Itoa(o.LBPort))
	}
	if o.BackendPort > 0 {
		args = append(args, "--backend-port", strconv.Itoa(o.BackendPort))
	}
	for _, p := range o.MorePorts {
		args = append(args, "--lb-port", p)
	}
	for _, c := range o.PortChecks {
		args = append(args, "--lb-port-check", c)
	}
	if o.LBListenPort > 0 {
		args = append(args, "--lb-listen-port", strconv.Itoa(o.LBListenPort))
	}
	if o.PruneAfter > 0 {
		args = append(args, "--prune-after", o.PruneAfter.String())
	}
	args = append(args, bgpArgs...)
	// The guard runs in a container of its own: vigil run is PID 1 of its
	// container, and when it dies the kernel kills every process there,
	// a child guard included. The two share only the socket's directory.
	args = append(args, "--guard-socket", guardSocket)
	// The worker agents' feed, on every address (hostNetwork): the agents
	// read it on the VIP and on each control-plane node.
	args = append(args, "--agent-feed-listen", ":"+strconv.Itoa(feed.DefaultPort))
	// Only the files vigil reads, each mounted on its own, read-only: not
	// the whole of /etc/kubernetes/pki, which holds the cluster's CA keys.
	// kubeadm rewrites certificates in place (same file), so a renewal
	// shows through a file mount.
	guardMount := corev1.VolumeMount{Name: "guard", MountPath: guardDir}
	mounts := []corev1.VolumeMount{guardMount}
	volumes := []corev1.Volume{{Name: "guard", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory, SizeLimit: ptr(resource.MustParse("1Mi"))}}}}
	for _, f := range daemonPKIFiles {
		mounts = append(mounts, corev1.VolumeMount{Name: f.volume, MountPath: PKIDir + "/" + f.path, ReadOnly: true})
		volumes = append(volumes, hostPath(f.volume, PKIDir+"/"+f.path, corev1.HostPathFile))
	}
	m, err := metricsEndpoint(o.MetricsAddress, metricsPortDaemon)
	if err != nil {
		return nil, err
	}
	args = append(args, m.args...)
	if o.Kubeconfig != "" {
		if !path.IsAbs(o.Kubeconfig) {
			return nil, fmt.Errorf("%w: `kubeconfig` %q must be an absolute path on the host", validate.ErrInvalid, o.Kubeconfig)
		}
		args = append(args, "--kubeconfig", o.Kubeconfig)
		mounts = append(mounts, corev1.VolumeMount{Name: "kubeconfig", MountPath: o.Kubeconfig, ReadOnly: true})
		volumes = append(volumes, hostPath("kubeconfig", o.Kubeconfig, corev1.HostPathFile))
	}
	for i, f := range o.bgpPasswordFiles() {
		name := fmt.Sprintf("bgp-password-%d", i)
		mounts = append(mounts, corev1.VolumeMount{Name: name, MountPath: f, ReadOnly: true})
		volumes = append(volumes, hostPath(name, f, corev1.HostPathFile))
	}
	labels := map[string]string{appLabel: DaemonName, componentLabel: "control-plane-vip"}
	return &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: DaemonName, Namespace: Namespace, Labels: labels},
		Spec: corev1.PodSpec{
			HostNetwork:       true,
			PriorityClassName: "system-node-critical",
			// A static pod cannot use a ServiceAccount; it reads the
			// certificates from the host.
			AutomountServiceAccountToken: ptr(false),
			Containers: []corev1.Container{{
				Name:  DaemonName,
				Image: image(o.Image),
				Args:  args,
				// Node name: the pod's hostname, which with host networking
				// is the node's, as kubeadm names nodes.
				SecurityContext: &corev1.SecurityContext{
					Capabilities:             &corev1.Capabilities{Add: []corev1.Capability{"NET_ADMIN", "NET_RAW"}, Drop: []corev1.Capability{"ALL"}},
					AllowPrivilegeEscalation: ptr(false),
					ReadOnlyRootFilesystem:   ptr(true),
				},
				Resources:                resources("50m", "32Mi", "128Mi"),
				Env:                      goMemLimit("100MiB"),
				Ports:                    m.ports,
				StartupProbe:             m.startup(),
				LivenessProbe:            m.probe("/livez", 10, 3),
				ReadinessProbe:           m.probe("/readyz", 5, 3),
				VolumeMounts:             mounts,
				TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
			}, {
				// vigil guard --listen: removes the VIP the moment vigil
				// run's connection ends (its container killed, OOM) or its
				// lease deadline passes (stopped). Removing an address
				// needs NET_ADMIN only.
				Name:  "guard",
				Image: image(o.Image),
				Args:  append(append([]string{"guard", "--listen", guardSocket}, vipArgs(vips)...), "--interface", o.Interface),
				SecurityContext: &corev1.SecurityContext{
					Capabilities:             &corev1.Capabilities{Add: []corev1.Capability{"NET_ADMIN"}, Drop: []corev1.Capability{"ALL"}},
					AllowPrivilegeEscalation: ptr(false),
					ReadOnlyRootFilesystem:   ptr(true),
				},
				// It uses next to no CPU, but must be scheduled at once when
				// a deadline arrives: its request is its share (weight)
				// when the node's CPUs are contended, and at 5m the kubeadm
				// lab's guard waited 362 ms to answer during a kubeadm join.
				Resources:                resources("50m", "8Mi", "32Mi"),
				Env:                      goMemLimit("24MiB"),
				VolumeMounts:             []corev1.VolumeMount{guardMount},
				TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
			}},
			Volumes: volumes,
		},
	}, nil
}

// The guard's socket, in a memory-backed emptyDir shared by the pod's two
// containers.
const (
	guardDir    = "/run/vigil"
	guardSocket = guardDir + "/guard.sock"
)

// DaemonSetOptions configures the worker agent DaemonSet.
type DaemonSetOptions struct {
	Server string // https://VIP:6443
	Image  string
	Listen string // --apiserver-listen
	// MetricsAddress is the agent's --metrics-address ("": its default,
	// 127.0.0.1:9559). Give 0.0.0.0:9559 for Prometheus to scrape it.
	MetricsAddress string
}

// DaemonSet runs vigil-agent on every node that is not a control-plane
// node. kubelet itself needs the API server to start DaemonSet pods, so a
// kubelet that uses the agent needs it as a static pod or systemd unit
// instead (docs/agent.md); this DaemonSet serves the clients that start
// later: kube-proxy, flannel, etcd clients.
func DaemonSet(o DaemonSetOptions) (*appsv1.DaemonSet, error) {
	if o.Server == "" {
		return nil, fmt.Errorf("%w: `server` is required: the API server URL, such as https://10.0.0.100:6443", validate.ErrInvalid)
	}
	if err := validate.APIServerURL(o.Server); err != nil {
		return nil, fmt.Errorf("%w: `server` %w", validate.ErrInvalid, err)
	}
	if o.Listen == "" {
		o.Listen = "127.0.0.1:6443"
	}
	if _, err := netip.ParseAddrPort(o.Listen); err != nil {
		return nil, fmt.Errorf("%w: `apiserverListen` %q must be IP:PORT", validate.ErrInvalid, o.Listen)
	}
	m, err := metricsEndpoint(o.MetricsAddress, metricsPortAgent)
	if err != nil {
		return nil, err
	}
	labels := map[string]string{appLabel: AgentName, componentLabel: "worker-endpoint"}
	return &appsv1.DaemonSet{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "DaemonSet"},
		ObjectMeta: metav1.ObjectMeta{Name: AgentName, Namespace: Namespace, Labels: labels},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			UpdateStrategy: appsv1.DaemonSetUpdateStrategy{
				Type: appsv1.RollingUpdateDaemonSetStrategyType,
				// The new pod starts before the old one stops; both bind
				// the port with SO_REUSEPORT, so it is never closed.
				RollingUpdate: &appsv1.RollingUpdateDaemonSet{MaxUnavailable: ptr(intstr.FromInt32(0)), MaxSurge: ptr(intstr.FromInt32(1))},
			},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					HostNetwork:        true,
					DNSPolicy:          corev1.DNSClusterFirstWithHostNet,
					PriorityClassName:  "system-node-critical",
					ServiceAccountName: AgentName,
					Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
						RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
							MatchExpressions: []corev1.NodeSelectorRequirement{{Key: controlPlaneLabel, Operator: corev1.NodeSelectorOpDoesNotExist}},
						}}},
					}},
					Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
					Containers: []corev1.Container{{
						Name:  AgentName,
						Image: image(o.Image),
						// The worker's own binary, beside vigil in the
						// image: no client-go, no gRPC, a third less memory.
						Command: []string{"/usr/local/bin/vigil-agent"},
						Args: append([]string{
							"--server", o.Server,
							"--apiserver-listen", o.Listen,
							"--cache-dir", DefaultAgentCache,
							"--health-ca", PKIDir + "/ca.crt",
							// The API servers from the EndpointSlices, with
							// the service-account token mounted below.
							"--in-cluster",
						}, m.args...),
						SecurityContext: &corev1.SecurityContext{
							Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
							AllowPrivilegeEscalation: ptr(false),
							ReadOnlyRootFilesystem:   ptr(true),
						},
						Resources:      resources("10m", "24Mi", "64Mi"),
						Env:            goMemLimit("50MiB"),
						Ports:          m.ports,
						StartupProbe:   m.startup(),
						LivenessProbe:  m.probe("/livez", 10, 3),
						ReadinessProbe: m.probe("/readyz", 5, 3),
						VolumeMounts: []corev1.VolumeMount{
							{Name: "ca", MountPath: PKIDir + "/ca.crt", ReadOnly: true},
							{Name: "cache", MountPath: DefaultAgentCache},
						},
						TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
					}},
					Volumes: []corev1.Volume{
						hostPath("ca", PKIDir+"/ca.crt", corev1.HostPathFile),
						hostPath("cache", DefaultAgentCache, corev1.HostPathDirectoryOrCreate),
					},
				},
			},
		},
	}, nil
}

// YAML prints objects as one YAML stream, with a header comment.
func YAML(header string, objs ...runtime.Object) ([]byte, error) {
	var b bytes.Buffer
	if header != "" {
		fmt.Fprintf(&b, "# %s\n", header)
	}
	for i, o := range objs {
		if i > 0 {
			b.WriteString("---\n")
		}
		y, err := yaml.Marshal(o)
		if err != nil {
			return nil, err
		}
		b.Write(y)
	}
	return b.Bytes(), nil
}

// parseVIPs checks --vip, given once or once per family, as vigil run
// will, and returns the addresses as given (a bare address stays bare: a
// host address to vigil run).
func parseVIPs(ss []string) ([]string, error) {
	if _, err := validate.VIPs(ss); err != nil {
		return nil, validate.Invalid(err)
	}
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = strings.TrimSpace(s)
	}
	return out, nil
}

func vipArgs(vips []string) []string {
	var args []string
	for _, v := range vips {
		args = append(args, "--vip", v)
	}
	return args
}

// DefaultImage is this version's image, pinned by tag: a static pod must
// start before any registry is reachable through the cluster, and a moving
// tag (:latest) could change under a node that restarts.
var DefaultImage = vigil.Image()

func image(s string) string {
	if s == "" {
		return DefaultImage
	}
	return s
}

func join(ss []string) string {
	out := ""
	for i, s := range ss {
		if i > 0 {
			out += ","
		}
		out += s
	}
	return out
}

// goMemLimit sets GOMEMLIMIT to about 80% of the container's memory limit:
// near it the Go runtime collects garbage harder instead of letting the
// kernel kill the process at the limit (and the VIP holder with it).
func goMemLimit(v string) []corev1.EnvVar {
	return []corev1.EnvVar{{Name: "GOMEMLIMIT", Value: v}}
}

func resources(cpu, mem, memLimit string) corev1.ResourceRequirements {
	return corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(mem)},
		Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse(memLimit)},
	}
}

// probe checks path on the metrics port every period seconds; failures in
// a row fail it.
//   - /livez fails only when the process is stuck (vigil run: its election
//     loop has not turned for 30 s or more); the kubelet then restarts it.
//   - /readyz fails while vigil run has no current view of the election
//     (etcd or the Lease unreadable), or while no agent endpoint has a
//     healthy backend. The pods use host networking and no Service selects
//     them, so readiness only reports, in kubectl get pods and in alerts.
func (m metrics) probe(path string, period, failures int32) *corev1.Probe {
	return &corev1.Probe{
		ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
			Host: m.host, Path: path, Port: intstr.FromInt32(int32(m.port)),
		}},
		PeriodSeconds: period, FailureThreshold: failures, TimeoutSeconds: 2,
	}
}

// startup holds liveness back until the metrics server answers, for up to
// a minute: a slow start is not a stuck process.
func (m metrics) startup() *corev1.Probe { return m.probe("/livez", 1, 60) }

// MetricsPortName names the container port of the metrics endpoint, which
// the PodMonitors of vigil manifest monitoring scrape.
const MetricsPortName = "metrics"

// metrics is where a container serves /metrics and its probes: what the
// probes ask, the flag that moves it, and the container port a PodMonitor
// finds it by (none on loopback, where no Prometheus reaches).
type metrics struct {
	host  string
	port  int
	args  []string
	ports []corev1.ContainerPort
}

// metricsEndpoint checks a manifest's --metrics-address: "" keeps the
// command's default (127.0.0.1:def); otherwise IP:PORT. The probes ask
// 127.0.0.1 when the address is loopback or every address, the address
// itself otherwise.
func metricsEndpoint(addr string, def int) (metrics, error) {
	if addr == "" {
		return metrics{host: "127.0.0.1", port: def}, nil
	}
	ap, err := netip.ParseAddrPort(addr)
	if err != nil || ap.Port() == 0 || ap.Addr().Zone() != "" {
		return metrics{}, fmt.Errorf("%w: `metricsAddress` %q must be IP:PORT, such as 0.0.0.0:%d for Prometheus to scrape it", validate.ErrInvalid, addr, def)
	}
	m := metrics{host: "127.0.0.1", port: int(ap.Port()), args: []string{"--metrics-address", addr}}
	a := ap.Addr().Unmap()
	if !a.IsLoopback() && !a.IsUnspecified() {
		m.host = a.String()
	}
	if !a.IsLoopback() {
		m.ports = []corev1.ContainerPort{{Name: MetricsPortName, ContainerPort: int32(ap.Port()), Protocol: corev1.ProtocolTCP}}
	}
	return m, nil
}

// daemonPKIFiles are the files of /etc/kubernetes/pki that vigil run
// reads: the etcd CA and the API server's etcd client pair for the
// election, and the cluster CA to verify the API servers' /readyz
// (--health-ca's default).
var daemonPKIFiles = []struct{ volume, path string }{
	{"etcd-ca", "etcd/ca.crt"},
	{"etcd-client-cert", "apiserver-etcd-client.crt"},
	{"etcd-client-key", "apiserver-etcd-client.key"},
	{"cluster-ca", "ca.crt"},
}

func hostPath(name, path string, t corev1.HostPathType) corev1.Volume {
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: path, Type: &t}}}
}

func typeMeta(kind string) metav1.TypeMeta {
	return metav1.TypeMeta{APIVersion: rbacv1.SchemeGroupVersion.String(), Kind: kind}
}

func meta(name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: name, Namespace: Namespace, Labels: map[string]string{appLabel: DaemonName}}
}

func ptr[T any](v T) *T { return &v }

// checkPorts refuses what vigil run would refuse of the ports: a bad
// --lb-port or --lb-port-check, a port given twice, a check of a port not
// balanced.
func checkPorts(o PodOptions) error {
	if len(o.MorePorts) > 0 && o.LBPort == 0 {
		return fmt.Errorf("%w: more than one `lbPort`, yet no first one", validate.ErrInvalid)
	}
	if o.BackendPort < 0 || o.BackendPort > 65535 {
		return fmt.Errorf("%w: `backendPort` %d is out of range", validate.ErrInvalid, o.BackendPort)
	}
	seen := map[int]bool{o.LBPort: o.LBPort != 0}
	for _, v := range o.MorePorts {
		port, _, err := validate.LBPort(v)
		if err != nil {
			return validate.Invalid(err)
		}
		if seen[port] || port == o.LBListenPort {
			return fmt.Errorf("%w: port %d given twice: each load-balanced port is served once", validate.ErrInvalid, port)
		}
		seen[port] = true
	}
	checked := map[int]bool{}
	for _, v := range o.PortChecks {
		port, _, err := validate.PortCheck(v)
		if err != nil {
			return validate.Invalid(err)
		}
		if !seen[port] || checked[port] {
			return fmt.Errorf("%w: `lbPortCheck` %q: port %d is not an `lbPort`, or is checked twice", validate.ErrInvalid, v, port)
		}
		checked[port] = true
	}
	return nil
}
