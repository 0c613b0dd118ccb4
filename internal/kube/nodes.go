package kube

import (
	"context"
	"errors"
	"fmt"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// ErrNodeReady refuses to delete a Node whose kubelet still reports Ready:
// its etcd member looked dead, but the machine is alive, and deleting its
// Node would evict its pods for nothing.
var ErrNodeReady = errors.New("kube: node is Ready")

// NodeDeletion is what DeleteDeadNode did.
type NodeDeletion int

const (
	NodeDeleted NodeDeletion = iota
	// NodeAbsent: there was no Node of that name (kubeadm names etcd
	// members after their nodes; a member named otherwise has none).
	NodeAbsent
)

// DeleteDeadNode deletes the Node called name, unless its Ready condition
// is True. The delete is conditional on the UID and resourceVersion that
// were checked, so a node that re-registers or turns Ready in between is
// left alone (the API server answers 409; the error says so).
func DeleteDeadNode(ctx context.Context, cs kubernetes.Interface, name string) (NodeDeletion, error) {
	n, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return NodeAbsent, nil
	}
	if err != nil {
		return 0, fmt.Errorf("get node %s: %w", name, err)
	}
	if nodeReady(n) {
		return 0, fmt.Errorf("delete node %s: %w (its kubelet still reports it; leaving it)", name, ErrNodeReady)
	}
	uid, rv := n.UID, n.ResourceVersion
	err = cs.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{
		Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv},
	})
	switch {
	case apierrors.IsNotFound(err):
		return NodeAbsent, nil
	case apierrors.IsConflict(err):
		return 0, fmt.Errorf("delete node %s: it changed since it was found not Ready; leaving it: %w", name, err)
	case err != nil:
		return 0, fmt.Errorf("delete node %s: %w", name, err)
	}
	return NodeDeleted, nil
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// ErrCannotDeleteNodes: the kubeconfig's user may not delete Nodes.
var ErrCannotDeleteNodes = errors.New("kube: not allowed to delete nodes")

// CheckCanDeleteNodes asks the API server whether the client's user may
// delete Nodes, so that a command can refuse before it changes anything
// rather than remove a member and then fail on its Node.
func CheckCanDeleteNodes(ctx context.Context, cs kubernetes.Interface) error {
	r, err := cs.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
		Spec: authorizationv1.SelfSubjectAccessReviewSpec{
			ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: "delete", Resource: "nodes"},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("check permission to delete nodes: %w", err)
	}
	if !r.Status.Allowed {
		return fmt.Errorf("%w: grant it (vigil manifest rbac) or drop `deleteNode`", ErrCannotDeleteNodes)
	}
	return nil
}

// NodeLeaseNamespace holds the Leases kubelets renew as their heartbeat.
const NodeLeaseNamespace = "kube-node-lease"

// NodeLeaseRenewal reads when the kubelet of node name last renewed its
// Lease, by the kubelet's own clock: compare it only with other readings of
// the same Lease. found is false when there is no such Lease.
func NodeLeaseRenewal(ctx context.Context, cs kubernetes.Interface, name string) (renew time.Time, found bool, err error) {
	l, err := cs.CoordinationV1().Leases(NodeLeaseNamespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return time.Time{}, false, nil
	}
	if err != nil {
		return time.Time{}, false, fmt.Errorf("get the node Lease %s/%s: %w", NodeLeaseNamespace, name, err)
	}
	if l.Spec.RenewTime != nil {
		renew = l.Spec.RenewTime.Time
	}
	return renew, true, nil
}

// Cluster API marks the Node of every machine it manages: the Machine's
// name, and the kind and name of the controller that owns the Machine
// (KubeadmControlPlane for a kubeadm control plane). That controller's
// remediation removes a control-plane machine's etcd member itself, so a
// second remover (vigil run --prune-after) would race it.
const (
	CAPIMachineAnnotation   = "cluster.x-k8s.io/machine"
	CAPIOwnerKindAnnotation = "cluster.x-k8s.io/owner-kind"
	CAPIOwnerNameAnnotation = "cluster.x-k8s.io/owner-name"
)

// ClusterAPIManager says what manages the Node called name when Cluster
// API does, e.g. "KubeadmControlPlane/prod-cp (Machine prod-cp-x7k2z)";
// "" when it does not, or when there is no such Node.
func ClusterAPIManager(ctx context.Context, cs kubernetes.Interface, name string) (string, error) {
	n, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("get node %s: %w", name, err)
	}
	machine, ok := n.Annotations[CAPIMachineAnnotation]
	if !ok {
		return "", nil
	}
	owner := "Cluster API"
	if kind := n.Annotations[CAPIOwnerKindAnnotation]; kind != "" {
		owner = kind + "/" + n.Annotations[CAPIOwnerNameAnnotation]
	}
	return fmt.Sprintf("%s (Machine %s)", owner, machine), nil
}
