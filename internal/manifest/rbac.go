package manifest

import (
	"fmt"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// RBAC returns what vigil needs from the API server, no more (cmd/vigil's
// TestRBACIsWhatVigilUses compares it with a real API server's audit log of
// every call vigil makes):
//   - vigil run (ServiceAccount kube-system/vigil, or the user "vigil" of a
//     kubeconfig made with `kubeadm kubeconfig user --client-name vigil`):
//     its election Lease in kube-system (get, watch, create, update); in
//     the default namespace, the kubernetes Service's EndpointSlices (list,
//     watch) to find API servers and Events on its Node (create); Nodes
//     (get, delete) and node Leases in kube-node-lease (get), used by the
//     opt-in removal of a pruned member's Node, and Nodes (get) by
//     --prune-after to see whether Cluster API manages them. Nodes are the one
//     cluster-wide grant: they have no namespace.
//   - vigil agent (ServiceAccount kube-system/vigil-agent, or the user
//     "vigil-agent"): the EndpointSlices in default (list, watch).
//
// RBAC cannot grant the deletion of some Nodes only, so a
// ValidatingAdmissionPolicy (and its binding) narrows vigil run's: its
// identities may delete only Nodes labelled as control-plane
// (NodePolicyName).
func RBAC() []runtime.Object {
	daemonSubjects := []rbacv1.Subject{
		{Kind: rbacv1.ServiceAccountKind, Name: DaemonName, Namespace: Namespace},
		{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: DaemonName},
	}
	out := []runtime.Object{serviceAccount(DaemonName), serviceAccount(AgentName)}
	out = append(out, role(DaemonName, Namespace, daemonSubjects, rbacv1.PolicyRule{
		APIGroups: []string{leaseResourceGroup}, Resources: []string{"leases"}, Verbs: []string{"get", "watch", "create", "update", "patch"},
	})...)
	out = append(out, role(DaemonName+"-node-leases", "kube-node-lease", daemonSubjects, rbacv1.PolicyRule{
		APIGroups: []string{leaseResourceGroup}, Resources: []string{"leases"}, Verbs: []string{"get"},
	})...)
	out = append(out, role(DaemonName, ServiceNamespace, daemonSubjects, sliceRule,
		rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create"}})...)
	out = append(out,
		&rbacv1.ClusterRole{
			TypeMeta:   typeMeta("ClusterRole"),
			ObjectMeta: metav1.ObjectMeta{Name: DaemonName, Labels: map[string]string{appLabel: DaemonName}},
			Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "delete"}}},
		},
		&rbacv1.ClusterRoleBinding{
			TypeMeta:   typeMeta("ClusterRoleBinding"),
			ObjectMeta: metav1.ObjectMeta{Name: DaemonName, Labels: map[string]string{appLabel: DaemonName}},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: DaemonName},
			Subjects:   daemonSubjects,
		})
	out = append(out, agentRole()...)
	out = append(out, nodePolicy(daemonSubjects)...)
	return out
}

// AgentRBAC is the part of RBAC that vigil agent needs: its
// ServiceAccount, and its Role and binding on the EndpointSlices. The
// agent's Helm chart ships these alone.
func AgentRBAC() []runtime.Object {
	return append([]runtime.Object{serviceAccount(AgentName)}, agentRole()...)
}

func agentRole() []runtime.Object {
	subjects := []rbacv1.Subject{
		{Kind: rbacv1.ServiceAccountKind, Name: AgentName, Namespace: Namespace},
		{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: AgentName},
	}
	return role(AgentName, ServiceNamespace, subjects, sliceRule)
}

var sliceRule = rbacv1.PolicyRule{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"list", "watch"}}

func role(name, ns string, subjects []rbacv1.Subject, rules ...rbacv1.PolicyRule) []runtime.Object {
	om := metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{appLabel: DaemonName}}
	return []runtime.Object{
		&rbacv1.Role{TypeMeta: typeMeta("Role"), ObjectMeta: om, Rules: rules},
		&rbacv1.RoleBinding{TypeMeta: typeMeta("RoleBinding"), ObjectMeta: om,
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name}, Subjects: subjects},
	}
}

// NodePolicyName names the ValidatingAdmissionPolicy and binding that let
// vigil run's identities delete control-plane Nodes only.
const NodePolicyName = DaemonName + "-control-plane-nodes-only"

// ControlPlaneLabel marks a control-plane Node (kubeadm sets it).
const ControlPlaneLabel = "node-role.kubernetes.io/control-plane"

// nodePolicy is the admission policy on vigil's Node deletions: vigil
// removes the Node of a pruned etcd member, always a control-plane node,
// and nothing in the cluster should let a bug or a stolen credential of
// vigil's delete a worker. The policy matches the identities of subjects
// only; everyone else's deletions pass untouched.
func nodePolicy(subjects []rbacv1.Subject) []runtime.Object {
	var users []string
	for _, s := range subjects {
		name := s.Name
		if s.Kind == rbacv1.ServiceAccountKind {
			name = "system:serviceaccount:" + s.Namespace + ":" + s.Name
		}
		users = append(users, fmt.Sprintf("request.userInfo.username == %q", name))
	}
	labels := map[string]string{appLabel: DaemonName}
	fail, deny := admissionregistrationv1.Fail, admissionregistrationv1.Deny
	return []runtime.Object{
		&admissionregistrationv1.ValidatingAdmissionPolicy{
			TypeMeta:   metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "ValidatingAdmissionPolicy"},
			ObjectMeta: metav1.ObjectMeta{Name: NodePolicyName, Labels: labels},
			Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
				FailurePolicy: &fail,
				MatchConstraints: &admissionregistrationv1.MatchResources{
					ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{RuleWithOperations: admissionregistrationv1.RuleWithOperations{
						Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Delete},
						Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"nodes"}},
					}}},
				},
				MatchConditions: []admissionregistrationv1.MatchCondition{{Name: "vigil", Expression: strings.Join(users, " || ")}},
				Validations: []admissionregistrationv1.Validation{{
					Expression: fmt.Sprintf("has(oldObject.metadata.labels) && %q in oldObject.metadata.labels", ControlPlaneLabel),
					Message:    "vigil may delete only control-plane Nodes (labelled " + ControlPlaneLabel + "); this Node is not one",
					Reason:     ptr(metav1.StatusReasonForbidden),
				}},
			},
		},
		&admissionregistrationv1.ValidatingAdmissionPolicyBinding{
			TypeMeta:   metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "ValidatingAdmissionPolicyBinding"},
			ObjectMeta: metav1.ObjectMeta{Name: NodePolicyName, Labels: labels},
			Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
				PolicyName:        NodePolicyName,
				ValidationActions: []admissionregistrationv1.ValidationAction{deny},
			},
		},
	}
}

// ServiceNamespace holds the kubernetes Service, its EndpointSlices, and
// the Events about Nodes.
const ServiceNamespace = "default"

func serviceAccount(name string) *corev1.ServiceAccount {
	return &corev1.ServiceAccount{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ServiceAccount"}, ObjectMeta: meta(name)}
}
