package lab

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/vigil-ha/vigil/internal/clock"
)

// WorkerClientConfig configures the long-lived clients a lab worker runs
// through its vigil agent.
type WorkerClientConfig struct {
	Name     string // worker name; keys live under /lab/workers/<name>/
	Etcd     string // etcd URL, the agent's local endpoint
	API      string // API server URL, the agent's local endpoint
	CA       string // CA of the stand-in API servers
	Stats    string // file the counters are written to
	Interval time.Duration
}

// ClientError is one failed operation of a worker client.
type ClientError struct {
	At  time.Time `json:"at"`
	Op  string    `json:"op"`
	Err string    `json:"err"`
}

// ClientStats are a worker client's counters, rewritten every 250 ms.
type ClientStats struct {
	PID     int       `json:"pid"`
	Started time.Time `json:"started"`
	Updated time.Time `json:"updated"`
	// Acked keys: seq 0..Acked-1 were acknowledged by etcd. A failed put
	// is retried with the same seq, so there are no holes.
	Acked int `json:"acked"`
	// WatchSeen is the number of keys the watch delivered in order;
	// WatchOutOfOrder counts events that skipped or repeated a seq.
	WatchSeen       int `json:"watchSeen"`
	WatchOutOfOrder int `json:"watchOutOfOrder"`
	// WatchRewrites are events for the key just seen: a put that failed
	// ambiguously (a timeout while a member left) had taken effect, and
	// its retry wrote the same key again. Not a watch fault.
	WatchRewrites int `json:"watchRewrites"`
	APIRequests   int `json:"apiRequests"`
	// Errors are every failed put, watch and API request, oldest first
	// (at most maxClientErrors).
	Errors []ClientError `json:"errors"`
}

const maxClientErrors = 2000

// WorkerKeyPrefix is where worker name's keys are written.
func WorkerKeyPrefix(name string) string { return "/lab/workers/" + name + "/" }

func workerKey(name string, seq int) string { return fmt.Sprintf("%s%08d", WorkerKeyPrefix(name), seq) }

// RunWorkerClient plays flannel and kubelet on a worker: an etcd client that
// writes a counter key every Interval and watches its own prefix, and an
// HTTPS client that polls the API server's /readyz over a kept-alive
// connection. Both use only the agent's local endpoints. It never exits on
// an error: it records it and goes on, as a real agent would be expected to
// (a restart would be counted by the lab from the pid).
func RunWorkerClient(ctx context.Context, cfg WorkerClientConfig) error {
	if cfg.Interval <= 0 {
		cfg.Interval = 100 * time.Millisecond
	}
	pem, err := os.ReadFile(cfg.CA)
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return fmt.Errorf("no certificate in %s", cfg.CA)
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:            []string{cfg.Etcd},
		DialTimeout:          2 * time.Second,
		DialKeepAliveTime:    2 * time.Second,
		DialKeepAliveTimeout: 2 * time.Second,
		Logger:               zap.NewNop(),
	})
	if err != nil {
		return err
	}
	defer cli.Close()
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
		Proxy:           nil,
	}}
	w := &workerClient{cfg: cfg, cli: cli, hc: hc, st: ClientStats{PID: os.Getpid(), Started: time.Now()}}
	// Start where an earlier run left off: the writer after the keys that
	// exist, the watch after the revision that read saw.
	var start *clientv3.GetResponse
	for {
		gctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		start, err = cli.Get(gctx, WorkerKeyPrefix(cfg.Name), clientv3.WithPrefix(), clientv3.WithCountOnly())
		cancel()
		if err == nil {
			break
		}
		w.fail("etcd get", err)
		if !clock.Sleep(ctx, 200*time.Millisecond) {
			return ctx.Err()
		}
	}
	w.st.Acked = int(start.Count)
	var wg sync.WaitGroup
	wg.Go(func() { w.writer(ctx, int(start.Count)) })
	wg.Go(func() { w.watcher(ctx, start.Header.Revision, int(start.Count)) })
	wg.Go(func() { w.poller(ctx) })
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			wg.Wait()
			return w.save()
		case <-t.C:
			if err := w.save(); err != nil {
				fmt.Fprintln(os.Stderr, "save stats:", err)
			}
		}
	}
}

type workerClient struct {
	cfg WorkerClientConfig
	cli *clientv3.Client
	hc  *http.Client

	mu sync.Mutex
	st ClientStats
}

func (w *workerClient) fail(op string, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.st.Errors) < maxClientErrors {
		w.st.Errors = append(w.st.Errors, ClientError{At: time.Now(), Op: op, Err: err.Error()})
	}
}

func (w *workerClient) writer(ctx context.Context, seq int) {
	t := time.NewTicker(w.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := w.cli.Put(pctx, workerKey(w.cfg.Name, seq), strconv.Itoa(seq))
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			w.fail("etcd put", err)
			continue
		}
		seq++
		w.mu.Lock()
		w.st.Acked = seq
		w.mu.Unlock()
	}
}

// watcher follows the prefix after revision rev, expecting seq next first;
// if the watch ends (it should not: the client resumes it across
// reconnections) it starts again after the last revision seen, and says so.
func (w *workerClient) watcher(ctx context.Context, rev int64, next int) {
	prefix := WorkerKeyPrefix(w.cfg.Name)
	for ctx.Err() == nil {
		opts := []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithRev(rev + 1)}
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		for resp := range w.cli.Watch(wctx, prefix, opts...) {
			if err := resp.Err(); err != nil {
				w.fail("etcd watch", err)
				break
			}
			for _, ev := range resp.Events {
				rev = ev.Kv.ModRevision
				seq, err := strconv.Atoi(strings.TrimPrefix(string(ev.Kv.Key), prefix))
				w.mu.Lock()
				switch {
				case err == nil && seq == next:
					w.st.WatchSeen++
				case err == nil && seq == next-1:
					w.st.WatchRewrites++
				default:
					w.st.WatchOutOfOrder++
				}
				w.mu.Unlock()
				if err == nil && seq >= next {
					next = seq + 1
				}
			}
		}
		cancel()
		if ctx.Err() == nil {
			w.fail("etcd watch", errors.New("watch ended; resuming after the last revision seen"))
			clock.Sleep(ctx, 100*time.Millisecond)
		}
	}
}

func (w *workerClient) poller(ctx context.Context) {
	t := time.NewTicker(w.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		err := w.poll(ctx)
		if ctx.Err() != nil {
			return
		}
		w.mu.Lock()
		w.st.APIRequests++
		w.mu.Unlock()
		if err != nil {
			w.fail("api get", err)
		}
	}
}

func (w *workerClient) poll(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, w.cfg.API+"/readyz", nil)
	if err != nil {
		return err
	}
	resp, err := w.hc.Do(req)
	if err != nil {
		return err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	return err
}

func (w *workerClient) save() error {
	w.mu.Lock()
	w.st.Updated = time.Now()
	b, err := json.Marshal(w.st)
	w.mu.Unlock()
	if err != nil {
		return err
	}
	tmp := w.cfg.Stats + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, w.cfg.Stats)
}

// readClientStats reads a worker client's stats file.
func readClientStats(path string) (ClientStats, error) {
	var st ClientStats
	b, err := os.ReadFile(path)
	if err != nil {
		return st, err
	}
	return st, json.Unmarshal(b, &st)
}
