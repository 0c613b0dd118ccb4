package kubelite

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"time"
)

// The Service every kube-apiserver publishes itself in. Each API server
// keeps a lease on its own address (--endpoint-reconciler-type=lease, the
// default) and rewrites the Service's EndpointSlice to the addresses whose
// lease is live; a dead API server drops out when its lease runs out
// (15 s).
const (
	APIServerNamespace = "default"
	APIServerService   = "kubernetes"
	apiServerPortName  = "https"
	serviceNameLabel   = "kubernetes.io/service-name"
)

// EndpointSlice is the part of a discovery.k8s.io/v1 EndpointSlice that
// says where API servers are.
type EndpointSlice struct {
	Metadata struct {
		Name            string `json:"name"`
		ResourceVersion string `json:"resourceVersion"`
	} `json:"metadata"`
	AddressType string     `json:"addressType"`
	Endpoints   []Endpoint `json:"endpoints"`
	Ports       []Port     `json:"ports"`
}

// Endpoint is one endpoint of an EndpointSlice.
type Endpoint struct {
	Addresses  []string `json:"addresses"`
	Conditions struct {
		Ready *bool `json:"ready"`
	} `json:"conditions"`
}

// Port is one port of an EndpointSlice.
type Port struct {
	Name *string `json:"name"`
	Port *int32  `json:"port"`
}

// FromEndpointSlices returns host:port of every ready endpoint, with the
// slice's "https" port (or its only port), sorted and without repeats.
// Endpoints not ready (an API server shutting down) are left out.
func FromEndpointSlices(list []EndpointSlice) []string {
	var out []string
	for _, s := range list {
		if s.AddressType != "IPv4" && s.AddressType != "IPv6" {
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

func slicePort(s EndpointSlice) int32 {
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

// Backoff after a failed list or watch: doubling from retryMin to
// retryMax, with jitter, so that N agents do not come back in step after
// an API server outage.
const (
	retryMin = 500 * time.Millisecond
	retryMax = 10 * time.Second
	// listTimeout bounds one list; a watch runs for watchSeconds (plus up
	// to a quarter more, spread) and is then started again from where it
	// was.
	listTimeout  = 10 * time.Second
	watchSeconds = 300
)

// APIServers follows the API servers published in the kubernetes
// Service's EndpointSlices: a list, then a watch from its resourceVersion,
// listed again when the watch is gone (410) or fails.
type APIServers struct {
	c        *Client
	base     string // the EndpointSlice collection's URL
	onChange func([]string)
	log      *slog.Logger

	mu       sync.Mutex // guards cur, synced, failing and watching
	cur      []string
	synced   bool
	failing  bool
	watching bool // a watch is open
}

// NewAPIServers returns a follower; nothing is read before Run. onChange
// (may be nil) gets each new set, sorted, from Run's goroutine.
func NewAPIServers(c *Client, onChange func([]string), log *slog.Logger) *APIServers {
	return &APIServers{
		c:        c,
		base:     c.Server + "/apis/discovery.k8s.io/v1/namespaces/" + APIServerNamespace + "/endpointslices",
		onChange: onChange,
		log:      log.With("component", "endpointslices"),
	}
}

// errGone: the watch's resourceVersion is too old; list again.
var errGone = errors.New("watch expired (410 Gone)")

// errForbidden: the user may not read EndpointSlices.
var errForbidden = errors.New("forbidden")

// Run follows the EndpointSlices until ctx is cancelled.
func (a *APIServers) Run(ctx context.Context) error {
	wait := retryMin
	for ctx.Err() == nil {
		store, rv, err := a.list(ctx)
		if err == nil {
			a.update(store)
			err = a.watch(ctx, store, rv, func() { wait = retryMin; a.setWatching(true) })
			a.setWatching(false)
		}
		if ctx.Err() != nil {
			return nil
		}
		if err != nil && !errors.Is(err, errGone) {
			a.failed(err)
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(wait/2 + rand.N(wait/2+1)):
			}
			wait = min(2*wait, retryMax)
		}
	}
	return nil
}

// Backends returns the current set, and whether the slices were read at
// least once.
func (a *APIServers) Backends() ([]string, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.cur), a.synced
}

// Watching says whether a watch is open: the slices were listed, and the
// server accepted the watch that follows them (RBAC's "watch" verb).
func (a *APIServers) Watching() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.watching
}

func (a *APIServers) setWatching(on bool) {
	a.mu.Lock()
	a.watching = on
	a.mu.Unlock()
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

func (a *APIServers) query(extra url.Values) string {
	q := url.Values{"labelSelector": {serviceNameLabel + "=" + APIServerService}}
	for k, v := range extra {
		q[k] = v
	}
	return a.base + "?" + q.Encode()
}

func (a *APIServers) get(ctx context.Context, u string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "vigil")
	resp, err := a.c.HTTP.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode == http.StatusOK {
		return resp, nil
	}
	defer resp.Body.Close()
	return nil, statusError(resp)
}

// statusError turns an API server's error answer (a Status object) into an
// error.
func statusError(resp *http.Response) error {
	var st struct {
		Message string `json:"message"`
		Code    int    `json:"code"`
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	_ = json.Unmarshal(b, &st)
	if st.Message == "" {
		st.Message = http.StatusText(resp.StatusCode)
	}
	switch resp.StatusCode {
	case http.StatusForbidden:
		return fmt.Errorf("%w: %s", errForbidden, st.Message)
	case http.StatusGone:
		return errGone
	}
	return fmt.Errorf("HTTP %d: %s", resp.StatusCode, st.Message)
}

func (a *APIServers) list(ctx context.Context) (map[string]EndpointSlice, string, error) {
	lctx, cancel := context.WithTimeout(ctx, listTimeout)
	defer cancel()
	resp, err := a.get(lctx, a.query(nil))
	if err != nil {
		return nil, "", fmt.Errorf("list EndpointSlices: %w", err)
	}
	defer resp.Body.Close()
	var l struct {
		Metadata struct {
			ResourceVersion string `json:"resourceVersion"`
		} `json:"metadata"`
		Items []EndpointSlice `json:"items"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&l); err != nil {
		return nil, "", fmt.Errorf("list EndpointSlices: %w", err)
	}
	m := make(map[string]EndpointSlice, len(l.Items))
	for _, s := range l.Items {
		m[s.Metadata.Name] = s
	}
	return m, l.Metadata.ResourceVersion, nil
}

// watch applies the watch's events to store until it ends. It returns nil
// when the server ended it (timeoutSeconds) and another one was started;
// an error otherwise. healthy is called once the watch is open.
func (a *APIServers) watch(ctx context.Context, store map[string]EndpointSlice, rv string, healthy func()) error {
	for {
		secs := watchSeconds + rand.N(watchSeconds/4)
		resp, err := a.get(ctx, a.query(url.Values{
			"watch":               {"1"},
			"resourceVersion":     {rv},
			"allowWatchBookmarks": {"true"},
			"timeoutSeconds":      {strconv.Itoa(secs)},
		}))
		if err != nil {
			return fmt.Errorf("watch EndpointSlices: %w", err)
		}
		healthy()
		rv, err = a.events(resp.Body, store, rv)
		resp.Body.Close()
		if err != nil {
			return err
		}
	}
}

// events reads one watch stream to its end and returns the last
// resourceVersion seen.
func (a *APIServers) events(body io.Reader, store map[string]EndpointSlice, rv string) (string, error) {
	dec := json.NewDecoder(body)
	for {
		var ev struct {
			Type   string          `json:"type"`
			Object json.RawMessage `json:"object"`
		}
		if err := dec.Decode(&ev); err != nil {
			if errors.Is(err, io.EOF) {
				return rv, nil // the server's timeoutSeconds: watch again
			}
			return rv, fmt.Errorf("watch EndpointSlices: %w", err)
		}
		if ev.Type == "ERROR" {
			var st struct {
				Code    int    `json:"code"`
				Message string `json:"message"`
			}
			_ = json.Unmarshal(ev.Object, &st)
			if st.Code == http.StatusGone {
				return rv, errGone
			}
			return rv, fmt.Errorf("watch EndpointSlices: %d %s", st.Code, st.Message)
		}
		var s EndpointSlice
		if err := json.Unmarshal(ev.Object, &s); err != nil {
			return rv, fmt.Errorf("watch EndpointSlices: %s event: %w", ev.Type, err)
		}
		if s.Metadata.ResourceVersion != "" {
			rv = s.Metadata.ResourceVersion
		}
		switch ev.Type {
		case "ADDED", "MODIFIED":
			store[s.Metadata.Name] = s
		case "DELETED":
			delete(store, s.Metadata.Name)
		default: // BOOKMARK: only the resourceVersion
			continue
		}
		a.update(store)
	}
}

func (a *APIServers) failed(err error) {
	a.mu.Lock()
	first := !a.failing
	a.failing = true
	a.mu.Unlock()
	switch {
	case first && errors.Is(err, errForbidden):
		a.log.Warn("not allowed to read EndpointSlices (apply `vigil manifest rbac`); keeping the last API servers", "err", err)
	case first:
		a.log.Warn("cannot follow the kubernetes Service's EndpointSlices; keeping the last API servers", "err", err)
	default:
		a.log.Debug("EndpointSlice watch failed again", "err", err)
	}
}

// update publishes the set the slices make, if it changed.
func (a *APIServers) update(store map[string]EndpointSlice) {
	b := FromEndpointSlices(slices.Collect(maps.Values(store)))
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
