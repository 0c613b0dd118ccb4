package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/vigil-ha/vigil/internal/election"
	"github.com/vigil-ha/vigil/internal/etcdtest"
	"github.com/vigil-ha/vigil/internal/kube"
	"github.com/vigil-ha/vigil/internal/kubelite"
	"github.com/vigil-ha/vigil/internal/kubetest"
	"github.com/vigil-ha/vigil/internal/manifest"
	"github.com/vigil-ha/vigil/internal/testkit"
)

// refusedNode is the worker Node vigil tries to delete, and the admission
// policy of vigil manifest rbac refuses.
const refusedNode = "worker1"

// access is one kind of request: who, on what, how.
type access struct{ user, group, resource, namespace, verb string }

func (a access) String() string {
	g := a.group
	if g == "" {
		g = "core"
	}
	ns := a.namespace
	if ns == "" {
		ns = "(cluster)"
	}
	return fmt.Sprintf("%s %s %s/%s in %s", a.user, a.verb, g, a.resource, ns)
}

// TestRBACIsWhatVigilUses runs every Kubernetes call vigil run and the
// agent make, as the users vigil manifest rbac binds, against a real
// kube-apiserver with an audit log, and compares what the log shows with
// the rules: every call is allowed, and every rule is used.
func TestRBACIsWhatVigilUses(t *testing.T) {
	s := kubetest.StartWith(t, kubetest.Options{EtcdURL: etcdtest.Start(t, 1).Endpoints[0], Audit: true})
	admin := s.Client(t, kubetest.AdminToken)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s.WaitNamespace(t, "kube-node-lease")
	applyRBAC(ctx, t, admin)

	vigilKC, agentKC := s.Kubeconfig(t, kubetest.VigilToken), s.Kubeconfig(t, kubetest.AgentToken)
	vigilCS, err := kube.NewClient(vigilKC)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)

	// vigil run: the Lease election, until it leads, then a release.
	el, err := election.New(election.Config{Identity: "cp1", Lock: election.NewLeaseLock(vigilCS.CoordinationV1(), "kube-system", "vigil"),
		LeaseDuration: 2 * time.Second, RenewDeadline: 1500 * time.Millisecond, RetryPeriod: 200 * time.Millisecond, ReleaseOnCancel: true}, log)
	if err != nil {
		t.Fatal(err)
	}
	ectx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- el.Run(ectx) }()
	testkit.WaitFor(t, time.Minute, "vigil to lead on the Lease", func() bool { return el.Status().Leader })
	testkit.WaitFor(t, 10*time.Second, "renewals", func() bool {
		st := el.Status()
		return st.Seen.Sub(st.LeaderSince) >= 400*time.Millisecond // two retry periods
	})
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// Events on its Node.
	ev := kube.NewEvents(vigilCS, kube.NodeRef("cp1"), "cp1", log)
	ev.Emit(false, kube.ReasonBecameLeader, "cp1 became leader")
	ev.Close(10 * time.Second)
	// EndpointSlice discovery, for vigil run and for the agent.
	for _, kc := range []string{vigilKC, agentKC} {
		c, err := kube.HTTPClient(kc)
		if err != nil {
			t.Fatal(err)
		}
		a := kubelite.NewAPIServers(c, func([]string) {}, log)
		actx, stop := context.WithCancel(ctx)
		adone := make(chan struct{})
		go func() { defer close(adone); _ = a.Run(actx) }()
		if !a.WaitSynced(ctx) {
			t.Fatalf("EndpointSlices never listed with %s", kc)
		}
		// The watch after the list: RBAC's "watch" verb.
		testkit.WaitFor(t, 10*time.Second, "an EndpointSlice watch open with "+kc, a.Watching)
		stop()
		<-adone
	}
	// Deleting a pruned member's Node: the check, the node Lease, the
	// deletion of a dead one.
	node, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "cp3",
		Labels: map[string]string{manifest.ControlPlaneLabel: ""}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionUnknown}}
	if _, err := admin.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	old := metav1.NewMicroTime(time.Now().Add(-time.Hour))
	if _, err := admin.CoordinationV1().Leases(kube.NodeLeaseNamespace).Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "cp3"},
		Spec: coordinationv1.LeaseSpec{RenewTime: &old}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := kube.CheckCanDeleteNodes(ctx, vigilCS); err != nil {
		t.Fatal(err)
	}
	if _, found, err := kube.NodeLeaseRenewal(ctx, vigilCS, "cp3"); err != nil || !found {
		t.Fatalf("NodeLeaseRenewal = %v, %v", found, err)
	}
	if got, err := kube.DeleteDeadNode(ctx, vigilCS, "cp3"); err != nil || got != kube.NodeDeleted {
		t.Fatalf("DeleteDeadNode = %v, %v", got, err)
	}
	// A worker's Node: RBAC would let vigil delete it, the admission policy
	// does not; the administrator still may.
	if _, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: refusedNode}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The policy takes effect once the API server has loaded it.
	testkit.WaitNil(t, 30*time.Second, "vigil's deletion of a worker Node refused", func() error {
		err := vigilCS.CoreV1().Nodes().Delete(ctx, refusedNode, metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "only control-plane Nodes") {
			return fmt.Errorf("a dry-run deletion answered %v", err)
		}
		return nil
	})
	if err := vigilCS.CoreV1().Nodes().Delete(ctx, refusedNode, metav1.DeleteOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("vigil deleted worker Node %s: %v", refusedNode, err)
	}
	if err := admin.CoreV1().Nodes().Delete(ctx, refusedNode, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("the administrator could not delete worker Node %s: %v", refusedNode, err)
	}

	used, denied := audited(t, s.AuditLog)
	if len(denied) > 0 {
		t.Errorf("calls the rules do not allow: %v", denied)
	}
	for _, g := range granted(t) {
		if !slices.ContainsFunc(used, func(u access) bool { return covers(g, u) }) {
			t.Errorf("granted but never used: %s", g)
		}
	}
	if t.Failed() {
		t.Logf("used: %v", used)
	}
}

// covers tells whether grant g (namespace "" for cluster-wide) allows u.
func covers(g, u access) bool {
	return g.user == u.user && g.group == u.group && g.resource == u.resource && g.verb == u.verb && (g.namespace == "" || g.namespace == u.namespace)
}

// applyRBAC creates vigil manifest rbac's objects.
func applyRBAC(ctx context.Context, t *testing.T, cs kubernetes.Interface) {
	t.Helper()
	for _, o := range manifest.RBAC() {
		var err error
		switch o := o.(type) {
		case *corev1.ServiceAccount:
			_, err = cs.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.Role:
			_, err = cs.RbacV1().Roles(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.RoleBinding:
			_, err = cs.RbacV1().RoleBindings(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.ClusterRole:
			_, err = cs.RbacV1().ClusterRoles().Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.ClusterRoleBinding:
			_, err = cs.RbacV1().ClusterRoleBindings().Create(ctx, o, metav1.CreateOptions{})
		case *admissionregistrationv1.ValidatingAdmissionPolicy:
			_, err = cs.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, o, metav1.CreateOptions{})
		case *admissionregistrationv1.ValidatingAdmissionPolicyBinding:
			_, err = cs.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, o, metav1.CreateOptions{})
		default:
			t.Fatalf("vigil manifest rbac has a %T", o)
		}
		if err != nil {
			t.Fatalf("create %T: %v", o, err)
		}
	}
}

// granted lists what vigil manifest rbac grants the users vigil and
// vigil-agent.
func granted(t *testing.T) []access {
	t.Helper()
	roles := map[string][]rbacv1.PolicyRule{} // "Kind/namespace/name"
	for _, o := range manifest.RBAC() {
		switch o := o.(type) {
		case *rbacv1.Role:
			roles["Role/"+o.Namespace+"/"+o.Name] = o.Rules
		case *rbacv1.ClusterRole:
			roles["ClusterRole//"+o.Name] = o.Rules
		}
	}
	var out []access
	add := func(user, ns string, ref rbacv1.RoleRef) {
		key := ref.Kind + "/" + ns + "/" + ref.Name
		if ref.Kind == "ClusterRole" {
			key = "ClusterRole//" + ref.Name
		}
		for _, r := range roles[key] {
			for _, g := range r.APIGroups {
				for _, res := range r.Resources {
					for _, v := range r.Verbs {
						out = append(out, access{user, g, res, ns, v})
					}
				}
			}
		}
	}
	for _, o := range manifest.RBAC() {
		var subjects []rbacv1.Subject
		var ref rbacv1.RoleRef
		ns := ""
		switch o := o.(type) {
		case *rbacv1.RoleBinding:
			subjects, ref, ns = o.Subjects, o.RoleRef, o.Namespace
		case *rbacv1.ClusterRoleBinding:
			subjects, ref = o.Subjects, o.RoleRef
		default:
			continue
		}
		for _, s := range subjects {
			if s.Kind == rbacv1.UserKind {
				add(s.Name, ns, ref)
			}
		}
	}
	if len(out) == 0 {
		t.Fatal("vigil manifest rbac grants nothing")
	}
	return out
}

// audited reads the audit log: what the users vigil and vigil-agent did,
// and what was refused them. Access reviews are left out: every
// authenticated user may ask what it may do.
func audited(t *testing.T, path string) (used []access, denied []string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var e struct {
			Stage string
			Verb  string
			User  struct{ Username string }
			Obj   *struct {
				Resource, Namespace, APIGroup, Name string
			} `json:"objectRef"`
			ResponseStatus *struct{ Code int } `json:"responseStatus"`
		}
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("audit log: %v", err)
		}
		if (e.User.Username != "vigil" && e.User.Username != "vigil-agent") || e.Obj == nil || e.Obj.Resource == "selfsubjectaccessreviews" {
			continue
		}
		a := access{e.User.Username, e.Obj.APIGroup, e.Obj.Resource, e.Obj.Namespace, e.Verb}
		if e.ResponseStatus != nil && e.ResponseStatus.Code == 403 {
			if a.resource == "nodes" && e.Obj.Name == refusedNode {
				continue // refused on purpose, by the admission policy
			}
			denied = append(denied, a.String())
			continue
		}
		if !slices.Contains(used, a) {
			used = append(used, a)
		}
	}
	slices.SortFunc(used, func(a, b access) int { return strings.Compare(a.String(), b.String()) })
	return used, denied
}
