package lab

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/vigil-ha/vigil/internal/clock"
)

// Watch drills: long-lived connections (watches) through the VIP holder's
// load balancer to another node's API server, whose process is paused or
// killed. The node and vigil stay up, and the VIP does not move.
//
//   - backend-paused: SIGSTOP for PauseFor, then SIGCONT. The server is slow,
//     not gone: the balancer stops sending it new connections, but none of
//     its watches may be reset.
//   - backend-killed: SIGKILL. The server is gone: every one of its watches
//     must end within KilledBound, so clients reconnect to a live one.
const (
	DrillBackendPaused = "backend-paused"
	DrillBackendKilled = "backend-killed"
	// PauseFor is how long backend-paused keeps the API server stopped:
	// longer than vigil's health checks take to mark it down (interval +
	// fall*timeout = 1.6 s at most), so the drill covers a backend that is
	// down and comes back, and well inside the balancer's unreachable grace.
	PauseFor = 1500 * time.Millisecond
	// KilledBound is how soon after the kill every watch to the killed
	// server must have ended.
	KilledBound = time.Second
	// DrillWatches is how many watches the drills open through the VIP;
	// about a third land on each of three backends.
	DrillWatches = 30
)

// WatchResult adds what a watch drill measures to Result.
type WatchResult struct {
	// Watches were open through the VIP when the fault came; OnTarget of
	// them were served by the target's API server.
	Watches  int `json:"watches"`
	OnTarget int `json:"onTarget"`
	// Reset counts the target's watches that ended during the drill;
	// ResetElsewhere those served by other API servers.
	Reset          int `json:"reset"`
	ResetElsewhere int `json:"resetElsewhere"`
	// Resumed counts the target's watches that delivered an event after the
	// pause ended (backend-paused).
	Resumed int `json:"resumed,omitempty"`
	// Excused counts the watches that ended while a write through etcd
	// was slower than vigil's promise (or failed): the holder stepped
	// down, as it must when it cannot renew, and reset its clients; they
	// are not in Reset or ResetElsewhere. StoreSlowMillis is the slowest
	// such write.
	Excused         int     `json:"excused,omitempty"`
	StoreSlowMillis float64 `json:"storeSlowMillis,omitempty"`
	// EndedMillis are, for backend-killed, the times from the kill to the
	// end of each of the target's watches; median and worst.
	EndedMedianMillis float64  `json:"endedMedianMillis,omitempty"`
	EndedWorstMillis  float64  `json:"endedWorstMillis,omitempty"`
	FirstErrors       []string `json:"firstErrors,omitempty"`
}

func (w WatchResult) String() string {
	s := fmt.Sprintf("watches %d, %d on the target: %d reset (%d elsewhere)", w.Watches, w.OnTarget, w.Reset, w.ResetElsewhere)
	if w.Excused > 0 {
		s += fmt.Sprintf(", %d ended while etcd may have been slower than 400 ms (the lab's slowest write %.0fms)", w.Excused, w.StoreSlowMillis)
	}
	if w.Resumed > 0 {
		s += fmt.Sprintf(", %d resumed after the pause", w.Resumed)
	}
	if w.EndedWorstMillis > 0 {
		s += fmt.Sprintf("; ended after the kill: median %.0fms, worst %.0fms", w.EndedMedianMillis, w.EndedWorstMillis)
	}
	return s
}

// watchStream is one watch through the VIP.
type watchStream struct {
	node string // the API server that serves it

	mu    sync.Mutex // guards the fields below
	last  time.Time  // when the last event arrived
	ended time.Time  // zero while it is open
	err   error
}

func (w *watchStream) state() (last, ended time.Time, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.last, w.ended, w.err
}

// watchClient opens watches through VIP:port from the client namespace.
type watchClient struct {
	client *http.Client
	url    string
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func (l *Lab) newWatchClient(port int) (*watchClient, error) {
	tr, err := l.vipTransport() // one connection per watch
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &watchClient{client: &http.Client{Transport: tr}, url: vipURL(port, "/watch"), ctx: ctx, cancel: cancel}, nil
}

// open starts one watch and returns once its first event named its server.
func (c *watchClient) open() (*watchStream, error) {
	req, err := http.NewRequestWithContext(c.ctx, http.MethodGet, c.url, nil)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(c.ctx, 5*time.Second)
	defer cancel()
	resp, err := c.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("lab: open a watch through the VIP: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		return nil, fmt.Errorf("lab: open a watch through the VIP: HTTP %d", resp.StatusCode)
	}
	r := bufio.NewReader(resp.Body)
	first := make(chan error, 1)
	w := &watchStream{}
	go func() {
		var ev struct{ Node string }
		line, err := r.ReadBytes('\n')
		if err == nil {
			err = json.Unmarshal(line, &ev)
		}
		w.node = ev.Node
		first <- err
	}()
	select {
	case err = <-first:
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err != nil {
		resp.Body.Close()
		return nil, fmt.Errorf("lab: first event of a watch: %w", err)
	}
	w.last = time.Now()
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		defer resp.Body.Close()
		for {
			_, err := r.ReadBytes('\n')
			now := time.Now()
			w.mu.Lock()
			if err != nil {
				w.ended, w.err = now, err
				w.mu.Unlock()
				return
			}
			w.last = now
			w.mu.Unlock()
		}
	}()
	return w, nil
}

// close ends every watch and waits for their readers.
func (c *watchClient) close() {
	c.cancel()
	c.wg.Wait()
	c.client.CloseIdleConnections()
}

// watchDrill runs backend-paused or backend-killed and heals the lab.
func (l *Lab) watchDrill(ctx context.Context, kind string, r *Result) (err error) {
	if err := l.needStandInLB(kind); err != nil {
		return err
	}
	s := l.st.Settings
	holder, err := l.waitStable(ctx, recoverTimeout)
	if err != nil {
		return fmt.Errorf("lab not stable before the drill: %w", err)
	}
	if err := l.waitBackendsUp(ctx, holder, len(l.st.Nodes), recoverTimeout); err != nil {
		return err
	}
	target, err := l.nonHolder(kind, holder)
	if err != nil {
		return err
	}
	r.Target, r.Before = target.Name, holder

	d, err := l.newDrillRun()
	if err != nil {
		return err
	}
	defer d.w.close()
	mon := startMonitor(d.w, d.live, probeInterval)
	defer mon.close()

	wc, err := l.newWatchClient(s.LBPort)
	if err != nil {
		return err
	}
	defer wc.close()
	var streams []*watchStream
	for range DrillWatches {
		ws, err := wc.open()
		if err != nil {
			return err
		}
		streams = append(streams, ws)
	}
	res := &WatchResult{Watches: len(streams)}
	r.Watch = res
	for _, ws := range streams {
		if ws.node == target.Name {
			res.OnTarget++
		}
	}
	if res.OnTarget == 0 {
		return fmt.Errorf("none of %d watches through the VIP went to %s", len(streams), target.Name)
	}
	if !clock.Sleep(ctx, 500*time.Millisecond) { // baseline
		return ctx.Err()
	}

	pid := target.PIDs[roleAPIServer]
	if pid == 0 || !alive(pid) {
		return fmt.Errorf("the API server on %s is not running", target.Name)
	}
	store, stopStore, err := l.startLabStoreWatch(nil)
	if err != nil {
		return err
	}
	defer stopStore()
	var checkErr error
	switch kind {
	case DrillBackendPaused:
		checkErr = l.pauseBackend(ctx, target, pid, streams, store, res)
	case DrillBackendKilled:
		checkErr = l.killBackend(ctx, target, pid, streams, store, res)
	}
	if err := l.waitBackendsUp(ctx, holder, len(l.st.Nodes), recoverTimeout); err != nil {
		checkErr = errors.Join(checkErr, err)
	}

	doubles := mon.close()
	final, err := r.judgeHolders(doubles, d.w, d.live())
	if err != nil {
		return errors.Join(checkErr, err)
	}
	if len(final) == 1 {
		r.After = final[0]
	}
	if r.After != holder && res.Excused == 0 {
		checkErr = errors.Join(checkErr, fmt.Errorf("the VIP moved from %s to %v; only another node's API server failed", holder, final))
	}
	return checkErr
}

// excused tells whether a watch that ended at ended is explained by etcd
// breaking vigil's promise then (slowStoreBefore), and counts it so.
func (res *WatchResult) excused(probes []storeProbe, ended time.Time) bool {
	slowest, ok := slowStoreBefore(probes, ended, 0)
	if ok {
		res.Excused++
		res.StoreSlowMillis = max(res.StoreSlowMillis, millis(slowest))
	}
	return ok
}

// pauseBackend stops the target's API server for PauseFor and checks that
// none of the watches through the VIP ended, and that the target's resumed.
func (l *Lab) pauseBackend(ctx context.Context, target *Node, pid int, streams []*watchStream, store *recorder[storeProbe], res *WatchResult) error {
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		return fmt.Errorf("SIGSTOP the API server on %s: %w", target.Name, err)
	}
	clock.Sleep(ctx, PauseFor)
	resumed := time.Now()
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		return fmt.Errorf("SIGCONT the API server on %s: %w", target.Name, err)
	}
	// Long enough for vigil to find the server up again (rise 2 checks), and
	// for any reset to show.
	if !clock.Sleep(ctx, 3*time.Second) {
		return ctx.Err()
	}
	probes := store.close() // every write under way has ended
	excusedOnTarget := 0
	for _, ws := range streams {
		last, ended, err := ws.state()
		onTarget := ws.node == target.Name
		if !ended.IsZero() {
			if res.excused(probes, ended) {
				if onTarget {
					excusedOnTarget++
				}
				continue
			}
			if onTarget {
				res.Reset++
			} else {
				res.ResetElsewhere++
			}
			if len(res.FirstErrors) < 3 {
				res.FirstErrors = append(res.FirstErrors, fmt.Sprintf("%s: %v", ws.node, err))
			}
			continue
		}
		if onTarget && last.After(resumed) {
			res.Resumed++
		}
	}
	var errs []error
	if res.Reset+res.ResetElsewhere > 0 {
		errs = append(errs, fmt.Errorf("%d of %d watches were reset by a %v pause of %s's API server (%d of them on it): %v",
			res.Reset+res.ResetElsewhere, res.Watches, PauseFor, target.Name, res.Reset, res.FirstErrors))
	}
	if open := res.OnTarget - res.Reset - excusedOnTarget; res.Resumed != open {
		errs = append(errs, fmt.Errorf("%d of %d open watches on %s delivered no event after the pause", open-res.Resumed, open, target.Name))
	}
	return errors.Join(errs...)
}

// killBackend SIGKILLs the target's API server, checks that its watches
// ended within KilledBound and no other did, and starts it again.
func (l *Lab) killBackend(ctx context.Context, target *Node, pid int, streams []*watchStream, store *recorder[storeProbe], res *WatchResult) error {
	killed := time.Now()
	killPID(pid)
	errs := []error{waitGone(ctx, pid, 5*time.Second)}
	// Wait for the target's watches to end, well past the bound, so a late
	// one is measured rather than cut off.
	deadline := killed.Add(KilledBound + 4*time.Second)
	var ends []float64
	for {
		ends = ends[:0]
		for _, ws := range streams {
			if _, ended, _ := ws.state(); ws.node == target.Name && !ended.IsZero() {
				ends = append(ends, millis(ended.Sub(killed)))
			}
		}
		if len(ends) == res.OnTarget || time.Now().After(deadline) || !clock.Sleep(ctx, 10*time.Millisecond) {
			break
		}
	}
	res.Reset = len(ends)
	probes := store.close() // every write under way has ended
	for _, ws := range streams {
		if _, ended, err := ws.state(); ws.node != target.Name && !ended.IsZero() && !res.excused(probes, ended) {
			res.ResetElsewhere++
			if len(res.FirstErrors) < 3 {
				res.FirstErrors = append(res.FirstErrors, fmt.Sprintf("%s: %v", ws.node, err))
			}
		}
	}
	if len(ends) > 0 {
		slices.Sort(ends)
		res.EndedMedianMillis, res.EndedWorstMillis = median(ends), ends[len(ends)-1]
	}
	switch {
	case res.Reset < res.OnTarget:
		errs = append(errs, fmt.Errorf("%d of %d watches to %s's killed API server still open %v after the kill", res.OnTarget-res.Reset, res.OnTarget, target.Name, time.Since(killed).Round(time.Millisecond)))
	case res.EndedWorstMillis > millis(KilledBound):
		errs = append(errs, fmt.Errorf("the last watch to %s's killed API server ended %.0fms after the kill, above %v", target.Name, res.EndedWorstMillis, KilledBound))
	}
	if res.ResetElsewhere > 0 {
		errs = append(errs, fmt.Errorf("%d watches to other API servers ended: %v", res.ResetElsewhere, res.FirstErrors))
	}
	if err := l.startAPIServer(target); err != nil {
		errs = append(errs, fmt.Errorf("restart the API server on %s: %w", target.Name, err))
	}
	return errors.Join(errs...)
}

// needStandInLB refuses a drill that goes through vigil's load balancer to
// the stand-in API servers in a lab without them.
func (l *Lab) needStandInLB(kind string) error {
	s := l.st.Settings
	if s.Impl != ImplVigil || s.LBPort == 0 || (s.BackendPort != 0 && s.BackendPort != APIServerPort) || s.kube() {
		return fmt.Errorf("drill %s needs vigil's load balancer in front of the stand-in API servers (vigil-lab up --lb-port 6443 --backend-port 6443)", kind)
	}
	return nil
}

// nonHolder is the first node, in the lab's order, that is neither holder
// nor cut off: the target of a drill about a non-holder.
func (l *Lab) nonHolder(kind, holder string) (*Node, error) {
	for _, n := range l.st.Nodes {
		if n.Name != holder && !n.Cut {
			return n, nil
		}
	}
	return nil, fmt.Errorf("drill %s needs a node besides the holder %s", kind, holder)
}
