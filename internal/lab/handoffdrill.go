package lab

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptrace"
	"os/exec"
	"strings"
	"sync"
	"time"
)

// DrillHandoff is a planned move: vigil handoff, run on the holder, moves
// the VIP to a peer while clients keep connections open through the load
// balancer. Goals (issue 17): a client outage of 50 ms at most, and no
// connection lost with a request in flight.
const DrillHandoff = "handoff"

// HandoffClients is how many keep-alive clients the drill runs through the
// load balancer, each sending a request every 10 to 40 ms on its one
// connection.
const HandoffClients = 8

// HandoffResult adds what the handoff drill measures to Result.
type HandoffResult struct {
	// Output is what vigil handoff printed.
	Output []string `json:"output"`
	// Requests were sent by the keep-alive clients during the drill.
	Requests int `json:"requests"`
	// LostInFlight counts requests that failed on a connection that had
	// carried earlier requests, after the request was written: the
	// connection was cut with the request in flight.
	LostInFlight int `json:"lostInFlight"`
	// FailedNew counts requests that failed on a new connection (the VIP
	// moving under the dial); IdleClosed counts connections that ended
	// between requests, cleanly, and were replaced.
	FailedNew  int      `json:"failedNew"`
	Conns      int      `json:"conns"`
	FirstLosts []string `json:"firstLosts,omitempty"`
}

func (h HandoffResult) String() string {
	s := fmt.Sprintf("keep-alive clients: %d requests on %d connections, %d lost in flight, %d failed on a new connection", h.Requests, h.Conns, h.LostInFlight, h.FailedNew)
	for _, e := range h.FirstLosts {
		s += "\n      lost: " + e
	}
	for _, o := range h.Output {
		s += "\n      vigil handoff: " + o
	}
	return s
}

// runHandoff runs vigil handoff in the holder's namespace, as an operator
// on that node would.
func (l *Lab) runHandoff(ctx context.Context, holder string) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, 40*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", nodeNS(holder), l.vigilBin, "handoff",
		"--etcd-endpoints", strings.Join(l.etcdEndpoints(), ","), "--timeout", "30s")
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if err != nil {
		return lines, fmt.Errorf("vigil handoff: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return lines, nil
}

// keepAliveClients send requests through VIP:port on kept-alive
// connections and classify each failure by whether the connection had
// carried a request before and whether this one was written.
type keepAliveClients struct {
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu  sync.Mutex
	res HandoffResult
}

func (l *Lab) startKeepAliveClients(port int) (*keepAliveClients, error) {
	base, err := l.vipTransport()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	k := &keepAliveClients{ctx: ctx, cancel: cancel}
	url := vipURL(port, "/version")
	for range HandoffClients {
		tr := &http.Transport{DialContext: base.DialContext, TLSClientConfig: base.TLSClientConfig.Clone(),
			MaxConnsPerHost: 1, MaxIdleConnsPerHost: 1, IdleConnTimeout: time.Minute, ForceAttemptHTTP2: false,
			TLSNextProto: map[string]func(string, *tls.Conn) http.RoundTripper{}} // HTTP/1.1: one request per connection at a time
		c := &http.Client{Transport: tr, Timeout: 2 * time.Second}
		k.wg.Go(func() {
			defer tr.CloseIdleConnections()
			for ctx.Err() == nil {
				k.one(ctx, c, url)
				select {
				case <-ctx.Done():
				case <-time.After(time.Duration(10+rand.IntN(30)) * time.Millisecond):
				}
			}
		})
	}
	return k, nil
}

// one sends one POST (not retried by the transport, unlike a GET on a
// reused connection) and records how it went.
func (k *keepAliveClients) one(ctx context.Context, c *http.Client, url string) {
	var reused, wrote bool
	trace := &httptrace.ClientTrace{
		GotConn:      func(i httptrace.GotConnInfo) { reused = i.Reused },
		WroteRequest: func(httptrace.WroteRequestInfo) { wrote = true },
	}
	req, err := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, trace), http.MethodPost, url, strings.NewReader("{}"))
	if err != nil {
		return
	}
	resp, err := c.Do(req)
	if err == nil {
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	if ctx.Err() != nil {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.res.Requests++
	if !reused {
		k.res.Conns++
	}
	switch {
	case err == nil:
	case reused && wrote:
		k.res.LostInFlight++
		if len(k.res.FirstLosts) < 3 {
			k.res.FirstLosts = append(k.res.FirstLosts, fmt.Sprintf("%s %v", time.Now().Format("15:04:05.000"), err))
		}
	default:
		k.res.FailedNew++
	}
}

func (k *keepAliveClients) stop() HandoffResult {
	k.cancel()
	k.wg.Wait()
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.res
}
