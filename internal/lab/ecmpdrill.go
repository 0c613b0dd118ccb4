package lab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

// DrillECMPNodeKilled cuts one node's power (its switch port down, every
// process killed) in a --bgp-mode ecmp lab, where every node advertises
// the VIP and the router spreads flows.
const DrillECMPNodeKilled = "ecmp-node-killed"

// ecmpFlows is how many long-lived connections the drill keeps through
// the VIP: enough that each of three nodes carries several.
const ecmpFlows = 48

// ECMPResult is what ecmp-node-killed measured.
type ECMPResult struct {
	// RouterHash is how the router spread flows (fib.go).
	RouterHash string `json:"routerHash"`
	// NextHopsBefore and NextHopsAfter are the router's next hops for the
	// VIP before the fault and once the victim is back.
	NextHopsBefore []string `json:"nextHopsBefore"`
	NextHopsAfter  []string `json:"nextHopsAfter"`
	// WithdrawnMillis is how long after the kill the router stopped
	// listing the victim.
	WithdrawnMillis float64 `json:"withdrawnMillis"`
	// Flows are long-lived connections (one request every 20 ms each),
	// by the node whose balancer carried them when the fault hit.
	FlowsOnVictim    int `json:"flowsOnVictim"`
	FlowsOnSurvivors int `json:"flowsOnSurvivors"`
	// FlowsToVictimsAPIServer went through a survivor's balancer to the
	// victim's API server, which died with it: not counted as survivors.
	FlowsToVictimsAPIServer int `json:"flowsToVictimsAPIServer"`
	// SurvivorFlowsFailed are survivor flows that failed a request while
	// the router still sent them to their node: vigil's doing.
	SurvivorFlowsFailed int `json:"survivorFlowsFailed"`
	// SurvivorFlowsMoved are survivor flows the router sent to another
	// node after the victim's route went: its hash-threshold multipath
	// (Linux's, and many routers') moves the boundaries between next
	// hops when one goes, and a connection whose packets reach a node
	// without its state is reset. A router with resilient hashing keeps
	// them where they were.
	SurvivorFlowsMoved int `json:"survivorFlowsMoved"`
	// Breaks say what happened to each.
	Breaks []string `json:"breaks,omitempty"`
	// NewConnections are one new connection every 10 ms; NewFailed of
	// them failed or had no answer within a second, and NewOutageMillis
	// is the longest run of failures, from the first one's start to the
	// start of the next that succeeded.
	NewConnections  int     `json:"newConnections"`
	NewFailed       int     `json:"newFailed"`
	NewOutageMillis float64 `json:"newOutageMillis"`
	// NewFailingMillis is from the first failed attempt to the last:
	// how long new connections could fail (those the router hashed to
	// the dead node).
	NewFailingMillis float64 `json:"newFailingMillis"`
}

// ok: no survivor flow failed on its node (nor, with resilient hashing,
// was moved by the router), and new connections found a node again within
// ecmpOutageBound.
func (e *ECMPResult) ok() bool {
	moved := e.RouterHash == RouterHashResilient && e.SurvivorFlowsMoved > 0
	return e.SurvivorFlowsFailed == 0 && !moved && e.NewOutageMillis <= float64(ecmpOutageBound.Milliseconds())
}

// ecmpOutageBound is far above what the drill measures (tens of ms):
// past it, new connections were sent to a dead node for long.
const ecmpOutageBound = 2 * time.Second

func (e *ECMPResult) String() string {
	s := fmt.Sprintf("router (%s hashing) next hops %v; withdrawn %.0fms after the kill; flows through survivors %d: failed on their node %d, moved by the router %d; through the victim %d, to its API server %d; new connections %d, failed %d within %.0fms, longest run of failures %.0fms; back: %v",
		e.RouterHash, e.NextHopsBefore, e.WithdrawnMillis, e.FlowsOnSurvivors, e.SurvivorFlowsFailed, e.SurvivorFlowsMoved, e.FlowsOnVictim, e.FlowsToVictimsAPIServer, e.NewConnections, e.NewFailed, e.NewFailingMillis, e.NewOutageMillis, e.NextHopsAfter)
	for _, b := range e.Breaks {
		s += "\n      " + b
	}
	return s
}

// flow is one long-lived connection through the VIP.
type flow struct {
	client *http.Client
	tr     *http.Transport

	mu     sync.Mutex
	via    []string    // the balancer's node of each answer, in order
	server []string    // the API server that answered each
	failed []time.Time // when requests failed
	errs   []string
	at     []time.Time // when each answer came
	conns  []connEvent // its TCP connections opening and ending
}

// connEvent is a flow's connection opening (err "") or ending: what the
// client saw first on it (a read or write error, or its own close).
type connEvent struct {
	at    time.Time
	local string // the client's address of the connection
	err   string // "" when it opened
}

func (f *flow) noteConn(local net.Addr, err string) {
	f.mu.Lock()
	f.conns = append(f.conns, connEvent{time.Now(), local.String(), err})
	f.mu.Unlock()
}

// trackedConn notes in its flow how the connection ended.
type trackedConn struct {
	net.Conn
	f    *flow
	once sync.Once
}

func (c *trackedConn) end(err error) {
	c.once.Do(func() { c.f.noteConn(c.LocalAddr(), err.Error()) })
}

func (c *trackedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if err != nil {
		c.end(fmt.Errorf("read: %w", err))
	}
	return n, err
}

func (c *trackedConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	if err != nil {
		c.end(fmt.Errorf("write: %w", err))
	}
	return n, err
}

func (c *trackedConn) Close() error {
	c.end(errors.New("closed by the client"))
	return c.Conn.Close()
}

// connStory says what happened to the flow's connections between from and
// to, times relative to fault. Called with f.mu held.
func (f *flow) connStory(fault, from, to time.Time) string {
	var parts []string
	for _, e := range f.conns {
		if e.at.Before(from) || e.at.After(to) {
			continue
		}
		if e.err == "" {
			parts = append(parts, fmt.Sprintf("connection from %s opened at %+.0fms", e.local, millis(e.at.Sub(fault))))
		} else {
			parts = append(parts, fmt.Sprintf("connection from %s ended at %+.0fms (%s)", e.local, millis(e.at.Sub(fault)), e.err))
		}
	}
	return strings.Join(parts, "; ")
}

// every calls f every d until stop is closed.
func every(d time.Duration, stop <-chan struct{}, f func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			f()
		}
	}
}

func (f *flow) run(url string, stop <-chan struct{}) {
	every(20*time.Millisecond, stop, func() {
		var v struct {
			Node string `json:"node"`
			Via  string `json:"via"`
		}
		resp, err := f.client.Get(url)
		if err == nil {
			err = json.NewDecoder(io.LimitReader(resp.Body, 4096)).Decode(&v)
			resp.Body.Close()
		}
		f.mu.Lock()
		if err != nil {
			f.failed = append(f.failed, time.Now())
			f.errs = append(f.errs, err.Error())
		} else {
			f.via = append(f.via, v.Via)
			f.server = append(f.server, v.Node)
			f.at = append(f.at, time.Now())
		}
		f.mu.Unlock()
	})
}

// viaAt is the node whose balancer answered last before t, and the API
// server behind it ("" if none did).
func (f *flow) viaAt(t time.Time) (via, server string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, at := range f.at {
		if at.After(t) {
			break
		}
		via, server = f.via[i], f.server[i]
	}
	return via, server
}

func (l *Lab) ecmpDrill(ctx context.Context, r *Result) error {
	s := l.st.Settings
	if !s.ecmp() {
		return fmt.Errorf("drill %s needs a --bgp-mode ecmp lab", DrillECMPNodeKilled)
	}
	e := &ECMPResult{RouterHash: RouterHashResilient}
	if !s.resilient() {
		e.RouterHash = RouterHashThreshold
	}
	r.ECMP = e
	hopsAre := func(want []string, within time.Duration) ([]string, error) { return l.waitNextHops(ctx, want, within) }
	want := l.nodeIPs()
	var err error
	if e.NextHopsBefore, err = hopsAre(want, recoverTimeout); err != nil {
		return err
	}
	tr, err := l.vipTransport()
	if err != nil {
		return err
	}
	url := vipURL(s.LBPort, "/version")
	stop := make(chan struct{})
	var wg sync.WaitGroup
	flows := make([]*flow, ecmpFlows)
	defer func() {
		// Stopped first, then closed: a flow left open would skew the
		// balancers' least-connections choice in the next run.
		close(stop)
		wg.Wait()
		for _, f := range flows {
			if f != nil {
				f.tr.CloseIdleConnections()
			}
		}
	}()
	for i := range flows {
		ft := tr.Clone()
		ft.DisableKeepAlives, ft.MaxConnsPerHost, ft.MaxIdleConnsPerHost = false, 1, 1
		f := &flow{tr: ft, client: &http.Client{Timeout: 2 * time.Second, Transport: ft}}
		// Each connection's opening and end are noted: a flow that moves
		// under resilient hashing had its connection end first, and how
		// it ended (a reset, the server's close) says who ended it.
		dial := ft.DialContext
		ft.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := dial(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			f.noteConn(c.LocalAddr(), "")
			return &trackedConn{Conn: c, f: f}, nil
		}
		flows[i] = f
		wg.Go(func() { flows[i].run(url, stop) })
	}
	// New connections, one every 10 ms.
	type attempt struct {
		at time.Time
		ok bool
	}
	var amu sync.Mutex
	var attempts []attempt
	// A new connection sent to the dead node loses its SYN and would be
	// answered by a survivor after the retransmission (1 s), once the
	// route is gone: an attempt without an answer within a second failed.
	newConn := &http.Client{Timeout: time.Second, Transport: tr}
	wg.Go(func() {
		every(probeInterval, stop, func() {
			at := time.Now()
			wg.Go(func() { // counted while this goroutine runs, so Wait sees it
				resp, err := newConn.Get(url)
				if err == nil {
					_, err = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				amu.Lock()
				attempts = append(attempts, attempt{at, err == nil})
				amu.Unlock()
			})
		})
	})
	// Every flow has answered, and the flows reach every node.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		nodes := map[string]bool{}
		answered := 0
		for _, f := range flows {
			if v, _ := f.viaAt(time.Now()); v != "" {
				answered++
				nodes[v] = true
			}
		}
		if answered == len(flows) && len(nodes) == len(l.st.Nodes) {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("before the fault: %d of %d flows answered, through %d of %d nodes", answered, len(flows), len(nodes), len(l.st.Nodes))
		}
	}
	// The victim loses power: its switch port goes down and every
	// process on it dies. Nothing it sends reaches the router any more;
	// BFD (--bgp-bfd) or the BGP hold time tells the router.
	victim := l.st.Nodes[0]
	r.Target = victim.Name
	fault := time.Now()
	if err := l.setNodePorts(ctx, victim, false); err != nil {
		return err
	}
	victim.Cut = true
	if err := l.killNode(ctx, victim); err != nil {
		return err
	}
	survivors := slices.DeleteFunc(slices.Clone(want), func(ip string) bool { return ip == victim.IP.String() })
	if _, err := hopsAre(survivors, 10*time.Second); err != nil {
		return err
	}
	e.WithdrawnMillis = millis(time.Since(fault))
	time.Sleep(3 * time.Second) // the flows go on through the survivors
	end := time.Now()

	for i, f := range flows {
		node, server := f.viaAt(fault)
		switch {
		case node == victim.IP.String():
			e.FlowsOnVictim++
			continue
		case server == victim.Name:
			// Through a survivor's balancer to the victim's API server:
			// the backend died, as it can in any mode.
			e.FlowsToVictimsAPIServer++
			continue
		}
		e.FlowsOnSurvivors++
		f.mu.Lock()
		// Up to its first answer from another node, a failure is the
		// node's; a move (the failed request Go retried on a new
		// connection, or the reset seen) is the router's.
		moved, movedAt := "", end
		for j, at := range f.at {
			if at.After(fault) && at.Before(end) && f.via[j] != node {
				moved, movedAt = f.via[j], at
				break
			}
		}
		var why []string
		for j, at := range f.failed {
			if at.After(fault) && at.Before(movedAt) {
				why = append(why, fmt.Sprintf("failed at %+.0fms: %s", millis(at.Sub(fault)), f.errs[j]))
			}
		}
		// The flow's last answer through its node before the move: a long
		// gap says the flow was stalled (its requests sent nothing to
		// hash) rather than moved while it sent.
		var lastOnNode time.Time
		for j, at := range f.at {
			if at.Before(movedAt) && f.via[j] == node {
				lastOnNode = at
			}
		}
		f.mu.Unlock()
		switch {
		case moved != "":
			e.SurvivorFlowsMoved++
			b := fmt.Sprintf("flow %d (through %s): moved by the router to %s at %+.0fms, its last answer through %s at %+.0fms", i, node, moved, millis(movedAt.Sub(fault)), node, millis(lastOnNode.Sub(fault)))
			if len(why) > 0 { // the failures that preceded the move
				b += " (" + strings.Join(why, "; ") + ")"
			}
			f.mu.Lock()
			story := f.connStory(fault, fault.Add(-time.Second), movedAt)
			f.mu.Unlock()
			if story != "" {
				b += "; " + story
			}
			e.Breaks = append(e.Breaks, b)
		case len(why) > 0:
			e.SurvivorFlowsFailed++
			e.Breaks = append(e.Breaks, fmt.Sprintf("flow %d (through %s): %s", i, node, strings.Join(why, "; ")))
		}
	}
	amu.Lock()
	sort.Slice(attempts, func(i, j int) bool { return attempts[i].at.Before(attempts[j].at) })
	var failStart, firstFail, lastFail time.Time
	for _, a := range attempts {
		if a.at.Before(fault.Add(-time.Second)) || a.at.After(end) {
			continue
		}
		e.NewConnections++
		if !a.ok {
			e.NewFailed++
			if firstFail.IsZero() {
				firstFail = a.at
			}
			lastFail = a.at
			if failStart.IsZero() {
				failStart = a.at
			}
			continue
		}
		if !failStart.IsZero() {
			e.NewOutageMillis = max(e.NewOutageMillis, millis(a.at.Sub(failStart)))
			failStart = time.Time{}
		}
	}
	amu.Unlock()
	if !firstFail.IsZero() {
		e.NewFailingMillis = millis(lastFail.Sub(firstFail))
	}

	// Heal: the victim boots again; its route comes back.
	if err := l.setNodePorts(ctx, victim, true); err != nil {
		return err
	}
	victim.Cut = false
	if err := l.startNode(victim); err != nil {
		return err
	}
	if err := l.waitEtcdHealthy(ctx, recoverTimeout); err != nil {
		return err
	}
	e.NextHopsAfter, err = hopsAre(want, recoverTimeout)
	return err
}

// nodeIPs are the nodes' addresses, sorted.
func (l *Lab) nodeIPs() []string {
	var ips []string
	for _, n := range l.st.Nodes {
		ips = append(ips, n.IP.String())
	}
	return slices.Sorted(slices.Values(ips))
}

// waitNextHops waits until the router's multipath route to the VIP has
// exactly the next hops want (sorted), and returns what it last saw.
func (l *Lab) waitNextHops(ctx context.Context, want []string, within time.Duration) ([]string, error) {
	var got []string
	for deadline := time.Now().Add(within); ; time.Sleep(20 * time.Millisecond) {
		rt, err := l.VIPRoute(ctx)
		if err == nil {
			got = slices.Sorted(slices.Values(rt.NextHops))
			if slices.Equal(got, want) {
				return got, nil
			}
		}
		if time.Now().After(deadline) {
			return got, fmt.Errorf("the router's next hops for the VIP are %v after %v, want %v (%v)", got, within, want, err)
		}
		if err := ctx.Err(); err != nil {
			return got, err
		}
	}
}
