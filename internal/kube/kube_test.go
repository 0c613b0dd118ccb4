package kube

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/vigil-ha/vigil/internal/etcdtest"
	"github.com/vigil-ha/vigil/internal/kubetest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, etcdtest.LeakOptions()...)
}

func testLog(t *testing.T) *slog.Logger { return slog.New(slog.NewTextHandler(t.Output(), nil)) }

// server is a real kube-apiserver with its own embedded etcd.
func server(t *testing.T) *kubetest.Server {
	t.Helper()
	return kubetest.Start(t, etcdtest.Start(t, 1).Endpoints[0])
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
			if d := cmp.Diff(tc.want, FromEndpointSlices(tc.in)); d != "" {
				t.Fatalf("(-want +got):\n%s", d)
			}
		})
	}
}

func TestKubernetes(t *testing.T) {
	s := server(t)
	admin := s.Client(t, kubetest.AdminToken)
	s.WaitNamespace(t, "kube-system")
	t.Run("APIServersFollowsTheSlices", func(t *testing.T) { testAPIServers(t, admin) })
	t.Run("APIServersForbidden", func(t *testing.T) { testAPIServersForbidden(t, s.Client(t, kubetest.NobodyToken)) })
	t.Run("Events", func(t *testing.T) { testEvents(t, admin, s.Client(t, kubetest.NobodyToken)) })
	t.Run("DeleteDeadNode", func(t *testing.T) { testDeleteDeadNode(t, admin) })
}

// The follower sees each change the API server stores, through its watch,
// in order, and ends cleanly.
func testAPIServers(t *testing.T, cs kubernetes.Interface) {
	ctx, cancel := context.WithCancel(context.Background())
	changes := make(chan []string, 16)
	a := NewAPIServers(cs, func(b []string) { changes <- b }, testLog(t))
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
	c := cs.DiscoveryV1().EndpointSlices(APIServerNamespace)
	got, err := c.Create(ctxTimeout(t, 5*time.Second), sl, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want("10.0.0.1:6443")
	got.Endpoints = append(got.Endpoints, ep("10.0.0.3", ptr(true)))
	got.Endpoints[1].Conditions.Ready = ptr(true)
	if _, err := c.Update(ctxTimeout(t, 5*time.Second), got, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	want("10.0.0.1:6443", "10.0.0.2:6443", "10.0.0.3:6443")
	// A slice of another Service is not ours.
	other := slice("other", discoveryv1.AddressTypeIPv4, 443, ep("10.9.9.9", nil))
	other.Labels[discoveryv1.LabelServiceName] = "other"
	if _, err := c.Create(ctxTimeout(t, 5*time.Second), other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctxTimeout(t, 5*time.Second), "kubernetes", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	want()
	if b, _ := a.Backends(); len(b) != 0 {
		t.Fatalf("backends %v after the slice went, want none (another Service's slice must not count)", b)
	}
}

// Without RBAC the follower never syncs, says so, and still stops.
func testAPIServersForbidden(t *testing.T, cs kubernetes.Interface) {
	ctx, cancel := context.WithCancel(context.Background())
	a := NewAPIServers(cs, nil, testLog(t))
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

func testEvents(t *testing.T, admin, nobody kubernetes.Interface) {
	ref := LeaseRef("kube-system", "vigil-events-test")
	e := NewEvents(admin, ref, "n1", testLog(t))
	e.Emit(false, ReasonBecameLeader, "n1 holds the VIP %s", "10.0.0.100")
	e.Emit(true, ReasonSteppedDown, "n1 stepped down: %s", "lock lost")
	e.Close(10 * time.Second)
	e.Close(time.Second) // twice is fine

	list, err := admin.CoreV1().Events("kube-system").List(ctxTimeout(t, 5*time.Second), metav1.ListOptions{
		FieldSelector: "involvedObject.name=vigil-events-test",
	})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, ev := range list.Items {
		if ev.InvolvedObject.Kind != "Lease" || ev.Source.Host != "n1" || ev.ReportingController != "vigil.dev/vigil" {
			t.Errorf("event %s: involved %+v source %+v", ev.Name, ev.InvolvedObject, ev.Source)
		}
		got = append(got, ev.Type+" "+ev.Reason+": "+ev.Message)
	}
	slices.Sort(got)
	want := []string{"Normal BecameLeader: n1 holds the VIP 10.0.0.100", "Warning SteppedDown: n1 stepped down: lock lost"}
	if d := cmp.Diff(want, got); d != "" {
		t.Fatalf("events (-want +got):\n%s", d)
	}

	// On an existing Lease: where `kubectl describe lease` looks (its
	// UID is part of the query).
	lease, err := admin.CoordinationV1().Leases("kube-system").Create(ctxTimeout(t, 5*time.Second),
		&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "vigil-described", Namespace: "kube-system"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	le := NewEvents(admin, LeaseRef("kube-system", "vigil-described"), "n1", testLog(t))
	le.Emit(false, ReasonBecameLeader, "n1 holds the VIP")
	le.Close(10 * time.Second)
	leaseEvents, err := admin.CoreV1().Events("kube-system").List(ctxTimeout(t, 5*time.Second), metav1.ListOptions{
		FieldSelector: "involvedObject.name=vigil-described,involvedObject.namespace=kube-system,involvedObject.kind=Lease,involvedObject.uid=" + string(lease.UID),
	})
	if err != nil || len(leaseEvents.Items) != 1 {
		t.Fatalf("lease events as kubectl describe lease finds them: %+v, %v", leaseEvents, err)
	}

	// On a Node: where `kubectl describe node` looks (its second query:
	// any namespace, involvedObject.namespace "", uid = the node's name).
	n := NewEvents(admin, NodeRef("cp1"), "cp1", testLog(t))
	n.Emit(false, ReasonBecameLeader, "cp1 holds the VIP")
	n.Close(10 * time.Second)
	nodeEvents, err := admin.CoreV1().Events("").List(ctxTimeout(t, 5*time.Second), metav1.ListOptions{
		FieldSelector: "involvedObject.name=cp1,involvedObject.namespace=,involvedObject.kind=Node,involvedObject.uid=cp1",
	})
	if err != nil || len(nodeEvents.Items) != 1 || nodeEvents.Items[0].Namespace != "default" {
		t.Fatalf("node events as kubectl describe node finds them: %+v, %v", nodeEvents, err)
	}

	// Forbidden: Emit does not block and Close returns in time.
	f := NewEvents(nobody, NodeRef("n2"), "n2", testLog(t))
	start := time.Now()
	for range 3 * eventQueue { // more than the queue holds
		f.Emit(false, ReasonBecameLeader, "x")
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("Emit blocked for %v", d)
	}
	f.Close(2 * time.Second)
	if d := time.Since(start); d > 8*time.Second {
		t.Fatalf("Close took %v", d)
	}
}

func testDeleteDeadNode(t *testing.T, cs kubernetes.Interface) {
	mk := func(name string, ready corev1.ConditionStatus) {
		t.Helper()
		n, err := cs.CoreV1().Nodes().Create(ctxTimeout(t, 5*time.Second), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: ready, LastHeartbeatTime: metav1.Now()}}
		if _, err := cs.CoreV1().Nodes().UpdateStatus(ctxTimeout(t, 5*time.Second), n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	exists := func(name string) bool {
		_, err := cs.CoreV1().Nodes().Get(ctxTimeout(t, 5*time.Second), name, metav1.GetOptions{})
		return err == nil
	}
	mk("cp-alive", corev1.ConditionTrue)
	mk("cp-dead", corev1.ConditionUnknown)

	if _, err := DeleteDeadNode(ctxTimeout(t, 5*time.Second), cs, "cp-alive"); !errors.Is(err, ErrNodeReady) {
		t.Fatalf("delete of a Ready node: err = %v, want ErrNodeReady", err)
	}
	if !exists("cp-alive") {
		t.Fatal("a Ready node was deleted")
	}
	if got, err := DeleteDeadNode(ctxTimeout(t, 5*time.Second), cs, "cp-dead"); err != nil || got != NodeDeleted {
		t.Fatalf("delete of a dead node = %v, %v", got, err)
	}
	if exists("cp-dead") {
		t.Fatal("the dead node is still there")
	}
	if got, err := DeleteDeadNode(ctxTimeout(t, 5*time.Second), cs, "cp-never"); err != nil || got != NodeAbsent {
		t.Fatalf("delete of a missing node = %v, %v", got, err)
	}
}

func ctxTimeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
