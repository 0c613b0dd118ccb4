package kube

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// Event reasons vigil records.
const (
	ReasonBecameLeader = "BecameLeader"
	ReasonSteppedDown  = "SteppedDown"
	ReasonNodeDeleted  = "DeadNodeDeleted"
	ReasonVIPConflict  = "VIPConflict"
	ReasonStrayVIP     = "StrayVIPRemoved"
	// ReasonLeaseAtRisk: the lock store answers renewals so late that the
	// lease is nearly spent when they land (a slow etcd or API server).
	ReasonLeaseAtRisk = "LeaseAtRisk"
	// ReasonEtcdImpostor: an etcd endpoint answered for another cluster
	// than the one vigil follows; its answers are refused.
	ReasonEtcdImpostor = "EtcdImpostor"
)

// eventTimeout bounds one Event write. Events are for people reading
// `kubectl get events` later; one that cannot be written in this time is
// dropped, not retried.
const eventTimeout = 5 * time.Second

// eventDelay is how long an Event waits before it is written: the Events
// report handovers, and their writes should not compete with the lock
// writes of the handover itself on the same API servers and etcd. (A
// graceful handover measured 29-50 ms either way; the spread between runs
// is the machine's, see bench/failover/README.md.)
const eventDelay = 250 * time.Millisecond

// eventQueue is how many Events may wait for the API server. Leadership
// changes are rare; a longer queue would only hold stale news.
const eventQueue = 16

// Events records Kubernetes Events about one object, in the background:
// Emit never blocks, and an API server that is down or forbids Events
// costs a log line, nothing else.
type Events struct {
	cs   kubernetes.Interface
	ref  corev1.ObjectReference
	host string
	log  *slog.Logger

	q      chan queued
	ctx    context.Context // cancelled when Close gives up waiting
	cancel context.CancelFunc
	stop   chan struct{}
	done   chan struct{}
	once   sync.Once

	mu     sync.Mutex // guards warned
	warned bool       // a failed write was logged at Warn since the last success
}

// queued is an Event and when it may be written.
type queued struct {
	ev *corev1.Event
	at time.Time
}

// LeaseRef and NodeRef name the objects vigil's Events are about: the
// election's Lease, or this node (with the etcd election).
func LeaseRef(namespace, name string) corev1.ObjectReference {
	return corev1.ObjectReference{APIVersion: "coordination.k8s.io/v1", Kind: "Lease", Namespace: namespace, Name: name}
}

func NodeRef(name string) corev1.ObjectReference {
	// As the kubelet refers to its node: no namespace (the Event itself
	// goes to "default") and the name as UID. `kubectl describe node`
	// looks for exactly this.
	return corev1.ObjectReference{APIVersion: "v1", Kind: "Node", Name: name, UID: types.UID(name)}
}

// NewEvents starts the writer; Close stops it.
func NewEvents(cs kubernetes.Interface, ref corev1.ObjectReference, host string, log *slog.Logger) *Events {
	e := &Events{cs: cs, ref: ref, host: host, log: log.With("component", "events"),
		q: make(chan queued, eventQueue), stop: make(chan struct{}), done: make(chan struct{})}
	e.ctx, e.cancel = context.WithCancel(context.Background())
	go e.run()
	return e
}

// Emit queues an Event of type Normal (or Warning).
func (e *Events) Emit(warning bool, reason, format string, args ...any) {
	now := metav1.Now()
	typ := corev1.EventTypeNormal
	if warning {
		typ = corev1.EventTypeWarning
	}
	ns := e.ref.Namespace
	if ns == "" {
		ns = metav1.NamespaceDefault
	}
	ev := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{
			Name:      fmt.Sprintf("%s.%x", e.ref.Name, now.UnixNano()),
			Namespace: ns,
		},
		InvolvedObject:      e.ref,
		Reason:              reason,
		Message:             fmt.Sprintf(format, args...),
		Type:                typ,
		Source:              corev1.EventSource{Component: "vigil", Host: e.host},
		ReportingController: "vigil.dev/vigil",
		ReportingInstance:   e.host,
		FirstTimestamp:      now,
		LastTimestamp:       now,
		Count:               1,
	}
	select {
	case e.q <- queued{ev: ev, at: time.Now().Add(eventDelay)}:
	default:
		e.log.Debug("event queue full; dropping", "reason", reason)
	}
}

// Close writes what is queued, for at most timeout, then abandons the
// rest and returns once the writer has stopped. Safe to call twice.
func (e *Events) Close(timeout time.Duration) {
	e.once.Do(func() {
		close(e.stop)
		select {
		case <-e.done:
		case <-time.After(timeout):
		}
		e.cancel()
		<-e.done
	})
}

func (e *Events) run() {
	defer close(e.done)
	for {
		select {
		case q := <-e.q:
			e.writeAt(q)
		case <-e.stop:
			for {
				select {
				case q := <-e.q:
					e.writeAt(q)
				default:
					return
				}
			}
		}
	}
}

// writeAt writes q once its delay is over, even while stopping (a stopping
// vigil is in the middle of a handover); Close's timeout cuts the wait.
func (e *Events) writeAt(q queued) {
	select {
	case <-time.After(time.Until(q.at)):
	case <-e.ctx.Done():
		return
	}
	e.write(q.ev)
}

func (e *Events) write(ev *corev1.Event) {
	if e.ctx.Err() != nil {
		return
	}
	ctx, cancel := context.WithTimeout(e.ctx, eventTimeout)
	defer cancel()
	if ev.InvolvedObject.Kind == "Lease" && ev.InvolvedObject.UID == "" {
		// `kubectl describe lease` matches Events by the Lease's UID,
		// which changes if the Lease is ever recreated: look it up.
		// Without it the Event is still listed by `kubectl get events`.
		if l, err := e.cs.CoordinationV1().Leases(ev.InvolvedObject.Namespace).Get(ctx, ev.InvolvedObject.Name, metav1.GetOptions{}); err == nil {
			ev.InvolvedObject.UID = l.UID
		}
	}
	_, err := e.cs.CoreV1().Events(ev.Namespace).Create(ctx, ev, metav1.CreateOptions{})
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case err != nil && !e.warned:
		e.warned = true
		e.log.Warn("cannot record a Kubernetes Event (is `vigil manifest rbac` applied?)", "reason", ev.Reason, "err", err)
	case err != nil:
		e.log.Debug("cannot record a Kubernetes Event", "reason", ev.Reason, "err", err)
	default:
		e.warned = false
	}
}
