package lab

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/netip"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/vigil-ha/vigil/internal/clock"
	"github.com/vigil-ha/vigil/internal/netns"
)

// API server drills: the VIP holder's own API server fails while its node
// and vigil stay up. Health-aware placement must move the VIP to a peer, and
// the load balancer must keep clients' requests succeeding.
const (
	DrillAPIServerDown = "apiserver-down" // the holder's API server stops listening
	DrillAPIServerSlow = "apiserver-slow" // the holder's API server answers after 3 s
)

// defaultHealthGrace mirrors vigil's --health-grace default, for the bound
// the drill checks when the lab does not set one.
const defaultHealthGrace = 2 * time.Second

// requestInterval paces the HTTPS client; each request opens a new
// connection through the VIP, as a client reconnecting would.
const requestInterval = 20 * time.Millisecond

// request is one HTTPS request through the VIP.
type request struct {
	start, end time.Time
	node       string // which API server answered
	err        string
	// reached, for a request that failed: the API server it reached
	// through the VIP, when the TLS handshake with that server completed
	// and the request was written: vigil had delivered it to a live
	// server, which did not answer in time.
	reached string
}

// httpsProber sends GET /version through VIP:port from the client namespace.
type httpsProber struct {
	client *http.Client
	url    string
	stop   chan struct{}
	wg     sync.WaitGroup
	// servers names the API servers by the addresses in their serving
	// certificates, so that a failed request says which server it reached.
	servers map[netip.Addr]string

	mu   sync.Mutex // guards reqs
	reqs []request
}

// startHTTPSProber starts the requests; each fails if no answer came
// within timeout.
func (l *Lab) startHTTPSProber(port int, timeout time.Duration) (*httpsProber, error) {
	tr, err := l.vipTransport()
	if err != nil {
		return nil, err
	}
	p := &httpsProber{
		client:  &http.Client{Timeout: timeout, Transport: tr},
		url:     vipURL(port, "/version"),
		stop:    make(chan struct{}),
		servers: map[netip.Addr]string{},
	}
	for _, n := range l.st.Nodes {
		p.servers[n.IP] = n.Name
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		t := time.NewTicker(requestInterval)
		defer t.Stop()
		for {
			p.once()
			select {
			case <-p.stop:
				return
			case <-t.C:
			}
		}
	}()
	return p, nil
}

func (p *httpsProber) once() {
	r := request{start: time.Now()}
	tr := &requestTrace{start: r.start, servers: p.servers}
	req, err := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), tr.hooks()), http.MethodGet, p.url, nil)
	if err != nil {
		panic(err) // a constant URL
	}
	resp, err := p.client.Do(req)
	if err != nil {
		// How far the request got: a timeout alone does not say whether
		// the connection, the handshake or the server was slow, nor which
		// server the load balancer chose.
		err = fmt.Errorf("%w [%s]", err, tr.String())
		r.reached = tr.reachedServer()
	}
	if err == nil {
		var v struct{ Node string }
		err = json.NewDecoder(io.LimitReader(resp.Body, 4096)).Decode(&v)
		resp.Body.Close()
		if err == nil && resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("HTTP %d", resp.StatusCode)
		}
		r.node = v.Node
	}
	if err != nil {
		r.err = err.Error()
	}
	r.end = time.Now()
	p.mu.Lock()
	p.reqs = append(p.reqs, r)
	p.mu.Unlock()
}

// requestTrace records how far one request through the VIP got, and which
// API server it reached, for the message of a request that fails.
type requestTrace struct {
	start   time.Time
	servers map[netip.Addr]string

	mu                          sync.Mutex
	connected, handshaken, sent time.Duration // 0: not reached
	server                      string
}

func (t *requestTrace) hooks() *httptrace.ClientTrace {
	at := func(d *time.Duration) {
		t.mu.Lock()
		*d = time.Since(t.start)
		t.mu.Unlock()
	}
	return &httptrace.ClientTrace{
		ConnectDone: func(_, _ string, err error) {
			if err == nil {
				at(&t.connected)
			}
		},
		TLSHandshakeDone: func(cs tls.ConnectionState, err error) {
			if err != nil {
				return
			}
			at(&t.handshaken)
			if len(cs.PeerCertificates) == 0 {
				return
			}
			t.mu.Lock()
			defer t.mu.Unlock()
			// The node's own address, among the certificate's (the VIP's,
			// the Service's): a name for the lab's first nodes, the address
			// for a machine added since.
			for _, ip := range cs.PeerCertificates[0].IPAddresses {
				a, ok := netip.AddrFromSlice(ip)
				if !ok || a.Unmap() == VIP.Addr() || !VIP.Masked().Contains(a.Unmap()) {
					continue
				}
				if name, ok := t.servers[a.Unmap()]; ok {
					t.server = name
				} else {
					t.server = a.Unmap().String()
				}
			}
		},
		WroteRequest: func(i httptrace.WroteRequestInfo) {
			if i.Err == nil {
				at(&t.sent)
			}
		},
	}
}

// reachedServer is the server the request was written to after a
// completed TLS handshake, or "".
func (t *requestTrace) reachedServer() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.handshaken == 0 || t.sent == 0 {
		return ""
	}
	return t.server
}

// String tells how far the request got, e.g. "connected 1ms, TLS 9ms
// (server n2), request sent 9ms, no reply".
func (t *requestTrace) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	ms := func(d time.Duration) string { return d.Round(time.Millisecond).String() }
	if t.connected == 0 {
		return "no TCP connection"
	}
	s := "connected " + ms(t.connected)
	if t.handshaken == 0 {
		return s + ", no TLS handshake"
	}
	s += ", TLS " + ms(t.handshaken)
	if t.server != "" {
		s += " (server " + t.server + ")"
	}
	if t.sent == 0 {
		return s + ", request not sent"
	}
	return s + ", request sent " + ms(t.sent)
}

// close stops the prober and returns every request. Safe to call twice.
func (p *httpsProber) close() []request {
	select {
	case <-p.stop:
	default:
		close(p.stop)
	}
	p.wg.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]request(nil), p.reqs...)
}

// APIResult adds what an API server drill measures to Result.
type APIResult struct {
	// MovedAfterMillis is the time from the fault until the VIP left the
	// faulty node; the bound is the health grace + 1 s.
	MovedAfterMillis float64 `json:"movedAfterMillis"`
	BoundMillis      float64 `json:"boundMillis"`
	Requests         int     `json:"requests"`
	// FailedInWindow are failed requests that overlapped the time from the
	// fault to one second after the VIP moved: requests in flight on the
	// failing API server, and connections reset by the move.
	FailedInWindow int `json:"failedInWindow"`
	// FailedOutside must be 0.
	FailedOutside int `json:"failedOutside"`
	// LongestFailureMillis is the longest time without a successful
	// request.
	LongestFailureMillis float64  `json:"longestFailureMillis"`
	ServedBy             []string `json:"servedBy"`
	FirstErrors          []string `json:"firstErrors,omitempty"`
}

// apiDrill runs an API server drill and heals the lab afterwards.
func (l *Lab) apiDrill(ctx context.Context, kind string, r *Result) error {
	s := l.st.Settings
	if s.Impl != ImplVigil {
		return fmt.Errorf("drill %s needs vigil's health checks; the %s lab has none", kind, s.Impl)
	}
	if s.LBPort == 0 || (s.BackendPort != 0 && s.BackendPort != APIServerPort) {
		return fmt.Errorf("drill %s needs the lab's load balancer in front of the stand-in API servers (vigil-lab up --lb-port 6443 --backend-port 6443)", kind)
	}
	grace := s.HealthGrace
	if grace == 0 {
		grace = defaultHealthGrace
	}
	holder, err := l.waitStable(ctx, recoverTimeout)
	if err != nil {
		return fmt.Errorf("lab not stable before the drill: %w", err)
	}
	if err := l.waitBackendsUp(ctx, holder, len(l.st.Nodes), recoverTimeout); err != nil {
		return err
	}
	d, err := l.newDrillRun()
	if err != nil {
		return err
	}
	defer d.w.close()
	if d.target, err = l.node(holder); err != nil {
		return err
	}
	r.Target, r.Before = holder, holder
	mon := startMonitor(d.w, d.live, probeInterval)
	defer mon.close()
	pr, err := l.startHTTPSProber(s.LBPort, 2*time.Second)
	if err != nil {
		return err
	}
	defer pr.close()
	if !clock.Sleep(ctx, 500*time.Millisecond) { // baseline
		return ctx.Err()
	}

	mode := ModeDown
	if kind == DrillAPIServerSlow {
		mode = ModeSlow
	}
	fault := time.Now()
	if err := l.SetAPIServerMode(ctx, holder, mode); err != nil {
		return err
	}
	healed := false
	heal := func() error {
		if healed {
			return nil
		}
		healed = true
		return l.SetAPIServerMode(context.Background(), holder, ModeOK)
	}
	defer func() { _ = heal() }()

	moved, err := waitVIPElsewhere(ctx, d.w, holder, d.live, recoverTimeout)
	if err != nil {
		return err
	}
	after, err := l.waitStable(ctx, recoverTimeout)
	if err != nil {
		return fmt.Errorf("no single holder after the VIP left %s: %w", holder, err)
	}
	r.After = after
	if !clock.Sleep(ctx, 2*time.Second) { // requests after the move
		return ctx.Err()
	}
	if err := heal(); err != nil {
		return err
	}
	if err := l.waitBackendsUp(ctx, after, len(l.st.Nodes), recoverTimeout); err != nil {
		return err
	}
	if !clock.Sleep(ctx, 2*time.Second) { // requests after the heal
		return ctx.Err()
	}
	reqs := pr.close()
	doubles := mon.close()
	final, err := r.judgeHolders(doubles, d.w, d.live())
	if err != nil {
		return err
	}

	a := &APIResult{MovedAfterMillis: millis(moved.Sub(fault)), BoundMillis: millis(grace + time.Second), Requests: len(reqs)}
	windowEnd := moved.Add(time.Second)
	served := map[string]bool{}
	lastOK := fault
	for _, q := range reqs {
		if q.err == "" {
			if q.end.After(fault) {
				a.LongestFailureMillis = max(a.LongestFailureMillis, millis(q.end.Sub(lastOK)))
				lastOK = q.end
			}
			served[q.node] = true
			continue
		}
		if len(a.FirstErrors) < 3 {
			a.FirstErrors = append(a.FirstErrors, fmt.Sprintf("+%dms %s", q.start.Sub(fault).Milliseconds(), q.err))
		}
		// In the window: the request overlapped the time from the fault to
		// a second after the VIP moved.
		if q.end.After(fault) && q.start.Before(windowEnd) {
			a.FailedInWindow++
		} else {
			a.FailedOutside++
		}
	}
	for _, n := range l.st.Nodes {
		if served[n.Name] {
			a.ServedBy = append(a.ServedBy, n.Name)
		}
	}
	r.API = a
	r.OutageMillis = a.LongestFailureMillis
	var errs []error
	if moved.Sub(fault) > grace+time.Second {
		errs = append(errs, fmt.Errorf("the VIP left %s after %v, more than the health grace %v + 1s", holder, moved.Sub(fault).Round(time.Millisecond), grace))
	}
	if a.FailedOutside > 0 {
		errs = append(errs, fmt.Errorf("%d requests failed outside the failover window", a.FailedOutside))
	}
	if len(final) != 1 {
		errs = append(errs, fmt.Errorf("after the heal the VIP is on %v", final))
	}
	return errors.Join(errs...)
}

// judgeHolders records in r what the monitor saw (samples with two holders
// are a split brain) and who holds the VIP now among live nodes, which it
// returns.
func (r *Result) judgeHolders(doubles []doubleHold, w *vipWatch, live []*Node) ([]string, error) {
	r.SplitBrain = len(doubles) > 0
	if r.SplitBrain {
		r.SplitDetail = fmt.Sprintf("%d samples with two holders, first %v", len(doubles), doubles[0].holders)
	}
	final, err := w.holders(live)
	if err != nil {
		return nil, err
	}
	r.HoldersAfterHeal = final
	return final, nil
}

// waitVIPElsewhere returns when another node than node holds the VIP, and
// node does not: a move, not a gap. A holder whose renewals run late (a
// loaded machine) steps down, and may take the lock back at once, since its
// own record still names it, before its placement makes it yield: the VIP
// leaves and returns to the same node, which is no move away from a failing
// API server.
func waitVIPElsewhere(ctx context.Context, w *vipWatch, node string, nodes func() []*Node, d time.Duration) (time.Time, error) {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if has, err := w.has(node); err == nil && !has {
			hs, err := w.holders(nodes())
			if err == nil && len(hs) > 0 && !slices.Contains(hs, node) {
				return time.Now(), nil
			}
		}
		if !clock.Sleep(ctx, time.Millisecond) {
			return time.Time{}, ctx.Err()
		}
	}
	return time.Time{}, fmt.Errorf("the VIP did not move from %s to another node within %v", node, d)
}

// waitVIPGone returns when node no longer has the VIP, polled every
// millisecond so the time it returns measures the removal closely.
func waitVIPGone(ctx context.Context, w *vipWatch, node string, d time.Duration) (time.Time, error) {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		has, err := w.has(node)
		if err == nil && !has {
			return time.Now(), nil
		}
		if !clock.Sleep(ctx, time.Millisecond) {
			return time.Time{}, ctx.Err()
		}
	}
	return time.Time{}, fmt.Errorf("the VIP did not leave %s within %v", node, d)
}

// waitBackendsUp waits until vigil on node reports n backends up (its
// /status, read inside the node's namespace).
func (l *Lab) waitBackendsUp(ctx context.Context, node string, n int, d time.Duration) error {
	deadline := time.Now().Add(d)
	var last string
	for time.Now().Before(deadline) {
		rep, err := l.vigilStatus(ctx, node)
		if err == nil {
			up := 0
			for _, b := range rep.Backends {
				if b.State == "up" {
					up++
				}
			}
			if up == n {
				return nil
			}
			last = fmt.Sprintf("%d of %d backends up", up, n)
		} else {
			last = err.Error()
		}
		if !clock.Sleep(ctx, 50*time.Millisecond) {
			return ctx.Err()
		}
	}
	return fmt.Errorf("lab: vigil on %s: %s after %v", node, last, d)
}

// vigilReport is the part of vigil's /status the lab reads.
type vigilReport struct {
	Leader bool `json:"leader"`
	// Holder is the VIP holder this vigil's elector sees: "" until it
	// runs, which is after it has claimed its node name.
	Holder   string `json:"holder"`
	Yielding bool   `json:"yielding"`
	// DNAT are the nftables rules that send VIP:--lb-port to
	// --lb-listen-port on this node (the holder's, with that flag).
	DNAT []string `json:"dnat"`
	// Renewal is how close the leader's renewals run to its deadline.
	Renewal *struct {
		MinMarginMillis float64 `json:"minMarginMillis"`
	} `json:"renewal"`
	Backends []struct {
		Address string `json:"address"`
		State   string `json:"state"`
	} `json:"backends"`
	// Etcd is the etcd cluster followed, and the endpoints refused.
	Etcd *struct {
		ClusterID string `json:"clusterID"`
		Foreign   []struct {
			Endpoint string `json:"endpoint"`
		} `json:"foreign"`
	} `json:"etcd"`
}

// vigilStatus reads vigil's /status on node (metrics address 127.0.0.1:9558
// inside the node's namespace).
func (l *Lab) vigilStatus(ctx context.Context, node string) (vigilReport, error) {
	var rep vigilReport
	return rep, getJSON(ctx, nodeNS(node), "http://127.0.0.1:9558/status", &rep)
}

// waitCandidates waits until every node's vigil campaigns or holds: its
// /status names a holder, which its elector does once it runs.
func (l *Lab) waitCandidates(ctx context.Context, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		var waiting []string
		for _, n := range l.st.Nodes {
			if rep, err := l.vigilStatus(ctx, n.Name); err != nil || rep.Holder == "" {
				waiting = append(waiting, n.Name)
			}
		}
		if len(waiting) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("lab: vigil on %v does not see a VIP holder after %v (not campaigning yet)", waiting, d)
		}
		if !clock.Sleep(ctx, 200*time.Millisecond) {
			return ctx.Err()
		}
	}
}

// vipTransport is an HTTPS transport for the client namespace that trusts
// the lab's CA, verifies the VIP as the server's name, and opens a new
// connection for every request, as a client reconnecting would. Each step
// is bounded by 5 s.
func (l *Lab) vipTransport() (*http.Transport, error) {
	return l.apiTransport(VIP.Addr().String())
}

// apiTransport is vipTransport for a server that presents serverName (an
// address in its certificate).
func (l *Lab) apiTransport(serverName string) (*http.Transport, error) {
	var pool *x509.CertPool
	if l.st.Settings.Kubeadm {
		var err error
		if pool, err = l.kubeadmCA(); err != nil {
			return nil, err
		}
	} else {
		pem, err := os.ReadFile(l.caPath())
		if err != nil {
			return nil, fmt.Errorf("lab: %w", err)
		}
		pool = x509.NewCertPool()
		pool.AppendCertsFromPEM(pem)
	}
	dial := netns.Dialer(clientNS)
	return &http.Transport{
		DisableKeepAlives:     true,
		TLSClientConfig:       &tls.Config{RootCAs: pool, ServerName: serverName},
		TLSHandshakeTimeout:   5 * time.Second,
		ResponseHeaderTimeout: 5 * time.Second,
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			return dial(ctx, addr)
		},
	}, nil
}

// vipURL is https://VIP:port/path.
func vipURL(port int, path string) string {
	return fmt.Sprintf("https://%s%s", netip.AddrPortFrom(VIP.Addr(), uint16(port)), path)
}

// getJSON GETs url from inside namespace ns and decodes the answer into v.
func getJSON(ctx context.Context, ns, url string, v any) error {
	dial := netns.Dialer(ns)
	c := &http.Client{Timeout: time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext:       func(ctx context.Context, _, addr string) (net.Conn, error) { return dial(ctx, addr) },
	}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s in %s: HTTP %d", url, ns, resp.StatusCode)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}
