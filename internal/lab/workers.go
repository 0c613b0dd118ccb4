package lab

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/vigil-ha/vigil/internal/clock"
)

// Worker processes.
const (
	roleAgent        = "agent"
	roleWorkerClient = "client"
	// DefaultDrillWorkers is how many workers scale-workers-unaffected
	// adds to a lab that has none.
	DefaultDrillWorkers = 2
	// failoverGrace extends a failover window past the end of its step:
	// an agent takes up to health interval + timeout (2 s) to drop a
	// silent backend, and clients need a moment to reconnect.
	failoverGrace = 3 * time.Second
)

// workerIP returns the address of worker i (1-based): 10.250.0.200+i.
func workerIP(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, 250, 0, byte(200 + i)})
}

func (l *Lab) clientStatsPath(w *Node) string {
	return filepath.Join(l.nodeDir(w), "client-stats.json")
}

// ensureWorkers brings the lab to at least n workers, each running vigil
// agent and the worker clients, and waits until every client has written
// through etcd and been answered by the API server.
func (l *Lab) ensureWorkers(ctx context.Context, n int) error {
	if l.st.Settings.Impl != ImplVigil {
		return fmt.Errorf("workers need etcd and vigil; the %s lab has neither", l.st.Settings.Impl)
	}
	for len(l.st.Workers) < n {
		i := len(l.st.Workers) + 1
		if i > 9 {
			return fmt.Errorf("lab: at most 9 workers")
		}
		w := &Node{Name: "w" + itoa(i), Index: i, IP: workerIP(i), PIDs: map[string]int{}}
		if err := os.MkdirAll(l.nodeDir(w), 0o755); err != nil {
			return fmt.Errorf("lab: %w", err)
		}
		if err := createHost(ctx, w.Name, w.IP, netip.Addr{}, l.st.Settings.reservedPorts()); err != nil {
			return err
		}
		l.st.Workers = append(l.st.Workers, w)
		if err := l.save(); err != nil {
			return err
		}
		if err := l.startWorker(w); err != nil {
			return err
		}
	}
	for _, w := range l.st.Workers {
		if err := l.waitWorkerWorking(ctx, w, 30*time.Second); err != nil {
			return err
		}
	}
	return nil
}

// startWorker starts vigil-agent and the clients on worker w. The agent's
// seeds are the VIP and the etcd members of the moment; everything after
// that it learns.
func (l *Lab) startWorker(w *Node) error {
	s := l.st.Settings
	server := fmt.Sprintf("https://%s", netip.AddrPortFrom(VIP.Addr(), uint16(s.LBPort)))
	if s.LBPort == 0 {
		server = fmt.Sprintf("https://%s", netip.AddrPortFrom(l.st.Nodes[0].IP, APIServerPort))
	}
	// A copy of the binary per worker, as on a machine of its own: its
	// pages are not shared with the control-plane nodes' vigil, so the
	// agent's memory is measured alone.
	bin := filepath.Join(l.nodeDir(w), "vigil-agent")
	if err := copyFile(l.agentBin, bin); err != nil {
		return err
	}
	if err := l.start(w, roleAgent, bin,
		"--server", server,
		"--apiserver-listen", "127.0.0.1:6443",
		"--backend-port", itoa(APIServerPort),
		"--etcd-listen", "127.0.0.1:2379",
		"--etcd-endpoints", strings.Join(l.etcdEndpoints(), ","),
		"--cache-dir", filepath.Join(l.nodeDir(w), "agent-cache"),
		"--health-ca", l.caPath(),
	); err != nil {
		return err
	}
	return l.start(w, roleWorkerClient, l.selfBin, "worker-client",
		"--name", w.Name,
		"--etcd", "http://127.0.0.1:2379",
		"--api", "https://127.0.0.1:6443",
		"--ca", l.caPath(),
		"--stats", l.clientStatsPath(w))
}

// waitWorkerWorking waits until w's clients have had a put acknowledged and
// an API request answered after their last error.
func (l *Lab) waitWorkerWorking(ctx context.Context, w *Node, d time.Duration) error {
	deadline := time.Now().Add(d)
	var first ClientStats
	for time.Now().Before(deadline) {
		st, err := readClientStats(l.clientStatsPath(w))
		if err == nil {
			if first.Updated.IsZero() {
				first = st
			} else if st.Acked > first.Acked && st.APIRequests > first.APIRequests+2 && len(st.Errors) == len(first.Errors) {
				return nil
			} else if len(st.Errors) != len(first.Errors) {
				first = st
			}
		}
		if !clock.Sleep(ctx, 300*time.Millisecond) {
			return ctx.Err()
		}
	}
	return fmt.Errorf("worker %s: clients not working through the agent within %v (see %s/*.log)", w.Name, d, l.nodeDir(w))
}

// WorkerResult is what scale-workers-unaffected saw on one worker.
type WorkerResult struct {
	Name string `json:"name"`
	// ClientRestarts and AgentRestarts count processes that exited or were
	// replaced during the drill (nothing in the lab restarts them).
	ClientRestarts int `json:"clientRestarts"`
	AgentRestarts  int `json:"agentRestarts"`
	// Errors of the clients during the drill, inside and outside the
	// failover windows (a member leaving, plus failoverGrace).
	ErrorsInWindows int    `json:"errorsInWindows"`
	ErrorsOutside   int    `json:"errorsOutside"`
	FirstOutside    string `json:"firstOutside,omitempty"`
	// KeysAcked were acknowledged by etcd since the client started;
	// KeysMissing of them could not be read back at the end.
	KeysAcked   int `json:"keysAcked"`
	KeysMissing int `json:"keysMissing"`
	// WatchSeen keys arrived through the watch in order; WatchOutOfOrder
	// events skipped or repeated one.
	WatchSeen       int `json:"watchSeen"`
	WatchOutOfOrder int `json:"watchOutOfOrder"`
	APIRequests     int `json:"apiRequests"`
}

// maxWatchLag is how many acknowledged keys the watch may not have
// delivered yet when the counters are written (a put every 100 ms, the
// counters every 250 ms, a watch event within milliseconds).
const maxWatchLag = 3

// ok reports the drill's pass conditions for one worker.
func (w WorkerResult) ok() bool {
	return w.ClientRestarts == 0 && w.AgentRestarts == 0 && w.ErrorsOutside == 0 && w.KeysMissing == 0 &&
		w.WatchOutOfOrder == 0 && w.KeysAcked-w.WatchSeen <= maxWatchLag && w.KeysAcked > 0 && w.APIRequests > 0
}

func (w WorkerResult) String() string {
	s := fmt.Sprintf("%s: restarts %d, agent restarts %d, errors outside windows %d (in windows %d), keys %d written %d missing, watch %d in order %d out of order, api requests %d",
		w.Name, w.ClientRestarts, w.AgentRestarts, w.ErrorsOutside, w.ErrorsInWindows, w.KeysAcked, w.KeysMissing, w.WatchSeen, w.WatchOutOfOrder, w.APIRequests)
	if w.FirstOutside != "" {
		s += " [first outside: " + w.FirstOutside + "]"
	}
	return s
}

// window is a failover window: from a step that takes a member away until
// failoverGrace after it ended.
type window struct{ from, to time.Time }

func inWindows(ws []window, t time.Time) bool {
	for _, w := range ws {
		if !t.Before(w.from) && !t.After(w.to) {
			return true
		}
	}
	return false
}

// DrillScaleWorkers is the CFCR story: the control plane goes 3→2→3→5, one
// node is replaced with vigil members replace, and back to 3, while workers
// run vigil agent with an etcd watch client (flannel's part) and an API
// server poller (kubelet's part) on its local endpoints. Nothing on a worker
// may restart, no client may fail outside the moments a member leaves, and
// every key written must be readable at the end. Each removal takes the
// node that carries the most worker connections, the VIP holder included
// (the VIP then moves: the workers do not use it), so the clients must
// follow.
const DrillScaleWorkers = "scale-workers-unaffected"

func (l *Lab) scaleWorkers(ctx context.Context, r *Result) error {
	holder, err := l.settledVigilLab(ctx, DrillScaleWorkers)
	if err != nil {
		return err
	}
	if len(l.st.Nodes) != 3 {
		return fmt.Errorf("drill %s starts from 3 control-plane nodes; the lab has %d", DrillScaleWorkers, len(l.st.Nodes))
	}
	if err := l.ensureWorkers(ctx, DefaultDrillWorkers); err != nil {
		return err
	}
	r.Before = holder
	pids := map[string]map[string]int{}
	for _, w := range l.st.Workers {
		pids[w.Name] = map[string]int{roleAgent: w.PIDs[roleAgent], roleWorkerClient: w.PIDs[roleWorkerClient]}
	}
	pr, err := startProber(probeInterval, l.st.Settings.vipAddr())
	if err != nil {
		return err
	}
	defer pr.close()
	start := time.Now()
	phase := r.phaser(start)
	var windows []window
	remove := func() error {
		from := time.Now()
		victim, conns := l.busiestForWorkers(ctx, "")
		if holder, err = l.removeNode(ctx, victim); err != nil {
			return err
		}
		windows = append(windows, window{from, time.Now().Add(failoverGrace)})
		phase(fmt.Sprintf("remove %s [%d worker conns] (%d)", victim.Name, conns, len(l.st.Nodes)), "")
		return nil
	}
	join := func() error {
		n, err := l.joinNode(ctx, holder)
		if err != nil {
			return err
		}
		phase(fmt.Sprintf("join %s (%d)", n.Name, len(l.st.Nodes)), "")
		return nil
	}
	// 3 → 2 → 3 → 5
	for _, step := range []func() error{remove, join, join, join} {
		if err := step(); err != nil {
			return err
		}
	}
	// Replace one node (learner, promote, remove the old one): 5 → 5.
	from := time.Now()
	old, conns := l.busiestForWorkers(ctx, holder)
	n, out, err := l.replaceWith(ctx, holder, old, func(string, string) {})
	if err != nil {
		return err
	}
	windows = append(windows, window{from, time.Now().Add(failoverGrace)})
	phase(fmt.Sprintf("replace %s [%d worker conns] with %s (%d)", old.Name, conns, n.Name, len(l.st.Nodes)), lastLine(out))
	// 5 → 3
	for range 2 {
		if err := remove(); err != nil {
			return err
		}
	}
	// Let the last window close and the clients run on a while.
	if !clock.Sleep(ctx, failoverGrace+2*time.Second) {
		return ctx.Err()
	}
	if err := l.judgeWorkers(ctx, r, start, windows, pids); err != nil {
		return err
	}
	// The VIP may have moved (a removed node may have held it); it must be
	// on exactly one node.
	return l.finishStill(ctx, r, pr, start, "", "while the control plane was scaled")
}

// agentStatus is the part of vigil agent's /status the lab reads.
type agentStatus struct {
	Upstreams []struct {
		Name     string `json:"name"`
		Backends []struct {
			Address     string `json:"address"`
			Connections int    `json:"connections"`
		} `json:"backends"`
	} `json:"upstreams"`
}

// busiestForWorkers picks the node, other than except, that carries the
// most worker connections (etcd and API server, through the agents), so
// that taking it away makes the workers' clients move. It returns the node
// and that count.
func (l *Lab) busiestForWorkers(ctx context.Context, except string) (*Node, int) {
	conns := map[string]int{}
	for _, w := range l.st.Workers {
		var st agentStatus
		if err := getJSON(ctx, nodeNS(w.Name), "http://127.0.0.1:9559/status", &st); err != nil {
			l.log.Warn("cannot read an agent's status", "worker", w.Name, "err", err)
			continue
		}
		for _, u := range st.Upstreams {
			for _, b := range u.Backends {
				host, _, _ := strings.Cut(b.Address, ":")
				conns[host] += b.Connections
			}
		}
	}
	best, most := l.otherNode(except), -1
	for _, n := range l.st.Nodes {
		if n.Name != except && conns[n.IP.String()] > most {
			best, most = n, conns[n.IP.String()]
		}
	}
	return best, max(most, 0)
}

// judgeWorkers reads every worker's counters and checks its keys.
func (l *Lab) judgeWorkers(ctx context.Context, r *Result, start time.Time, windows []window, pids map[string]map[string]int) error {
	cli, err := etcdClient(l.etcdEndpoints())
	if err != nil {
		return err
	}
	defer cli.Close()
	for _, w := range l.st.Workers {
		wr := WorkerResult{Name: w.Name}
		if p := pids[w.Name][roleAgent]; p == 0 || !alive(p) || w.PIDs[roleAgent] != p {
			wr.AgentRestarts++
		}
		st, err := readClientStats(l.clientStatsPath(w))
		if err != nil {
			return fmt.Errorf("worker %s: %w", w.Name, err)
		}
		if p := pids[w.Name][roleWorkerClient]; p == 0 || !alive(p) || st.PID != p || st.Started.After(start) {
			wr.ClientRestarts++
		}
		for _, e := range st.Errors {
			if e.At.Before(start) {
				continue
			}
			if inWindows(windows, e.At) {
				wr.ErrorsInWindows++
				continue
			}
			wr.ErrorsOutside++
			if wr.FirstOutside == "" {
				wr.FirstOutside = fmt.Sprintf("%s %s: %s", e.At.Format("15:04:05.000"), e.Op, e.Err)
			}
		}
		wr.KeysAcked, wr.WatchSeen, wr.WatchOutOfOrder, wr.APIRequests = st.Acked, st.WatchSeen, st.WatchOutOfOrder, st.APIRequests
		gctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := cli.Get(gctx, WorkerKeyPrefix(w.Name), clientv3.WithPrefix(), clientv3.WithKeysOnly())
		cancel()
		if err != nil {
			return fmt.Errorf("read back the keys of %s: %w", w.Name, err)
		}
		have := map[string]bool{}
		for _, kv := range resp.Kvs {
			have[string(kv.Key)] = true
		}
		for seq := range st.Acked {
			if !have[workerKey(w.Name, seq)] {
				wr.KeysMissing++
			}
		}
		r.Workers = append(r.Workers, wr)
	}
	return nil
}

func copyFile(from, to string) error {
	b, err := os.ReadFile(from)
	if err != nil {
		return fmt.Errorf("lab: %w", err)
	}
	f, err := os.OpenFile(to+".tmp", os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o755)
	if err != nil {
		return fmt.Errorf("lab: %w", err)
	}
	_, err = f.Write(b)
	if err == nil {
		// Written back, like an installed binary: dirty page-cache pages
		// would stay resident in the process that maps them.
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("lab: %w", err)
	}
	return os.Rename(to+".tmp", to)
}
