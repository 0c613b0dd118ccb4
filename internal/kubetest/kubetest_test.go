package kubetest

import (
	"context"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vigil-ha/vigil/internal/etcdtest"
)

// TestServerAuthenticatesAndAuthorizes checks the helper itself: the admin
// token may do anything, the nobody token is authenticated but forbidden.
func TestServerAuthenticatesAndAuthorizes(t *testing.T) {
	s := Start(t, etcdtest.Start(t, 1).Endpoints[0])
	s.WaitNamespace(t, "kube-system")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := s.Client(t, AdminToken).CoordinationV1().Leases("kube-system").List(ctx, metav1.ListOptions{}); err != nil {
		t.Fatalf("admin: %v", err)
	}
	_, err := s.Client(t, NobodyToken).CoordinationV1().Leases("kube-system").List(ctx, metav1.ListOptions{})
	if !apierrors.IsForbidden(err) {
		t.Fatalf("nobody: err = %v, want 403", err)
	}
}
