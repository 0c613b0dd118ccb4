package feed

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// ServerConfig configures a Server.
type ServerConfig struct {
	// Heartbeat is the longest a follower goes without a line
	// (DefaultHeartbeat when 0).
	Heartbeat time.Duration
	// MaxFollowers bounds the streams served at once; more are answered
	// 503, and those agents read another node's feed (DefaultMaxFollowers
	// when 0).
	MaxFollowers int
	// Metrics, when set, gets vigil_feed_followers and
	// vigil_feed_views_total.
	Metrics prometheus.Registerer
}

// DefaultMaxFollowers is far above any fleet one node serves, and well below
// what its file descriptors allow.
const DefaultMaxFollowers = 20000

// writeTimeout bounds one line's write: a follower that does not read (a
// frozen agent, a full socket buffer) is dropped instead of holding a
// goroutine and its buffers for ever.
const writeTimeout = 5 * time.Second

// Server serves one node's view to any number of followers. Publish sets
// the view; every stream wakes on the same channel, so a change or a
// heartbeat costs one close, and each stream one write.
type Server struct {
	cfg       ServerConfig
	log       *slog.Logger
	followers atomic.Int64

	mu   sync.Mutex
	view *View         // nil until the first Publish
	seq  uint64        // of the current view
	line []byte        // the current view's line
	beat []byte        // the heartbeat line for seq
	wake chan struct{} // closed (and replaced) on each change and heartbeat

	gauge prometheus.GaugeFunc
	views prometheus.Counter
}

// NewServer returns a server with no view: it answers 503 until Publish.
func NewServer(cfg ServerConfig, log *slog.Logger) (*Server, error) {
	if cfg.Heartbeat == 0 {
		cfg.Heartbeat = DefaultHeartbeat
	}
	if cfg.MaxFollowers == 0 {
		cfg.MaxFollowers = DefaultMaxFollowers
	}
	if cfg.Heartbeat < 0 || cfg.MaxFollowers < 0 {
		return nil, errors.New("feed: heartbeat and follower limit must be positive")
	}
	s := &Server{cfg: cfg, log: log, wake: make(chan struct{})}
	s.gauge = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "vigil_feed_followers",
		Help: "Agents reading this node's feed (docs/agent.md, \"At fleet scale\").",
	}, func() float64 { return float64(s.followers.Load()) })
	s.views = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "vigil_feed_views_total",
		Help: "Views this node published to its feed: each is one change of an API server's or an etcd member's health or membership.",
	})
	if cfg.Metrics != nil {
		for _, c := range []prometheus.Collector{s.gauge, s.views} {
			if err := cfg.Metrics.Register(c); err != nil {
				return nil, fmt.Errorf("feed: register metrics: %w", err)
			}
		}
	}
	return s, nil
}

// Publish makes v the view followers get. A view equal to the current one
// changes nothing.
func (s *Server) Publish(v View) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.view != nil && s.view.Equal(v) {
		return
	}
	s.seq++
	s.view = &v
	s.line = encode(line{Seq: s.seq, View: &v})
	s.beat = encode(line{Seq: s.seq})
	s.views.Inc()
	s.wakeLocked()
}

func (s *Server) wakeLocked() {
	close(s.wake)
	s.wake = make(chan struct{})
}

// Followers is how many streams are open.
func (s *Server) Followers() int { return int(s.followers.Load()) }

// Run sends the heartbeats until ctx ends.
func (s *Server) Run(ctx context.Context) {
	t := time.NewTicker(s.cfg.Heartbeat)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			s.mu.Lock()
			s.wakeLocked() // streams see their requests' end
			s.mu.Unlock()
			return
		case <-t.C:
			s.mu.Lock()
			s.wakeLocked()
			s.mu.Unlock()
		}
	}
}

// ServeHTTP streams the view: the current one, each new one, and heartbeats
// between them.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", http.MethodGet)
		http.Error(w, "feed: GET only", http.StatusMethodNotAllowed)
		return
	}
	if n := s.followers.Add(1); n > int64(s.cfg.MaxFollowers) {
		s.followers.Add(-1)
		http.Error(w, "feed: this node serves as many agents as it may; read another node's feed", http.StatusServiceUnavailable)
		return
	}
	defer s.followers.Add(-1)
	s.mu.Lock()
	ready := s.view != nil
	s.mu.Unlock()
	if !ready {
		http.Error(w, "feed: this node has no view yet (starting)", http.StatusServiceUnavailable)
		return
	}
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("Cache-Control", "no-store")
	var sent uint64
	for {
		s.mu.Lock()
		out, seq, wake := s.beat, s.seq, s.wake
		if seq != sent {
			out = s.line
		}
		s.mu.Unlock()
		_ = rc.SetWriteDeadline(time.Now().Add(writeTimeout))
		if _, err := w.Write(out); err != nil {
			return
		}
		if err := rc.Flush(); err != nil {
			return
		}
		sent = seq
		select {
		case <-r.Context().Done():
			return
		case <-wake:
		}
	}
}

// Serve serves the feed on ln until ctx ends, then closes every stream.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	mux := http.NewServeMux()
	mux.Handle(Path, s)
	srv := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 5 * time.Second,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel() // before the Wait: a failed Serve ends the goroutines too
	wg.Go(func() { s.Run(ctx) })
	wg.Go(func() {
		<-ctx.Done()
		_ = srv.Close()
	})
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("feed: serve: %w", err)
	}
	return nil
}
