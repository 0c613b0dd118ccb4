package lab

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"
)

// A request through the VIP can fail because vigil sent it nowhere or to a
// dead server, or because no API server could have answered it: on two
// cores, while a member joins, all of a kubeadm cluster's API servers can
// stall for seconds together (their health checks and their TLS handshakes
// time out). The server watch tells the two apart. It asks every API server
// directly, from the same client namespace and not through the VIP, and a
// failed request through the VIP counts against vigil only if some server
// answered such a direct request promptly around the time it started:
// then a load balancer could have delivered it.

const (
	// serverWatchInterval paces each server's direct requests (one at a
	// time per server, so a stalled server holds its next one back).
	serverWatchInterval = 200 * time.Millisecond
	// promptAnswer is the longest a direct request may take to show its
	// server was there to be used.
	promptAnswer = time.Second
	// aroundStart is how far from a failed request's start a prompt
	// direct answer must have begun to count.
	aroundStart = time.Second
)

// serverProbe is one direct request to an API server.
type serverProbe struct {
	server netip.Addr
	start  time.Time
	took   time.Duration
	ok     bool // answered GET /version with 200
}

// recorder runs probe loops and keeps what they record, until closed.
type recorder[T any] struct {
	stop chan struct{}
	wg   sync.WaitGroup

	mu    sync.Mutex // guards items
	items []T
}

func newRecorder[T any]() *recorder[T] { return &recorder[T]{stop: make(chan struct{})} }

// every calls once, then again every interval, until the recorder closes.
func (r *recorder[T]) every(interval time.Duration, once func()) {
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			once()
			select {
			case <-r.stop:
				return
			case <-t.C:
			}
		}
	}()
}

func (r *recorder[T]) add(v T) {
	r.mu.Lock()
	r.items = append(r.items, v)
	r.mu.Unlock()
}

// close stops the loops and returns everything recorded. Safe to call
// twice.
func (r *recorder[T]) close() []T {
	select {
	case <-r.stop:
	default:
		close(r.stop)
	}
	r.wg.Wait()
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.items)
}

// serverWatch asks a fixed set of API server addresses GET /version
// directly until closed.
type serverWatch = recorder[serverProbe]

// startServerWatch starts asking addrs:port, each every
// serverWatchInterval, each request bounded by timeout. Addresses with no
// server yet (a machine that joins later) simply fail until one starts.
func (l *Lab) startServerWatch(addrs []netip.Addr, port int, timeout time.Duration) (*serverWatch, error) {
	w := newRecorder[serverProbe]()
	for _, a := range addrs {
		tr, err := l.apiTransport(a.String()) // a new connection for every request
		if err != nil {
			w.close()
			return nil, err
		}
		c := &http.Client{Timeout: timeout, Transport: tr}
		url := fmt.Sprintf("https://%s/version", netip.AddrPortFrom(a, uint16(port)))
		w.every(serverWatchInterval, func() { askServer(w, c, a, url) })
	}
	return w, nil
}

func askServer(w *serverWatch, c *http.Client, a netip.Addr, url string) {
	p := serverProbe{server: a, start: time.Now()}
	ctx, cancel := context.WithCancel(context.Background())
	go func() { // a close does not wait for a stalled server
		select {
		case <-w.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		panic(err) // a constant URL
	}
	if resp, err := c.Do(req); err == nil {
		_, err = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		p.ok = err == nil && resp.StatusCode == http.StatusOK
	}
	p.took = time.Since(p.start)
	w.add(p)
}

// promptServers are the servers that answered a direct request within
// promptAnswer, the request having begun within aroundStart of t: the
// servers a load balancer could have used for a request starting at t.
func promptServers(probes []serverProbe, t time.Time) []netip.Addr {
	var out []netip.Addr
	for _, p := range probes {
		if !p.ok || p.took > promptAnswer || slices.Contains(out, p.server) {
			continue
		}
		if d := p.start.Sub(t); d >= -aroundStart && d <= aroundStart {
			out = append(out, p.server)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

// serverNames names addrs by the lab's nodes where it can.
func serverNames(addrs []netip.Addr, names map[netip.Addr]string) string {
	if len(addrs) == 0 {
		return "none"
	}
	s := make([]string, len(addrs))
	for i, a := range addrs {
		if n, ok := names[a]; ok {
			s[i] = n
		} else {
			s[i] = a.String()
		}
	}
	return strings.Join(s, " ")
}

// watchedServers are the addresses of the lab's nodes, and of the next
// extra ones a drill may add (machines that join get the next indexes).
func (l *Lab) watchedServers(extra int) []netip.Addr {
	top := 0
	var out []netip.Addr
	for _, n := range l.st.Nodes {
		top = max(top, n.Index)
		out = append(out, n.IP)
	}
	for _, i := range l.st.Retired {
		top = max(top, i)
	}
	for i := top + 1; i <= min(top+extra, maxNodeIndex); i++ {
		out = append(out, nodeIP(i))
	}
	return out
}

// The third excuse: the holder gave up the VIP because its lock store was
// slow. vigil promises no VIP move while etcd answers within 400 ms; when
// a write takes longer, the holder steps down (safety before speed) and
// takes the VIP again a moment later, and requests in flight then fail. The
// store watch writes one key through the cluster's etcd from the client
// namespace, as the holder's renewals do, and a failed request is excused
// when it overlaps a gap in the VIP's answers that began while such a
// write was slower than that.

const (
	// storeWatchInterval is how often the store watch starts a write:
	// vigil's default --retry-period (startStoreWatch says why).
	storeWatchInterval = 100 * time.Millisecond
	// storeWatchTimeout bounds each write, and storeWatchInFlight how
	// many may be under way at once: enough that the first write begun in
	// a stall is never held back, few enough that a stall does not pile
	// writes onto the etcd the drills judge.
	storeWatchTimeout  = 2 * time.Second
	storeWatchInFlight = 3
	// storePromise is how fast etcd must answer for vigil to promise the
	// VIP stays put.
	storePromise = 400 * time.Millisecond
	// storeDoubt is the slowest write of the watch that still shows the
	// promise kept: a stall shows in the watch up to an interval shorter
	// than it lasted (startStoreWatch), so a write slower than this may
	// mean one of the holder's took longer than storePromise.
	storeDoubt = storePromise - storeWatchInterval
	// darkGap is the shortest silence of the VIP's UDP responder (probed
	// every 10 ms) that counts as the VIP gone. A holder that steps down
	// and takes the VIP back may leave it for less than 100 ms (the
	// kubeadm lab saw 65 ms, its requests in flight reset all the same);
	// a slow write must also have begun just before for the silence to
	// excuse anything.
	darkGap = 50 * time.Millisecond
	// beforeDark is how long before a gap a slow write may have begun to
	// explain it: the renew deadline (500 ms by default) and some.
	beforeDark = time.Second
)

// storeProbe is one write through etcd.
type storeProbe struct {
	start time.Time
	took  time.Duration
	ok    bool
}

// slow reports whether the write failed or leaves room for vigil's
// latency promise to have been broken (storeDoubt).
func (p storeProbe) slow() bool { return !p.ok || p.took > storeDoubt }

// startStoreWatch starts a write with put every storeWatchInterval, each
// bounded by storeWatchTimeout, whether or not the writes before it have
// been answered (at most storeWatchInFlight at once), until closed: the
// writes overlap, as the holder's pipelined renewals do, and a slow one
// does not hold the next one back.
//
// A stall of etcd shows in the watch as the time from the first write
// begun in it to its end: up to an interval less than it lasted. The
// holder is fenced when no renewal is answered within --renew-deadline
// (500 ms) of the start of the last one answered; with renewals every
// 100 ms, a stall of about 400 ms fences it when it begins just as one
// renewal was about to be answered. One write every 200 ms, one at a
// time, as the watch once did, timed such a stall at 200 ms, and a chaos
// run failed a holder that had stepped down while etcd was not answering
// it (bench/stress/README.md, 2026-12-07). With a write begun every
// 100 ms, every stall that fences a holder at the default timings leaves
// a write slower than storeDoubt, and a stall that every write rides out
// within storeDoubt leaves none (TestStoreWatchSeesEveryStallThatFences).
// A write every 50 ms, up to 40 of them in flight, was tried first: its
// load on etcd (20 writes a second, and a pile of them after every stall)
// was suspected in three failed reconnect storms in a row.
func startStoreWatch(put func(ctx context.Context) error) *recorder[storeProbe] {
	w := newRecorder[storeProbe]()
	slots := make(chan struct{}, storeWatchInFlight)
	w.every(storeWatchInterval, func() {
		select {
		case slots <- struct{}{}:
		default:
			return // as many under way as allowed: they will say how slow
		}
		start := time.Now()
		w.wg.Go(func() { // every's own count keeps the group above zero here
			defer func() { <-slots }()
			p := storeProbe{start: start}
			ctx, cancel := context.WithTimeout(context.Background(), storeWatchTimeout)
			p.ok = put(ctx) == nil
			cancel()
			p.took = time.Since(p.start)
			w.add(p)
		})
	})
	return w
}

// startLabStoreWatch starts a store watch through the netns lab's etcd
// members, all but skip (nil for none); stop ends it and its client.
func (l *Lab) startLabStoreWatch(skip *Node) (w *recorder[storeProbe], stop func(), err error) {
	var eps []string
	for _, m := range l.st.Nodes {
		if m != skip {
			eps = append(eps, fmt.Sprintf("http://%s:2379", m.IP))
		}
	}
	cli, err := etcdClient(eps)
	if err != nil {
		return nil, nil, err
	}
	w = startStoreWatch(func(ctx context.Context) error {
		_, err := cli.Put(ctx, "/vigil-lab/store-watch", time.Now().UTC().Format(time.RFC3339Nano))
		return err
	})
	return w, func() { w.close(); cli.Close() }, nil
}

// span is a time interval.
type span struct{ from, to time.Time }

// darkSpans are the silences of at least darkGap between the VIP's
// answers (sorted by time).
func darkSpans(rs []reply) []span {
	var out []span
	for i := 1; i < len(rs); i++ {
		if rs[i].at.Sub(rs[i-1].at) >= darkGap {
			out = append(out, span{rs[i-1].at, rs[i].at})
		}
	}
	return out
}

// slowStoreDark is the VIP's silence that a request from start to end
// overlapped (or that ended at most a second before it began, as the
// failover window does), which began while a write through etcd was slower
// than vigil's promise; ok is false when there is none.
func slowStoreDark(dark []span, probes []storeProbe, start, end time.Time) (s span, slowest time.Duration, ok bool) {
	for _, d := range dark {
		if d.from.After(end) || d.to.Add(time.Second).Before(start) {
			continue
		}
		// A slow write was under way at some point in the second before
		// the VIP fell silent.
		if slowest, ok := slowStoreBefore(probes, d.from, 0); ok {
			return d, slowest, true
		}
	}
	return span{}, 0, false
}

// checkEvery paces the drills' checks of where the VIP is.
const checkEvery = 200 * time.Millisecond

// slowStoreBefore tells whether a write through etcd that leaves room for
// vigil's promise to have been broken (storeProbe.slow: slower than
// storeDoubt, or failed) was under way in the beforeDark before at, or in the
// check interval `every` that ended when at was seen: the VIP leaving its
// holder then is what vigil does when its renewals cannot get through. It
// returns the slowest such write.
func slowStoreBefore(probes []storeProbe, at time.Time, every time.Duration) (slowest time.Duration, ok bool) {
	from := at.Add(-every - beforeDark)
	for _, p := range probes {
		if !p.slow() || p.start.After(at) || p.start.Add(p.took).Before(from) {
			continue
		}
		ok, slowest = true, max(slowest, p.took)
	}
	return slowest, ok
}
