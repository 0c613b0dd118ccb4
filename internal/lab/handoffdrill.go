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
	"regexp"
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
	// carried earlier requests, written before the old holder let go (the
	// time vigil handoff prints): the connection was cut with the request
	// in flight. LostRacingClose counts those written after it: the
	// connection was idle when the old holder closed it, and the client
	// sent on it before it saw the close (the race of every server that
	// closes an idle keep-alive connection; clients retry idempotent
	// requests on it).
	LostInFlight    int `json:"lostInFlight"`
	LostRacingClose int `json:"lostRacingClose"`
	// Released is when the old holder let go, from vigil handoff's output.
	Released time.Time `json:"released,omitempty"`
	// FailedNew counts requests that failed on a new connection (the VIP
	// moving under the dial); IdleClosed counts connections that ended
	// between requests, cleanly, and were replaced.
	FailedNew  int      `json:"failedNew"`
	Conns      int      `json:"conns"`
	FirstLosts []string `json:"firstLosts,omitempty"`
	// FirstFailedNew are the first failures on new connections.
	FirstFailedNew []string `json:"firstFailedNew,omitempty"`

	lost []time.Time // when each lost request was written
}

var releasedAt = regexp.MustCompile(`gave the VIP up (?:after \S+ without a quiet moment \(.*\) )?at (\d\d:\d\d:\d\d\.\d+)`)

// classify splits the lost requests at the release time that vigil
// handoff printed (a time of day, on day).
func (h *HandoffResult) classify(day time.Time) {
	for _, line := range h.Output {
		m := releasedAt.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		t, err := time.ParseInLocation("15:04:05.000000", m[1], time.Local)
		if err != nil {
			continue
		}
		y, mo, d := day.Date()
		h.Released = time.Date(y, mo, d, t.Hour(), t.Minute(), t.Second(), t.Nanosecond(), time.Local)
	}
	if h.Released.IsZero() {
		h.LostInFlight = len(h.lost) // no release time: count every loss as in flight
		return
	}
	h.LostInFlight, h.LostRacingClose = 0, 0
	for _, w := range h.lost {
		if w.Before(h.Released) {
			h.LostInFlight++
		} else {
			h.LostRacingClose++
		}
	}
}

func (h HandoffResult) String() string {
	s := fmt.Sprintf("keep-alive clients: %d requests on %d connections; lost: %d in flight, %d sent on a connection closed while idle; %d failed on a new connection", h.Requests, h.Conns, h.LostInFlight, h.LostRacingClose, h.FailedNew)
	for _, e := range h.FirstLosts {
		s += "\n      lost: " + e
	}
	for _, e := range h.FirstFailedNew {
		s += "\n      failed on a new connection: " + e
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
	var wroteAt time.Time
	trace := &httptrace.ClientTrace{
		GotConn:      func(i httptrace.GotConnInfo) { reused = i.Reused },
		WroteRequest: func(httptrace.WroteRequestInfo) { wrote, wroteAt = true, time.Now() },
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
		k.res.lost = append(k.res.lost, wroteAt)
		if len(k.res.FirstLosts) < 3 {
			k.res.FirstLosts = append(k.res.FirstLosts, fmt.Sprintf("written %s, failed %s: %v", wroteAt.Format("15:04:05.000000"), time.Now().Format("15:04:05.000000"), err))
		}
	default:
		k.res.FailedNew++
		if len(k.res.FirstFailedNew) < 3 {
			k.res.FirstFailedNew = append(k.res.FirstFailedNew, fmt.Sprintf("%s (reused %v, written %v): %v", time.Now().Format("15:04:05.000000"), reused, wrote, err))
		}
	}
}

func (k *keepAliveClients) stop() HandoffResult {
	k.cancel()
	k.wg.Wait()
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.res
}
