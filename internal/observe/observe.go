// Package observe serves a process's metrics and status over HTTP: /metrics
// (Prometheus), /healthz, /status (JSON) and /debug/pprof/. vigil run and
// vigil agent both use it, on a localhost address by default.
package observe

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Listen opens addr at start, so a port conflict fails the start instead
// of surfacing later in a log line. flag names the flag in the error.
func Listen(addr, flag string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", flag, addr, err)
	}
	return ln, nil
}

// Serve serves /metrics, /healthz and /status on ln until ctx is cancelled;
// the returned channel closes when the server has stopped. status returns
// the value /status encodes as JSON.
func Serve(ctx context.Context, ln net.Listener, reg *prometheus.Registry, status func() any, log *slog.Logger) <-chan struct{} {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	// Profiles, for a process that uses more CPU than it should. The
	// address is localhost by default; whoever can reach it can see these.
	mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(status())
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics server stopped", "err", err)
		}
	}()
	context.AfterFunc(ctx, func() {
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	})
	log.Info("serving /metrics, /healthz and /status", "address", ln.Addr().String())
	return done
}
