package kube

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/vigil-ha/vigil/internal/etcdtest"
	"github.com/vigil-ha/vigil/internal/kubetest"
	"github.com/vigil-ha/vigil/internal/testkit"
)

func TestMain(m *testing.M) {
	etcdtest.Main(m, etcdtest.LeakOptions()...)
}

// server is a real kube-apiserver with its own embedded etcd.
func server(t *testing.T) *kubetest.Server {
	t.Helper()
	return kubetest.Start(t, etcdtest.Start(t, 1).Endpoints[0])
}

func TestKubernetes(t *testing.T) {
	s := server(t)
	admin := s.Client(t, kubetest.AdminToken)
	s.WaitNamespace(t, "kube-system")
	t.Run("Events", func(t *testing.T) { testEvents(t, admin, s.Client(t, kubetest.NobodyToken)) })
	t.Run("DeleteDeadNode", func(t *testing.T) { testDeleteDeadNode(t, admin) })
	t.Run("ClusterAPIManager", func(t *testing.T) { testClusterAPIManager(t, admin) })
}

func testClusterAPIManager(t *testing.T, admin kubernetes.Interface) {
	ctx := ctxTimeout(t, 10*time.Second)
	for name, ann := range map[string]map[string]string{
		"capi-kcp":   {CAPIMachineAnnotation: "prod-cp-x7k2z", CAPIOwnerKindAnnotation: "KubeadmControlPlane", CAPIOwnerNameAnnotation: "prod-cp", "cluster.x-k8s.io/cluster-name": "prod"},
		"capi-bare":  {CAPIMachineAnnotation: "m-1"},
		"plain-node": {"kubeadm.alpha.kubernetes.io/cri-socket": "unix:///run/containerd/containerd.sock"},
	} {
		if _, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: ann}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for name, want := range map[string]string{
		"capi-kcp":   "KubeadmControlPlane/prod-cp (Machine prod-cp-x7k2z)",
		"capi-bare":  "Cluster API (Machine m-1)",
		"plain-node": "",
		"no-such":    "",
	} {
		if got, err := ClusterAPIManager(ctx, admin, name); err != nil || got != want {
			t.Errorf("ClusterAPIManager(%s) = %q, %v; want %q", name, got, err, want)
		}
	}
}

func testEvents(t *testing.T, admin, nobody kubernetes.Interface) {
	ref := LeaseRef("kube-system", "vigil-events-test")
	e := NewEvents(admin, ref, "n1", testkit.Log(t))
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
	le := NewEvents(admin, LeaseRef("kube-system", "vigil-described"), "n1", testkit.Log(t))
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
	n := NewEvents(admin, NodeRef("cp1"), "cp1", testkit.Log(t))
	n.Emit(false, ReasonBecameLeader, "cp1 holds the VIP")
	n.Close(10 * time.Second)
	nodeEvents, err := admin.CoreV1().Events("").List(ctxTimeout(t, 5*time.Second), metav1.ListOptions{
		FieldSelector: "involvedObject.name=cp1,involvedObject.namespace=,involvedObject.kind=Node,involvedObject.uid=cp1",
	})
	if err != nil || len(nodeEvents.Items) != 1 || nodeEvents.Items[0].Namespace != "default" {
		t.Fatalf("node events as kubectl describe node finds them: %+v, %v", nodeEvents, err)
	}

	// Forbidden: Emit does not block and Close returns in time.
	f := NewEvents(nobody, NodeRef("n2"), "n2", testkit.Log(t))
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
