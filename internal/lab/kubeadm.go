package lab

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/vigil-ha/vigil/internal/clock"
	"github.com/vigil-ha/vigil/internal/netns"
)

// The kubeadm lab (vigil-lab up --kubeadm): a real kubeadm cluster whose
// control-plane endpoint is vigil's VIP. Every node is a machine
// (machine.go) running a real containerd and a real kubelet; kubeadm runs
// etcd, the control plane and vigil itself as static pods from images built
// locally (hack/build-kube-images.sh, hack/build-image.sh). The sequence is
// the one docs/kubeadm.md gives users: vigil's static pod is written before
// kubeadm init, and joins go through the VIP.

// Fixed secrets of the lab's cluster: it is torn down after use and reached
// only inside its namespaces.
const (
	kubeadmToken   = "vlab00.0123456789abcdef"
	kubeadmCertKey = "7669676c6c61622d636572746966696361746573206b65792030303030303030"
	kubeadmPodCIDR = "10.244.0.0/16"
	// kubeadmAdmin is the administrator kubeconfig kubeadm writes on every
	// control-plane node; its server is the VIP.
	kubeadmAdmin = "/etc/kubernetes/admin.conf"
)

// RequireKubeadmEnv, when set, makes the kubeadm lab's test fail instead of
// skip when its binaries and images are missing (hack/test.sh sets it).
const RequireKubeadmEnv = "VIGIL_REQUIRE_KUBEADM_LAB"

// Roles of a machine's processes, recorded in Node.PIDs.
const (
	roleContainerd = "containerd"
	roleKubelet    = "kubelet"
)

// kubeadmInputs are the binaries and image archives the kubeadm lab needs,
// all under bin/.
type kubeadmInputs struct {
	kubeadm, kubelet string
	images           []string // OCI archives to import on every node
	pauseImage       string   // the sandbox image's name, for containerd
	version          string   // the Kubernetes version kubeadm deploys
}

func (l *Lab) kubeadmInputs() (kubeadmInputs, error) {
	bin := filepath.Dir(l.selfBin)
	in := kubeadmInputs{kubeadm: filepath.Join(bin, "kubeadm"), kubelet: filepath.Join(bin, "kubelet")}
	var missing []string
	for _, p := range []string{in.kubeadm, in.kubelet} {
		if _, err := os.Stat(p); err != nil {
			missing = append(missing, p)
		}
	}
	list, err := os.ReadFile(filepath.Join(bin, "kube-images", "images.txt"))
	if err != nil {
		missing = append(missing, filepath.Join(bin, "kube-images"))
	}
	for _, ref := range strings.Fields(string(list)) {
		name := ref[strings.LastIndexByte(ref, '/')+1:]
		name, _, _ = strings.Cut(name, ":")
		if name == "pause" {
			in.pauseImage = ref
		}
		in.images = append(in.images, filepath.Join(bin, "kube-images", name+".oci.tar"))
	}
	in.images = append(in.images, filepath.Join(bin, "vigil-image.oci.tar"))
	for _, p := range in.images {
		if _, err := os.Stat(p); err != nil {
			missing = append(missing, p)
		}
	}
	if len(missing) > 0 {
		return in, fmt.Errorf("lab: --kubeadm needs %s: run hack/build-kube-images.sh (it builds kubeadm, the kubelet and every image)", strings.Join(missing, ", "))
	}
	if in.version, err = l.kubeadmVersion(context.Background()); err != nil {
		return in, err
	}
	if in.pauseImage == "" {
		return in, errors.New("lab: bin/kube-images/images.txt names no pause image: rerun hack/build-kube-images.sh")
	}
	for _, cmd := range []string{"containerd", "ctr", "runc", "nsenter", "unshare", "conntrack"} {
		if _, err := exec.LookPath(cmd); err != nil {
			return in, fmt.Errorf("lab: --kubeadm needs %s (apt-get install containerd runc util-linux conntrack)", cmd)
		}
	}
	if _, err := os.Stat("/usr/lib/cni/bridge"); err != nil {
		return in, errors.New("lab: --kubeadm needs the CNI plugins in /usr/lib/cni (apt-get install containernetworking-plugins)")
	}
	return in, nil
}

// upKubeadm builds the kubeadm lab: the nodes as machines, kubeadm init on
// n1 with vigil's static pod already in place, kubeadm join --control-plane
// on the others and kubeadm join on the workers, all through the VIP, and
// waits until every Node is Ready and the VIP has one holder.
func (l *Lab) upKubeadm(ctx context.Context, s Settings, in kubeadmInputs) error {
	if err := l.recordHostSysctls(); err != nil {
		return err
	}
	began := time.Now()
	for i := 1; i <= s.Nodes; i++ {
		n := &Node{Name: "n" + itoa(i), Index: i, IP: nodeIP(i), PIDs: map[string]int{}}
		if err := l.addMachine(ctx, n, in); err != nil {
			return err
		}
		l.editNodes(appendNode(n))
	}
	for i := 1; i <= s.Workers; i++ {
		w := &Node{Name: "w" + itoa(i), Index: i, IP: workerIP(i), PIDs: map[string]int{}}
		if err := l.addMachine(ctx, w, in); err != nil {
			return err
		}
		l.st.Workers = append(l.st.Workers, w)
	}
	if err := l.save(); err != nil {
		return err
	}
	l.progress("machines ready (containerd, images imported, kubelets waiting): %v", time.Since(began).Round(time.Second))
	start := time.Now()
	first := l.st.Nodes[0]
	if err := l.kubeadmInit(ctx, first, in.version); err != nil {
		return err
	}
	l.progress("kubeadm init on %s: %v", first.Name, time.Since(start).Round(time.Second))
	if err := l.waitClusterInfoSigned(ctx, time.Minute); err != nil {
		return err
	}
	for _, n := range l.st.Nodes[1:] {
		t := time.Now()
		if err := l.kubeadmJoin(ctx, n, true); err != nil {
			return err
		}
		l.progress("kubeadm join --control-plane on %s: %v", n.Name, time.Since(t).Round(time.Second))
	}
	for _, w := range l.st.Workers {
		t := time.Now()
		if err := l.kubeadmJoin(ctx, w, false); err != nil {
			return err
		}
		l.progress("kubeadm join on worker %s: %v", w.Name, time.Since(t).Round(time.Second))
	}
	if err := l.waitNodesReady(ctx, 5*time.Minute); err != nil {
		return err
	}
	if len(l.st.Workers) > 0 {
		t := time.Now()
		if err := l.installAgent(ctx); err != nil {
			return err
		}
		l.progress("vigil-agent DaemonSet serving on every worker: %v", time.Since(t).Round(time.Second))
	}
	if _, err := l.waitStable(ctx, time.Minute); err != nil {
		return err
	}
	l.progress("kubeadm lab up in %v (%v since the first machine): control-plane nodes %d, workers %d, all Nodes Ready, one VIP holder", time.Since(start).Round(time.Second), time.Since(began).Round(time.Second), len(l.st.Nodes), len(l.st.Workers))
	return nil
}

// addMachine makes node n a machine with containerd running, every image
// imported, and the kubelet's supervisor waiting for kubeadm.
func (l *Lab) addMachine(ctx context.Context, n *Node, in kubeadmInputs) error {
	if err := os.MkdirAll(l.nodeDir(n), 0o755); err != nil {
		return fmt.Errorf("lab: %w", err)
	}
	if err := createHost(ctx, n.Name, n.IP, netip.Addr{}, l.st.Settings.reservedPorts()); err != nil {
		return err
	}
	if err := l.createMachine(ctx, n); err != nil {
		return err
	}
	if err := l.writeMachineConfig(n, in); err != nil {
		return err
	}
	if err := l.startContainerd(ctx, n); err != nil {
		return err
	}
	for _, img := range in.images {
		if _, err := l.machineRun(ctx, n, "ctr", "-n", "k8s.io", "images", "import", img); err != nil {
			return fmt.Errorf("lab: import %s: %w", filepath.Base(img), err)
		}
	}
	if err := l.startMachine(n, roleKubelet, "sh", filepath.Join(l.machineDir(n), "kubelet.sh")); err != nil {
		return err
	}
	// The lab's UDP responder, as on every lab node: the probes learn from
	// it which node answers on the VIP.
	return l.start(n, roleResponder, l.selfBin, "responder", "--name", n.Name, "--port", itoa(ResponderPort))
}

// writeMachineConfig writes containerd's configuration, the CNI network
// (a bridge with this node's own pod subnet; no overlay) and the kubelet's
// supervisor script.
func (l *Lab) writeMachineConfig(n *Node, in kubeadmInputs) error {
	md := l.machineDir(n)
	containerd := fmt.Sprintf(`version = 2
root = "/var/lib/containerd"
state = "/run/containerd"

[grpc]
  address = %q

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  # Writing oom_score_adj is not permitted here; runc fails without this.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "/etc/cni/net.d"
`, containerdSock, in.pauseImage)
	// Pod subnets: 10.244.<index>.0/24 for control-plane nodes,
	// 10.244.<100+index>.0/24 for workers.
	third := n.Index
	if strings.HasPrefix(n.Name, "w") {
		third += 100
	}
	cni := fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "vlab",
  "plugins": [{
    "type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false,
    "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.%d.0/24"}]], "routes": [{"dst": "0.0.0.0/0"}]}
  }]
}
`, third)
	// The kubelet as kubeadm's systemd drop-in (10-kubeadm.conf) runs it,
	// with systemd's Restart=always: kubeadm writes the configuration and
	// the flags, and this loop starts the kubelet once they exist and
	// restarts it whenever it exits.
	kubelet := fmt.Sprintf(`#!/bin/sh
while :; do
	if [ -f /var/lib/kubelet/config.yaml ]; then
		KUBELET_KUBEADM_ARGS=
		[ -f /var/lib/kubelet/kubeadm-flags.env ] && . /var/lib/kubelet/kubeadm-flags.env
		echo "--- kubelet start $(date -Ins)"
		%s --bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf \
			--kubeconfig=/etc/kubernetes/kubelet.conf \
			--config=/var/lib/kubelet/config.yaml \
			--cgroup-root=%s $KUBELET_KUBEADM_ARGS
		echo "--- kubelet exited with status $? $(date -Ins)"
	fi
	sleep 1
done
`, in.kubelet, cgroupRoot(n))
	for name, body := range map[string]string{
		"etc-containerd/config.toml":     containerd,
		"etc-cni-net.d/10-vlab.conflist": cni,
		"kubelet.sh":                     kubelet,
	} {
		if err := os.WriteFile(filepath.Join(md, name), []byte(body), 0o644); err != nil {
			return fmt.Errorf("lab: %w", err)
		}
	}
	return nil
}

// startMachine runs argv inside machine n, as start does for a node.
func (l *Lab) startMachine(n *Node, role string, argv ...string) error {
	return l.startArgv(n, role, l.machineArgv(n, argv...))
}

// startContainerd starts n's containerd and waits until it answers.
func (l *Lab) startContainerd(ctx context.Context, n *Node) error {
	if err := l.startMachine(n, roleContainerd, "containerd", "--config", "/etc/containerd/config.toml"); err != nil {
		return err
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := l.machineRun(ctx, n, "ctr", "version")
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("lab: containerd on %s did not answer in 30s: %w", n.Name, err)
		}
		if !clock.Sleep(ctx, 200*time.Millisecond) {
			return ctx.Err()
		}
	}
}

// kubeadmPreflightIgnored are kubeadm's preflight errors that this machine
// cannot avoid: cgroup v1 (SystemVerification), and no systemd to manage the
// kubelet service.
var kubeadmPreflightIgnored = []string{"SystemVerification", "Service-Kubelet"}

// kubeadmNodeConfig is the part of kubeadm's configuration that is the
// node's own: registration and, for control-plane nodes, the API endpoint.
func (l *Lab) kubeadmNodeRegistration(n *Node) string {
	var b strings.Builder
	fmt.Fprintf(&b, "nodeRegistration:\n  name: %s\n  criSocket: unix://%s\n  ignorePreflightErrors:\n", n.Name, containerdSock)
	for _, e := range kubeadmPreflightIgnored {
		fmt.Fprintf(&b, "  - %s\n", e)
	}
	return b.String()
}

// writePatches writes kubeadm patches for control-plane node n: its
// kube-apiserver binds to the node's address only, so that vigil's load
// balancer can listen on VIP:6443 on the same node. With --lb-listen-port
// there is none: kube-apiserver keeps kubeadm's default flags.
func (l *Lab) writePatches(n *Node) (string, error) {
	dir := filepath.Join(l.machineDir(n), "patches")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	if l.st.Settings.LBListenPort != 0 {
		return dir, nil
	}
	patch := fmt.Sprintf("- op: add\n  path: /spec/containers/0/command/-\n  value: --bind-address=%s\n", n.IP)
	return dir, os.WriteFile(filepath.Join(dir, "kube-apiserver+json.yaml"), []byte(patch), 0o644)
}

// writeVigilManifest writes vigil's static pod with vigil manifest pod, as
// docs/kubeadm.md tells users: before kubeadm init or join, and later with
// extra flags (--election kubernetes). It replaces the file by a rename, so
// kubelet never reads half of it.
func (l *Lab) writeVigilManifest(ctx context.Context, n *Node, extra ...string) error {
	args := []string{"manifest", "pod", "--vip", VIP.String(), "--interface", nodeIface, "--lb-port", itoa(APIServerPort)}
	if l.st.Settings.PruneAfter > 0 {
		args = append(args, "--prune-after", l.st.Settings.PruneAfter.String())
	}
	if p := l.st.Settings.LBListenPort; p != 0 {
		args = append(args, "--lb-listen-port", itoa(p))
	}
	args = append(args, extra...)
	out, err := exec.CommandContext(ctx, l.vigilBin, args...).Output()
	if err != nil {
		return fmt.Errorf("lab: vigil %s: %w", strings.Join(args, " "), err)
	}
	dir := filepath.Join(l.machineDir(n), "etc-kubernetes", "manifests")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	// kubelet ignores dot files in the manifests directory.
	tmp := filepath.Join(dir, ".vigil.yaml.tmp")
	if err := os.WriteFile(tmp, out, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, "vigil.yaml"))
}

// kubeadmInit runs kubeadm init on n.
func (l *Lab) kubeadmInit(ctx context.Context, n *Node, version string) error {
	patches, err := l.writePatches(n)
	if err != nil {
		return err
	}
	if err := l.writeVigilManifest(ctx, n); err != nil {
		return err
	}
	cfg := fmt.Sprintf(`apiVersion: kubeadm.k8s.io/v1beta4
kind: InitConfiguration
bootstrapTokens:
- token: %s
  ttl: 24h0m0s
certificateKey: %s
localAPIEndpoint:
  advertiseAddress: %s
  bindPort: %d
%sskipPhases:
- addon/kube-proxy
- addon/coredns
patches:
  directory: %s
---
apiVersion: kubeadm.k8s.io/v1beta4
kind: ClusterConfiguration
clusterName: vigil-lab
kubernetesVersion: %s
controlPlaneEndpoint: %s
networking:
  podSubnet: %s
  serviceSubnet: 10.96.0.0/12
%s---
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
%s`, kubeadmToken, kubeadmCertKey, n.IP, APIServerPort, l.kubeadmNodeRegistration(n), patches,
		version, netip.AddrPortFrom(VIP.Addr(), APIServerPort), kubeadmPodCIDR, kubeadmComponentArgs, kubeletLabConfig)
	p := filepath.Join(l.machineDir(n), "kubeadm.yaml")
	if err := os.WriteFile(p, []byte(cfg), 0o644); err != nil {
		return err
	}
	return l.runKubeadm(ctx, n, "init", "--config", p, "--upload-certs")
}

// waitClusterInfoSigned waits until the controller manager's bootstrap
// signer has signed kube-public/cluster-info for the lab's token. kubeadm
// join's discovery needs that signature and, without it, retries only
// every 5 s: the first join right after init lost up to 10 s to it.
func (l *Lab) waitClusterInfoSigned(ctx context.Context, d time.Duration) error {
	key := "jws-kubeconfig-" + strings.SplitN(kubeadmToken, ".", 2)[0]
	deadline := time.Now().Add(d)
	var last error
	for {
		c, err := l.kubeClient()
		if err == nil {
			rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			var cm *corev1.ConfigMap
			cm, err = c.CoreV1().ConfigMaps(metav1.NamespacePublic).Get(rctx, "cluster-info", metav1.GetOptions{})
			cancel()
			if err == nil && cm.Data[key] != "" {
				return nil
			}
			if err == nil {
				err = fmt.Errorf("no %s in it yet", key)
			}
		}
		last = err
		if time.Now().After(deadline) {
			return fmt.Errorf("lab: kube-public/cluster-info not signed for the join token within %v: %w", d, last)
		}
		if !clock.Sleep(ctx, 200*time.Millisecond) {
			return ctx.Err()
		}
	}
}

// kubeadmJoin runs kubeadm join on n through the VIP, as a control-plane
// node or a worker.
func (l *Lab) kubeadmJoin(ctx context.Context, n *Node, controlPlane bool) error {
	_, err := l.kubeadmJoinOutput(ctx, n, controlPlane)
	return err
}

// kubeadmJoinOutput is kubeadmJoin, returning kubeadm's output (its last
// 256 KiB).
func (l *Lab) kubeadmJoinOutput(ctx context.Context, n *Node, controlPlane bool) (string, error) {
	cp := ""
	if controlPlane {
		patches, err := l.writePatches(n)
		if err != nil {
			return "", err
		}
		if err := l.writeVigilManifest(ctx, n); err != nil {
			return "", err
		}
		cp = fmt.Sprintf("controlPlane:\n  certificateKey: %s\n  localAPIEndpoint:\n    advertiseAddress: %s\n    bindPort: %d\npatches:\n  directory: %s\n",
			kubeadmCertKey, n.IP, APIServerPort, patches)
	}
	cfg := fmt.Sprintf(`apiVersion: kubeadm.k8s.io/v1beta4
kind: JoinConfiguration
discovery:
  bootstrapToken:
    apiServerEndpoint: %s
    token: %s
    unsafeSkipCAVerification: true
%s%s`, netip.AddrPortFrom(VIP.Addr(), APIServerPort), kubeadmToken, l.kubeadmNodeRegistration(n), cp)
	p := filepath.Join(l.machineDir(n), "kubeadm-join.yaml")
	if err := os.WriteFile(p, []byte(cfg), 0o644); err != nil {
		return "", err
	}
	return l.runKubeadmOutput(ctx, n, "join", "--config", p)
}

// runKubeadm runs kubeadm on n with its output appended to n's kubeadm.log.
func (l *Lab) runKubeadm(ctx context.Context, n *Node, args ...string) error {
	_, err := l.runKubeadmOutput(ctx, n, args...)
	return err
}

// runKubeadmOutput is runKubeadm, returning the output's last 256 KiB.
func (l *Lab) runKubeadmOutput(ctx context.Context, n *Node, args ...string) (string, error) {
	logPath := filepath.Join(l.nodeDir(n), "kubeadm.log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return "", err
	}
	defer f.Close()
	fmt.Fprintf(f, "--- %s kubeadm %s\n", time.Now().Format(time.RFC3339Nano), strings.Join(args, " "))
	a := l.machineArgv(n, append([]string{filepath.Join(filepath.Dir(l.selfBin), "kubeadm")}, append(args, "--v=1")...)...)
	cmd := exec.CommandContext(ctx, a[0], a[1:]...)
	var tail tailBuffer
	cmd.Stdout, cmd.Stderr = &tail, &tail
	tail.w = f
	if err := cmd.Run(); err != nil {
		return tail.String(), fmt.Errorf("lab: kubeadm %s on %s: %w (log: %s)\n%s", args[0], n.Name, err, logPath, lastLines(tail.String(), 20))
	}
	return tail.String(), nil
}

// tailBuffer copies to w and keeps the last 256 KiB.
type tailBuffer struct {
	w   *os.File
	buf []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.buf = append(t.buf, p...)
	if len(t.buf) > 256<<10 {
		t.buf = t.buf[len(t.buf)-256<<10:]
	}
	return t.w.Write(p)
}

func (t *tailBuffer) String() string { return string(t.buf) }

// kubeadmComponentArgs gives the controller manager and the scheduler
// generous leader election timeouts: two cores run three of each beside
// three etcds and three API servers. etcd keeps kubeadm's defaults, which
// bound how long a VIP holder that was also the raft leader takes to be
// replaced.
const kubeadmComponentArgs = `controllerManager:
  extraArgs:
  - name: leader-elect-lease-duration
    value: 30s
  - name: leader-elect-renew-deadline
    value: 20s
scheduler:
  extraArgs:
  - name: leader-elect-lease-duration
    value: 30s
  - name: leader-elect-renew-deadline
    value: 20s
`

// kubeletLabConfig keeps the kubelet from evicting pods for the host's
// disk use, which is not the lab's.
const kubeletLabConfig = `evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%
  imagefs.available: 1%
  nodefs.inodesFree: 1%
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
`

// kubeClient is a client of the kubeadm lab's cluster as its administrator
// (admin.conf of the first live control-plane node), reaching the VIP from
// the client namespace.
func (l *Lab) kubeClient() (*kubernetes.Clientset, error) {
	var path string
	for _, n := range l.st.Nodes {
		p := filepath.Join(l.machineDir(n), "etc-kubernetes", filepath.Base(kubeadmAdmin))
		if _, err := os.Stat(p); err == nil {
			path = p
			break
		}
	}
	if path == "" {
		return nil, errors.New("lab: no control-plane node has admin.conf yet")
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil, fmt.Errorf("lab: %s: %w", path, err)
	}
	dial := netns.Dialer(clientNS)
	cfg.Dial = func(ctx context.Context, _, addr string) (net.Conn, error) { return dial(ctx, addr) }
	cfg.Timeout = 10 * time.Second
	return kubernetes.NewForConfig(cfg)
}

// waitNodesReady waits until every node of the lab is a Ready Node.
func (l *Lab) waitNodesReady(ctx context.Context, d time.Duration) error {
	c, err := l.kubeClient()
	if err != nil {
		return err
	}
	want := map[string]bool{}
	for _, n := range append(slices.Clone(l.st.Nodes), l.st.Workers...) {
		want[n.Name] = true
	}
	deadline := time.Now().Add(d)
	var last string
	for {
		nodes, err := c.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err == nil {
			ready := 0
			var notReady []string
			for _, n := range nodes.Items {
				if !want[n.Name] {
					continue
				}
				if nodeReady(&n) {
					ready++
				} else {
					notReady = append(notReady, n.Name)
				}
			}
			if ready == len(want) {
				return nil
			}
			last = fmt.Sprintf("%d of %d Nodes Ready (not ready: %v)", ready, len(want), notReady)
		} else {
			last = err.Error()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("lab: Nodes not Ready after %v: %s", d, last)
		}
		if !clock.Sleep(ctx, time.Second) {
			return ctx.Err()
		}
	}
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// kubeadmVersion is the Kubernetes version kubeadm (bin/kubeadm) deploys.
func (l *Lab) kubeadmVersion(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, filepath.Join(filepath.Dir(l.selfBin), "kubeadm"), "version", "-o", "short").Output()
	if err != nil {
		return "", fmt.Errorf("lab: kubeadm version: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

// installAgent applies `vigil manifest rbac` and `vigil manifest daemonset`
// to the cluster, as a user would with kubectl apply, and waits until the
// agent on every worker serves the API through its local endpoint.
func (l *Lab) installAgent(ctx context.Context) error {
	c, err := l.kubeClient()
	if err != nil {
		return err
	}
	for _, args := range [][]string{
		{"manifest", "rbac"},
		{"manifest", "daemonset", "--server", "https://" + netip.AddrPortFrom(VIP.Addr(), APIServerPort).String()},
	} {
		out, err := exec.CommandContext(ctx, l.vigilBin, args...).Output()
		if err != nil {
			return fmt.Errorf("lab: vigil %s: %w", strings.Join(args, " "), err)
		}
		if err := applyYAML(ctx, c, out); err != nil {
			return fmt.Errorf("lab: apply vigil %s: %w", strings.Join(args, " "), err)
		}
	}
	for _, w := range l.st.Workers {
		if err := l.waitAgentServes(ctx, w, 3*time.Minute); err != nil {
			return err
		}
	}
	return nil
}

// applyYAML creates the objects of a multi-document YAML stream, the kinds
// vigil's manifests hold; objects that exist are left as they are.
func applyYAML(ctx context.Context, c *kubernetes.Clientset, y []byte) error {
	dec := scheme.Codecs.UniversalDeserializer()
	for _, doc := range strings.Split(string(y), "\n---\n") {
		if strings.TrimSpace(doc) == "" || strings.TrimSpace(strings.TrimPrefix(doc, "---")) == "" {
			continue
		}
		obj, _, err := dec.Decode([]byte(doc), nil, nil)
		if err != nil {
			return err
		}
		opts := metav1.CreateOptions{FieldManager: "vigil-lab"}
		switch o := obj.(type) {
		case *corev1.ServiceAccount:
			_, err = c.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, o, opts)
		case *rbacv1.Role:
			_, err = c.RbacV1().Roles(o.Namespace).Create(ctx, o, opts)
		case *rbacv1.RoleBinding:
			_, err = c.RbacV1().RoleBindings(o.Namespace).Create(ctx, o, opts)
		case *rbacv1.ClusterRole:
			_, err = c.RbacV1().ClusterRoles().Create(ctx, o, opts)
		case *rbacv1.ClusterRoleBinding:
			_, err = c.RbacV1().ClusterRoleBindings().Create(ctx, o, opts)
		case *appsv1.DaemonSet:
			_, err = c.AppsV1().DaemonSets(o.Namespace).Create(ctx, o, opts)
		case *admissionregistrationv1.ValidatingAdmissionPolicy:
			_, err = c.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, o, opts)
		case *admissionregistrationv1.ValidatingAdmissionPolicyBinding:
			_, err = c.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, o, opts)
		default:
			return fmt.Errorf("unexpected %T in vigil's manifests", obj)
		}
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
	}
	return nil
}

// waitAgentServes waits until GET /version through the agent's local
// endpoint on worker w (127.0.0.1:6443 in its namespace) answers, verified
// against the cluster CA.
func (l *Lab) waitAgentServes(ctx context.Context, w *Node, d time.Duration) error {
	pool, err := l.kubeadmCA()
	if err != nil {
		return err
	}
	dial := netns.Dialer(nodeNS(w.Name))
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		// The API servers' certificates name "kubernetes", not 127.0.0.1.
		TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "kubernetes", MinVersion: tls.VersionTLS12},
		DialContext:     func(ctx context.Context, _, addr string) (net.Conn, error) { return dial(ctx, addr) },
	}}
	deadline := time.Now().Add(d)
	var last error
	for time.Now().Before(deadline) {
		resp, err := client.Get("https://127.0.0.1:6443/version")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("HTTP %d", resp.StatusCode)
		}
		last = err
		if !clock.Sleep(ctx, time.Second) {
			return ctx.Err()
		}
	}
	return fmt.Errorf("lab: vigil-agent on %s does not serve the API after %v: %w", w.Name, d, last)
}
