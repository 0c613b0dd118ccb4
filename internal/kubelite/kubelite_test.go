package kubelite

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/vigil-ha/vigil/internal/etcdtest"
	"github.com/vigil-ha/vigil/internal/kubetest"
	"github.com/vigil-ha/vigil/internal/testkit"
)

func TestMain(m *testing.M) {
	etcdtest.Main(m, etcdtest.LeakOptions()...)
}

func ptr[T any](v T) *T { return &v }

func slice(name string, typ discoveryv1.AddressType, port int32, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: APIServerNamespace,
			Labels: map[string]string{discoveryv1.LabelServiceName: APIServerService},
		},
		AddressType: typ,
		Endpoints:   eps,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("https"), Port: ptr(port), Protocol: ptr(corev1.ProtocolTCP)}},
	}
}

func ep(addr string, ready *bool) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{Addresses: []string{addr}, Conditions: discoveryv1.EndpointConditions{Ready: ready}}
}

// fromAPI turns client-go's EndpointSlices into ours through their JSON,
// as the API server sends them: our field names must be the real ones.
func fromAPI(t *testing.T, in []*discoveryv1.EndpointSlice) []EndpointSlice {
	t.Helper()
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	var out []EndpointSlice
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestFromEndpointSlices(t *testing.T) {
	noPorts := slice("np", discoveryv1.AddressTypeIPv4, 1, ep("10.0.0.9", nil))
	noPorts.Ports = nil
	twoPorts := slice("tp", discoveryv1.AddressTypeIPv4, 6443, ep("10.0.0.8", nil))
	twoPorts.Ports = append(twoPorts.Ports, discoveryv1.EndpointPort{Name: ptr("other"), Port: ptr(int32(9))})
	fqdn := slice("fq", discoveryv1.AddressTypeFQDN, 6443, ep("api.example", nil))
	for _, tc := range []struct {
		name string
		in   []*discoveryv1.EndpointSlice
		want []string
	}{
		{"ready and unset count, not-ready does not", []*discoveryv1.EndpointSlice{
			slice("a", discoveryv1.AddressTypeIPv4, 6443, ep("10.0.0.2", ptr(true)), ep("10.0.0.1", nil), ep("10.0.0.3", ptr(false))),
		}, []string{"10.0.0.1:6443", "10.0.0.2:6443"}},
		{"IPv6 slice joins with brackets", []*discoveryv1.EndpointSlice{
			slice("a", discoveryv1.AddressTypeIPv4, 6443, ep("10.0.0.1", nil)),
			slice("b", discoveryv1.AddressTypeIPv6, 6443, ep("fd00::1", nil)),
		}, []string{"10.0.0.1:6443", "[fd00::1]:6443"}},
		{"repeats across slices collapse", []*discoveryv1.EndpointSlice{
			slice("a", discoveryv1.AddressTypeIPv4, 6443, ep("10.0.0.1", nil)),
			slice("b", discoveryv1.AddressTypeIPv4, 6443, ep("10.0.0.1", nil)),
		}, []string{"10.0.0.1:6443"}},
		{"the https port among several", []*discoveryv1.EndpointSlice{twoPorts}, []string{"10.0.0.8:6443"}},
		{"no port, FQDN: ignored", []*discoveryv1.EndpointSlice{noPorts, fqdn}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if d := cmp.Diff(tc.want, FromEndpointSlices(fromAPI(t, tc.in))); d != "" {
				t.Fatalf("(-want +got):\n%s", d)
			}
		})
	}
}

// Through a real kube-apiserver: a client from a kubeconfig follows the
// slices; one whose user may not read them never syncs, and stops.
func TestAPIServers(t *testing.T) {
	s := kubetest.Start(t, etcdtest.Start(t, 1).Endpoints[0])
	admin := s.Client(t, kubetest.AdminToken)
	s.WaitNamespace(t, "default")
	client := func(token string) *Client {
		c, err := FromKubeconfig(s.Kubeconfig(t, token))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.HTTP.CloseIdleConnections)
		return c
	}
	t.Run("FollowsTheSlices", func(t *testing.T) { testAPIServers(t, client(kubetest.AdminToken), admin) })
	t.Run("Forbidden", func(t *testing.T) { testAPIServersForbidden(t, client(kubetest.NobodyToken)) })
}

// The follower sees each change the API server stores, through its watch,
// in order, and ends cleanly.
func testAPIServers(t *testing.T, c *Client, cs kubernetes.Interface) {
	ctx, cancel := context.WithCancel(context.Background())
	changes := make(chan []string, 16)
	a := NewAPIServers(c, func(b []string) { changes <- b }, testkit.Log(t))
	done := make(chan struct{})
	go func() { _ = a.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	want := func(w ...string) {
		t.Helper()
		deadline := time.After(15 * time.Second)
		for {
			select {
			case got := <-changes:
				if slices.Equal(got, w) || (len(w) == 0 && len(got) == 0) {
					return
				}
				t.Logf("intermediate set %v", got)
			case <-deadline:
				b, synced := a.Backends()
				t.Fatalf("backends never became %v; now %v (synced %v)", w, b, synced)
			}
		}
	}
	if !a.WaitSynced(ctxTimeout(t, 15*time.Second)) {
		t.Fatal("never synced")
	}
	want() // nothing published: kubetest runs --endpoint-reconciler-type=none

	sl := slice("kubernetes", discoveryv1.AddressTypeIPv4, 6443, ep("10.0.0.1", nil), ep("10.0.0.2", ptr(false)))
	sc := cs.DiscoveryV1().EndpointSlices(APIServerNamespace)
	got, err := sc.Create(ctxTimeout(t, 5*time.Second), sl, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want("10.0.0.1:6443")
	got.Endpoints = append(got.Endpoints, ep("10.0.0.3", ptr(true)))
	got.Endpoints[1].Conditions.Ready = ptr(true)
	if _, err := sc.Update(ctxTimeout(t, 5*time.Second), got, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	want("10.0.0.1:6443", "10.0.0.2:6443", "10.0.0.3:6443")
	// A slice of another Service is not ours.
	other := slice("other", discoveryv1.AddressTypeIPv4, 443, ep("10.9.9.9", nil))
	other.Labels[discoveryv1.LabelServiceName] = "other"
	if _, err := sc.Create(ctxTimeout(t, 5*time.Second), other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := sc.Delete(ctxTimeout(t, 5*time.Second), "kubernetes", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	want()
	if b, _ := a.Backends(); len(b) != 0 {
		t.Fatalf("backends %v after the slice went, want none (another Service's slice must not count)", b)
	}
}

// Without RBAC the follower never syncs, says so, and still stops.
func testAPIServersForbidden(t *testing.T, c *Client) {
	ctx, cancel := context.WithCancel(context.Background())
	a := NewAPIServers(c, nil, testkit.Log(t))
	done := make(chan struct{})
	go func() { _ = a.Run(ctx); close(done) }()
	if a.WaitSynced(ctxTimeout(t, 2*time.Second)) {
		t.Fatal("synced without permission to list EndpointSlices")
	}
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}

func ctxTimeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
