package election

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	coordclient "k8s.io/client-go/kubernetes/typed/coordination/v1"

	"github.com/vigil-ha/vigil"

	"github.com/vigil-ha/vigil/internal/clock"
)

// Kubernetes Lease defaults.
const (
	DefaultLeaseNamespace = "kube-system"
	DefaultLeaseName      = "vigil"
	// leaseMillisAnnotation keeps the lease duration in milliseconds: the
	// Lease's own leaseDurationSeconds cannot say 800 ms.
	leaseMillisAnnotation = "vigil.dev/lease-duration-ms"
	// instanceAnnotation and macAnnotation carry Record.Instance and
	// Record.MAC, which the Lease spec has no field for.
	instanceAnnotation = "vigil.dev/instance"
	macAnnotation      = "vigil.dev/mac"
	// tenureAnnotation carries Record.Tenure.
	tenureAnnotation = "vigil.dev/tenure"
	// formatAnnotation carries Record.Format (vigil.RecordFormat).
	formatAnnotation = "vigil.dev/format"
)

// ErrForbidden is returned when the API server refuses the Lease
// operations: the kubeconfig's user lacks the RBAC grants.
var ErrForbidden = errors.New("election: the API server forbids this user to use the Lease")

// LeaseLock is a Lock on a coordination.k8s.io/v1 Lease, changed only with
// the resourceVersion precondition (optimistic concurrency), exactly as
// client-go's leaderelection resourcelock.LeaseLock does. The object is the
// standard one: spec.holderIdentity, leaseDurationSeconds (rounded up),
// acquireTime, renewTime and leaseTransitions, readable with kubectl get
// lease; the exact duration in milliseconds is an annotation.
type LeaseLock struct {
	leases    coordclient.LeaseInterface
	namespace string
	name      string
}

// NewLeaseLock returns a lock on the Lease namespace/name.
func NewLeaseLock(leases coordclient.LeasesGetter, namespace, name string) *LeaseLock {
	return &LeaseLock{leases: leases.Leases(namespace), namespace: namespace, name: name}
}

// Describe names the lock for logs.
func (l *LeaseLock) Describe() string { return "lease " + l.namespace + "/" + l.name }

// Get reads the Lease (a quorum read: the API server reads etcd
// linearizably for a GET without a resourceVersion).
func (l *LeaseLock) Get(ctx context.Context) (Observation, error) {
	lease, err := l.leases.Get(ctx, l.name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return Observation{}, nil
	}
	if err != nil {
		return Observation{}, l.wrap("get", err)
	}
	return observeLease(lease)
}

// Write creates the Lease (rev 0) or updates it if its resourceVersion is
// still rev.
func (l *LeaseLock) Write(ctx context.Context, rec Record, rev int64) (Observation, error) {
	lease := l.toLease(rec)
	var out *coordinationv1.Lease
	var err error
	if rev == 0 {
		out, err = l.leases.Create(ctx, lease, metav1.CreateOptions{})
	} else {
		lease.ResourceVersion = strconv.FormatInt(rev, 10)
		out, err = l.leases.Update(ctx, lease, metav1.UpdateOptions{})
	}
	if apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) {
		obs, gerr := l.Get(ctx)
		if gerr != nil {
			return Observation{}, errors.Join(ErrConflict, gerr)
		}
		return obs, ErrConflict
	}
	if err != nil {
		return Observation{}, l.wrap("write", err)
	}
	return observeLease(out)
}

// Renew implements Renewer with a JSON patch whose first operations test
// that the Lease still carries rec's tenure and holder: the API server
// applies the patch to the object as it is at that moment (retrying its own
// update on a conflict), so the test is a compare-and-swap on the tenure,
// and renewals of one tenure may be under way at once.
func (l *LeaseLock) Renew(ctx context.Context, rec Record) (Observation, error) {
	if rec.Tenure == "" {
		return Observation{}, errors.New("election: a renewal needs the tenure of the lock it renews")
	}
	patch, err := json.Marshal([]map[string]any{
		{"op": "test", "path": "/metadata/annotations/" + jsonPointerEscape(tenureAnnotation), "value": rec.Tenure},
		{"op": "test", "path": "/spec/holderIdentity", "value": rec.Holder},
		{"op": "replace", "path": "/spec/renewTime", "value": metav1.NewMicroTime(rec.RenewTime)},
	})
	if err != nil {
		return Observation{}, err
	}
	out, err := l.leases.Patch(ctx, l.name, types.JSONPatchType, patch, metav1.PatchOptions{})
	if apierrors.IsInvalid(err) || apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		// A failed test (422), or the Lease is gone: somebody else wrote.
		obs, gerr := l.Get(ctx)
		switch {
		case gerr != nil:
			return Observation{}, errors.Join(ErrConflict, gerr)
		case obs.Record != nil && obs.Record.Tenure == rec.Tenure && obs.Record.Holder == rec.Holder:
			return Observation{}, l.wrap("renew", err) // still ours: the patch failed for another reason
		}
		return obs, ErrConflict
	}
	if err != nil {
		return Observation{}, l.wrap("renew", err)
	}
	return observeLease(out)
}

// CostlyWrites tells the elector to renew the Lease once a retry period,
// however slow the API server is: each renewal is a patch that the API
// server writes to etcd and sends to every watcher.
func (l *LeaseLock) CostlyWrites() bool { return true }

// jsonPointerEscape escapes a key for a JSON pointer (RFC 6901).
func jsonPointerEscape(s string) string {
	return strings.NewReplacer("~", "~0", "/", "~1").Replace(s)
}

// Watch sends an observation for every change of the Lease until ctx is
// done; a broken watch is re-established after a short pause.
func (l *LeaseLock) Watch(ctx context.Context, out chan<- Observation) {
	sel := fields.OneTermEqualSelector("metadata.name", l.name).String()
	for ctx.Err() == nil {
		w, err := l.leases.Watch(ctx, metav1.ListOptions{FieldSelector: sel})
		if err != nil {
			if !clock.Sleep(ctx, 500*time.Millisecond) {
				return
			}
			continue
		}
		for ev := range w.ResultChan() {
			lease, ok := ev.Object.(*coordinationv1.Lease)
			if !ok || (ev.Type != watch.Added && ev.Type != watch.Modified) {
				continue
			}
			obs, err := observeLease(lease)
			if err != nil {
				continue
			}
			select {
			case out <- obs:
			case <-ctx.Done():
				w.Stop()
				return
			}
		}
		w.Stop()
	}
}

func (l *LeaseLock) wrap(op string, err error) error {
	if apierrors.IsForbidden(err) {
		return fmt.Errorf("%w: %s lease %s/%s: %v (grant it with the Role from `vigil manifest rbac`)", ErrForbidden, op, l.namespace, l.name, err)
	}
	if apierrors.IsUnauthorized(err) {
		return fmt.Errorf("%s lease %s/%s: the API server does not accept the kubeconfig's credentials: %w", op, l.namespace, l.name, err)
	}
	return fmt.Errorf("%s lease %s/%s: %w", op, l.namespace, l.name, err)
}

func (l *LeaseLock) toLease(rec Record) *coordinationv1.Lease {
	secs := int32((rec.LeaseDurationMillis + 999) / 1000)
	holder := rec.Holder
	transitions := int32(rec.Transitions)
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{
			Name: l.name, Namespace: l.namespace,
			Annotations: map[string]string{
				leaseMillisAnnotation: strconv.FormatInt(rec.LeaseDurationMillis, 10),
				instanceAnnotation:    rec.Instance,
				macAnnotation:         rec.MAC,
				tenureAnnotation:      rec.Tenure,
				formatAnnotation:      strconv.Itoa(vigil.RecordFormat),
			},
		},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity:       &holder,
			LeaseDurationSeconds: &secs,
			LeaseTransitions:     &transitions,
		},
	}
	if !rec.AcquireTime.IsZero() {
		lease.Spec.AcquireTime = &metav1.MicroTime{Time: rec.AcquireTime}
	}
	if !rec.RenewTime.IsZero() {
		lease.Spec.RenewTime = &metav1.MicroTime{Time: rec.RenewTime}
	}
	return lease
}

// observeLease turns a Lease into an observation. A Lease written by
// another tool (no annotation) has its whole-second duration.
func observeLease(lease *coordinationv1.Lease) (Observation, error) {
	rev, err := strconv.ParseInt(lease.ResourceVersion, 10, 64)
	if err != nil {
		return Observation{}, fmt.Errorf("lease %s/%s: resourceVersion %q is not a number", lease.Namespace, lease.Name, lease.ResourceVersion)
	}
	rec := &Record{}
	sp := lease.Spec
	if sp.HolderIdentity != nil {
		rec.Holder = *sp.HolderIdentity
	}
	if ms, err := strconv.ParseInt(lease.Annotations[leaseMillisAnnotation], 10, 64); err == nil && ms > 0 {
		rec.LeaseDurationMillis = ms
	} else if sp.LeaseDurationSeconds != nil {
		rec.LeaseDurationMillis = int64(*sp.LeaseDurationSeconds) * 1000
	}
	rec.Instance = lease.Annotations[instanceAnnotation]
	rec.MAC = lease.Annotations[macAnnotation]
	rec.Tenure = lease.Annotations[tenureAnnotation]
	rec.Format, _ = strconv.Atoi(lease.Annotations[formatAnnotation]) // 0: vigil 0.3.0 or before, or another tool
	if sp.AcquireTime != nil {
		rec.AcquireTime = sp.AcquireTime.Time
	}
	if sp.RenewTime != nil {
		rec.RenewTime = sp.RenewTime.Time
	}
	if sp.LeaseTransitions != nil {
		rec.Transitions = int(*sp.LeaseTransitions)
	}
	return Observation{Record: rec, Revision: rev}, nil
}
