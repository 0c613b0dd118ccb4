package daemon

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vigil-ha/vigil/internal/etcdtest"
	"github.com/vigil-ha/vigil/internal/kubetest"
	"github.com/vigil-ha/vigil/internal/membership"
	"github.com/vigil-ha/vigil/internal/testkit"
)

// TestNodeReaperWaitsForTheKubeletToStop runs the Node deletion of
// --prune-delete-node against a real kube-apiserver: the Node of a pruned
// member goes only once its Lease has stayed unrenewed for the whole
// period on vigil's clock; a node whose kubelet renews after the prune
// (partitioned from etcd, not dead) keeps its Node.
func TestNodeReaperWaitsForTheKubeletToStop(t *testing.T) {
	s := kubetest.Start(t, etcdtest.Start(t, 1).Endpoints[0])
	cs := s.Client(t, kubetest.AdminToken)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, name := range []string{"dead", "partitioned"} {
		if _, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		renew := metav1.NewMicroTime(time.Now())
		if _, err := cs.CoordinationV1().Leases("kube-node-lease").Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:       coordinationv1.LeaseSpec{HolderIdentity: &name, RenewTime: &renew},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	renew := func(name string) {
		l, err := cs.CoordinationV1().Leases("kube-node-lease").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		now := metav1.NewMicroTime(time.Now())
		l.Spec.RenewTime = &now
		if _, err := cs.CoordinationV1().Leases("kube-node-lease").Update(ctx, l, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	exists := func(name string) bool {
		_, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		return err == nil
	}
	const after = 2 * time.Second
	r := newNodeReaper(cs, after, slog.New(slog.DiscardHandler))
	var mu sync.Mutex
	var deleted []string
	onDeleted := func(n string) { mu.Lock(); deleted = append(deleted, n); mu.Unlock() }
	v := membership.View{Members: []membership.Member{{ID: 1, Name: "dead"}, {ID: 2, Name: "partitioned"}, {ID: 3, Name: "alive", Reachable: true}}}

	// Both members unreachable; both pruned at once, before their Leases
	// were watched for the period: nothing is deleted yet.
	r.observe(ctx, v, onDeleted)
	r.pruned(ctx, "dead", onDeleted)
	r.pruned(ctx, "partitioned", onDeleted)
	if !exists("dead") || !exists("partitioned") {
		t.Fatal("a Node was deleted before its Lease was seen unrenewed for the period")
	}
	// The partitioned node's kubelet still renews.
	time.Sleep(leaseReadInterval + 100*time.Millisecond)
	renew("partitioned")
	// Observations drive the reaper, as memberWatch's rounds do.
	testkit.WaitNilEvery(t, after+2*leaseReadInterval+5*time.Second, 200*time.Millisecond, "the dead node's Node deleted", func() error {
		r.observe(ctx, v, onDeleted)
		if exists("dead") {
			return errors.New("it is still there")
		}
		return nil
	})
	testkit.Always(t, 2*leaseReadInterval, "the Node kept of a node whose kubelet renews its Lease", func() bool {
		r.observe(ctx, v, onDeleted)
		return exists("partitioned")
	})
	if len(r.pending) != 0 || len(deleted) != 1 || deleted[0] != "dead" {
		t.Fatalf("pending %v, deleted %v", r.pending, deleted)
	}
}
