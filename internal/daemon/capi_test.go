package daemon

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vigil-ha/vigil/internal/etcdtest"
	"github.com/vigil-ha/vigil/internal/kube"
	"github.com/vigil-ha/vigil/internal/kubetest"
	"github.com/vigil-ha/vigil/internal/membership"
)

// The holder does not prune where Cluster API manages the machines: its
// own Node or the member's carrying Cluster API's machine annotation
// vetoes the removal, against a real kube-apiserver; plain Nodes, Nodes
// that do not exist and an API server that cannot be read do not.
func TestCAPIVetoKeepsMembersClusterAPIManages(t *testing.T) {
	s := kubetest.Start(t, etcdtest.Start(t, 1).Endpoints[0])
	cs := s.Client(t, kubetest.AdminToken)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	kcp := map[string]string{kube.CAPIMachineAnnotation: "prod-cp-x7k2z", kube.CAPIOwnerKindAnnotation: "KubeadmControlPlane", kube.CAPIOwnerNameAnnotation: "prod-cp"}
	for name, ann := range map[string]map[string]string{"cp1": nil, "cp2": kcp, "capi-self": kcp} {
		if _, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: ann}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	log := slog.New(slog.DiscardHandler)
	plain := newCAPIVeto(cs, "cp1", log)
	if why := plain.check(ctx, membership.Member{Name: "cp3"}); why != "" {
		t.Fatalf("a member with no Node vetoed on a plain node: %q", why)
	}
	if why := plain.check(ctx, membership.Member{Name: "cp2"}); !strings.Contains(why, "KubeadmControlPlane/prod-cp (Machine prod-cp-x7k2z)") {
		t.Fatalf("veto of a member whose Node Cluster API manages = %q", why)
	}
	if why := newCAPIVeto(cs, "capi-self", log).check(ctx, membership.Member{Name: "cp3"}); !strings.Contains(why, "node capi-self") {
		t.Fatalf("veto on a node Cluster API manages = %q", why)
	}
	unreadable := newCAPIVeto(s.Client(t, kubetest.NobodyToken), "capi-self", log)
	if why := unreadable.check(ctx, membership.Member{Name: "cp2"}); why != "" {
		t.Fatalf("a Node that cannot be read vetoed: %q", why)
	}
}
