package kube

import (
	"context"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// The Service every kube-apiserver publishes itself in. Each API server
// keeps a lease on its own address (--endpoint-reconciler-type=lease, the
// default) and rewrites the Service's EndpointSlice to the addresses whose
// lease is live; a dead API server drops out when its lease runs out
// (15 s).
const (
	APIServerNamespace = metav1.NamespaceDefault
	APIServerService   = "kubernetes"
	apiServerPortName  = "https"
)

// APIServers follows the API servers published in the kubernetes
// Service's EndpointSlices, through a watch.
type APIServers struct {
	inf      cache.SharedIndexInformer
	onChange func([]string)
	log      *slog.Logger

	mu      sync.Mutex // guards cur, synced and failing
	cur     []string
	synced  bool
	failing bool
}

// NewAPIServers returns a follower; nothing is read before Run. onChange
// (may be nil) gets each new set, sorted, from the watch's goroutine.
func NewAPIServers(cs kubernetes.Interface, onChange func([]string), log *slog.Logger) *APIServers {
	// One informer of one type: client-go's informers package would link
	// every API group's informer into the binary.
	client := cs.DiscoveryV1().EndpointSlices(APIServerNamespace)
	selector := discoveryv1.LabelServiceName + "=" + APIServerService
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = selector
			return client.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = selector
			return client.Watch(ctx, o)
		},
	}
	a := &APIServers{
		inf:      cache.NewSharedIndexInformer(listThenWatch{lw}, &discoveryv1.EndpointSlice{}, 0, cache.Indexers{}),
		onChange: onChange,
		log:      log.With("component", "endpointslices"),
	}
	update := func(any) { a.update() }
	_, _ = a.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    update,
		UpdateFunc: func(_, o any) { update(o) },
		DeleteFunc: update,
	})
	_ = a.inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
		a.mu.Lock()
		first := !a.failing
		a.failing = true
		a.mu.Unlock()
		switch {
		case first && apierrors.IsForbidden(err):
			a.log.Warn("not allowed to read EndpointSlices (apply `vigil manifest rbac`); keeping the last API servers", "err", err)
		case first:
			a.log.Warn("cannot follow the kubernetes Service's EndpointSlices; keeping the last API servers", "err", err)
		default:
			a.log.Debug("EndpointSlice watch failed again", "err", err)
		}
	})
	return a
}

// listThenWatch opts out of client-go's streaming "watch-list" mode. In that
// mode (client-go 0.37) a failed attempt waits out its backoff without
// looking at the context: with the API server down, a stopping vigil hung
// for seconds. A list of one small EndpointSlice costs nothing.
type listThenWatch struct{ *cache.ListWatch }

func (listThenWatch) IsWatchListSemanticsUnSupported() bool { return true }

// Run follows the EndpointSlices until ctx is cancelled; the watch is
// re-established with backoff after any failure.
func (a *APIServers) Run(ctx context.Context) error {
	done := make(chan struct{})
	go func() { defer close(done); a.inf.RunWithContext(ctx) }()
	// The first list may be empty, which calls no handler: publish it.
	if cache.WaitForCacheSync(ctx.Done(), a.inf.HasSynced) {
		a.update()
	}
	<-done
	return nil
}

// Backends returns the current set, and whether the slices were read at
// least once.
func (a *APIServers) Backends() ([]string, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.cur), a.synced
}

// WaitSynced waits until the slices were read once, or ctx is done.
func (a *APIServers) WaitSynced(ctx context.Context) bool {
	for {
		if _, ok := a.Backends(); ok {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// update recomputes the set from the informer's store. Before the first
// full list is in, the store may hold part of it: nothing is published.
func (a *APIServers) update() {
	if !a.inf.HasSynced() {
		return
	}
	var list []*discoveryv1.EndpointSlice
	for _, o := range a.inf.GetStore().List() {
		if s, ok := o.(*discoveryv1.EndpointSlice); ok {
			list = append(list, s)
		}
	}
	b := FromEndpointSlices(list)
	a.mu.Lock()
	recovered := a.failing
	a.failing = false
	changed := !a.synced || !slices.Equal(b, a.cur)
	a.cur, a.synced = b, true
	a.mu.Unlock()
	if recovered {
		a.log.Info("following the kubernetes Service's EndpointSlices again")
	}
	if changed {
		a.log.Info("API servers published in the kubernetes Service", "backends", b)
		if a.onChange != nil {
			a.onChange(slices.Clone(b))
		}
	}
}

// FromEndpointSlices returns host:port of every ready endpoint, with the
// slice's "https" port (or its only port), sorted and without repeats.
// Endpoints not ready (an API server shutting down) are left out.
func FromEndpointSlices(list []*discoveryv1.EndpointSlice) []string {
	var out []string
	for _, s := range list {
		if s.AddressType != discoveryv1.AddressTypeIPv4 && s.AddressType != discoveryv1.AddressTypeIPv6 {
			continue
		}
		port := slicePort(s)
		if port == 0 {
			continue
		}
		for _, ep := range s.Endpoints {
			if ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
				continue
			}
			for _, addr := range ep.Addresses {
				out = append(out, net.JoinHostPort(addr, strconv.Itoa(int(port))))
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func slicePort(s *discoveryv1.EndpointSlice) int32 {
	var only int32
	for _, p := range s.Ports {
		if p.Port == nil {
			continue
		}
		if p.Name != nil && *p.Name == apiServerPortName {
			return *p.Port
		}
		only = *p.Port
	}
	if len(s.Ports) == 1 {
		return only
	}
	return 0
}
