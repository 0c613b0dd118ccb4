//go:build linux

package daemon

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/vigil-ha/vigil/internal/kubetest"
	"github.com/vigil-ha/vigil/internal/netns"
	"github.com/vigil-ha/vigil/internal/nstest"
	"github.com/vigil-ha/vigil/internal/testkit"
)

// TestBootstrapBeforeAPIServer is `kubeadm init` with controlPlaneEndpoint
// set to the VIP, on one node (namespace A; B is a client elsewhere on the
// link):
//
//  1. etcd runs, no API server exists yet; vigil (etcd election, load
//     balancer on VIP:6443, a kubeconfig that points at the VIP, as
//     admin.conf does) must bring the VIP up anyway;
//  2. the real kube-apiserver starts afterwards; a client on B then reaches
//     it through the VIP and writes to it, which is what kubeadm init goes
//     on to do;
//  3. the API server publishes itself in the kubernetes Service's
//     EndpointSlice, and vigil, reading it through its own VIP, adds that
//     address to its backends next to the one the etcd member list gave;
//  4. a worker (B) runs vigil agent with only --server and a kubeconfig: it
//     learns the API server from the EndpointSlice and serves it locally.
func TestBootstrapBeforeAPIServer(t *testing.T) {
	kubetest.Binary(t) // skips (or fails under hack/test.sh) without it
	p := nstest.NewPair(t)
	const (
		nodeIP  = "192.0.2.1"
		apiPort = 16443 // kube-apiserver; the load balancer has VIP:6443
	)
	startEtcdIn(t, p.A)
	ca, cert, key := kubetest.ServingCert(t, testVIP, nodeIP, "127.0.0.1")
	vipURL := "https://" + net.JoinHostPort(testVIP, "6443")
	kc := kubetest.WriteKubeconfig(t, vipURL, ca, kubetest.AdminToken)

	vigil := nstest.Binary(t, "vigil")
	started := time.Now()
	startIn(t, p.A, "vigil.log", vigil, "run", "--vip", testVIP+"/24", "--interface", "a0",
		"--node-name", "cp1", "--election", "etcd", "--etcd-endpoints", "http://127.0.0.1:2379",
		"--lb-port", "6443", "--backend-port", strconv.Itoa(apiPort), "--health-ca", ca,
		"--kubeconfig", kc, "--metrics-address", "127.0.0.1:9558")
	testkit.WaitFor(t, 20*time.Second, "the VIP on a0 with no API server", func() bool { return hasVIP(t, p.A) })
	t.Logf("VIP up %v after vigil started; no API server exists", time.Since(started).Round(time.Millisecond))
	st := status(t, p.A)
	if len(st.Backends) != 1 || st.Backends[0].Address != "127.0.0.1:16443" || st.Backends[0].State == "up" {
		t.Fatalf("before the API server: backends %+v, want 127.0.0.1:16443 (from the etcd member list), not up", st.Backends)
	}

	kubetest.StartWith(t, kubetest.Options{
		EtcdURL: "http://127.0.0.1:2379", Netns: p.A, Port: apiPort,
		BindAddress: "0.0.0.0", AdvertiseAddress: nodeIP, Reconcile: true,
		CertFile: cert, KeyFile: key, CAFile: ca,
	})
	// From B, through the VIP and vigil's load balancer.
	dial := netns.Dialer(p.B)
	viaVIP, err := kubernetes.NewForConfig(&rest.Config{
		Host: vipURL, BearerToken: kubetest.AdminToken, TLSClientConfig: rest.TLSClientConfig{CAFile: ca},
		Dial: func(ctx context.Context, _, addr string) (net.Conn, error) { return dial(ctx, addr) },
	})
	if err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 60*time.Second, "a namespace created through the VIP", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := viaVIP.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "bootstrap"}}, metav1.CreateOptions{})
		return err == nil
	})

	testkit.WaitFor(t, 60*time.Second, "vigil to find the API server in the EndpointSlice", func() bool {
		for _, b := range status(t, p.A).Backends {
			if b.Address == net.JoinHostPort(nodeIP, strconv.Itoa(apiPort)) && b.State == "up" {
				return true
			}
		}
		return false
	})
	for _, src := range status(t, p.A).Discovery {
		if !src.Answered || src.Error != "" || len(src.Backends) != 1 {
			t.Errorf("discovery source %+v: want one backend, answered, no error", src)
		}
	}
	if sl, err := viaVIP.DiscoveryV1().EndpointSlices("default").Get(context.Background(), "kubernetes", metav1.GetOptions{}); err == nil {
		t.Logf("the API server's own EndpointSlice: %v:%v", sl.Endpoints[0].Addresses, *sl.Ports[0].Port)
	}

	// The worker: no etcd access, as on a kubeadm worker.
	startIn(t, p.B, "agent.log", vigil, "agent", "--server", vipURL, "--kubeconfig", kc,
		"--apiserver-listen", "127.0.0.1:7443", "--health-ca", ca, "--cache-dir", t.TempDir(),
		"--metrics-address", "127.0.0.1:9559")
	var agentStatus struct {
		Upstreams []struct {
			Backends []struct{ Address, Source, State string }
		}
		PublishedAPIServers []string
	}
	testkit.WaitFor(t, 30*time.Second, "the agent to learn the API server from the EndpointSlice", func() bool {
		if err := json.Unmarshal([]byte(get(t, p.B, "http://127.0.0.1:9559/status")), &agentStatus); err != nil || len(agentStatus.Upstreams) == 0 {
			return false
		}
		for _, b := range agentStatus.Upstreams[0].Backends {
			if b.Address == net.JoinHostPort(nodeIP, strconv.Itoa(apiPort)) && b.Source == "cluster" && b.State == "up" {
				return true
			}
		}
		return false
	})
	if want := []string{net.JoinHostPort(nodeIP, strconv.Itoa(apiPort))}; !slices.Equal(agentStatus.PublishedAPIServers, want) {
		t.Errorf("agent status publishedAPIServers = %v, want %v", agentStatus.PublishedAPIServers, want)
	}
	viaAgent, err := kubernetes.NewForConfig(&rest.Config{
		Host: "https://127.0.0.1:7443", BearerToken: kubetest.AdminToken,
		TLSClientConfig: rest.TLSClientConfig{CAFile: ca, ServerName: "kubernetes"},
		Dial:            func(ctx context.Context, _, addr string) (net.Conn, error) { return dial(ctx, addr) },
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := viaAgent.CoreV1().Namespaces().Get(context.Background(), "bootstrap", metav1.GetOptions{}); err != nil {
		t.Fatalf("through the worker's agent: %v", err)
	}

	m := get(t, p.A, "http://127.0.0.1:9558/metrics")
	for _, re := range []string{
		`vigil_lock_renew_duration_seconds_count\{result="ok"\} [1-9]`,
		`vigil_leader_transitions_total [1-9]`,
		`vigil_vip_held 1`,
		`vigil_member_unreachable_seconds\{member="[^"]+"\} 0\n`, // every member answers
	} {
		if !regexp.MustCompile(re).MatchString(m) {
			t.Errorf("metrics lack %s", re)
		}
	}
}

// status runs `vigil status --json` inside ns.
func status(t *testing.T, ns string) Report {
	t.Helper()
	out, err := exec.Command("ip", "netns", "exec", ns, nstest.Binary(t, "vigil"), "status", "--json").Output()
	if err != nil {
		t.Fatalf("vigil status: %v", err)
	}
	var r Report
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("vigil status --json: %v\n%s", err, out)
	}
	return r
}

// get reads an http URL inside ns; "" when it cannot.
func get(t *testing.T, ns, url string) string {
	t.Helper()
	dial := netns.Dialer(ns)
	tr := &http.Transport{DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) { return dial(ctx, addr) }}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Timeout: 5 * time.Second, Transport: tr}
	resp, err := hc.Get(url)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}
