// Package observe serves a process's metrics and status over HTTP: /metrics
// (Prometheus), /livez, /readyz (and /healthz, the same as /livez),
// /status (JSON), and, only when asked for (--pprof), /debug/pprof/. vigil
// run and vigil agent both use it, on a localhost address by default.
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

	"github.com/vigil-ha/vigil"
)

// Probes answer /livez and /readyz; a nil one always passes.
//   - Live fails when the process is stuck and a restart would help: the
//     kubelet's liveness probe and systemd's watchdog act on it.
//   - Ready fails while the process cannot do its job yet (vigil run: no
//     consistent view of the election; the agent: no usable backend).
type Probes struct {
	Live  func(now time.Time) error
	Ready func(now time.Time) error
}

// Options are what Serve serves beyond metrics, probes and status.
type Options struct {
	// Pprof serves Go's profiles under /debug/pprof/. Off by default: a
	// profile shows the process's memory and code paths to whoever reaches
	// the address, and a CPU profile costs CPU while it runs.
	Pprof bool
}

// RegisterBuildInfo adds vigil_build_info{version,revision,goversion}, always
// 1, as Prometheus conventions have it: a query joins on it to see which
// build each process runs.
func RegisterBuildInfo(reg prometheus.Registerer) {
	b := vigil.BuildInfo()
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "vigil_build_info",
		Help: "The running build: release version, VCS revision and Go version; always 1.",
	}, []string{"version", "revision", "goversion"})
	g.WithLabelValues(b.Version, b.Revision, b.GoVersion).Set(1)
	reg.MustRegister(g)
}

func probe(check func(time.Time) error, what string) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if check != nil {
			if err := check(time.Now()); err != nil {
				w.WriteHeader(http.StatusServiceUnavailable)
				fmt.Fprintf(w, "not %s: %v\n", what, err)
				return
			}
		}
		_, _ = w.Write([]byte("ok\n"))
	}
}

// Listen opens addr at start, so a port conflict fails the start instead
// of surfacing later in a log line. flag names the flag in the error.
func Listen(addr, flag string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", flag, addr, err)
	}
	return ln, nil
}

// Serve serves /metrics, /livez, /readyz, /healthz and /status (and what
// opts add) on ln until ctx is cancelled; the returned channel closes when
// the server has stopped. status returns the value /status encodes as JSON.
func Serve(ctx context.Context, ln net.Listener, reg *prometheus.Registry, status func() any, probes Probes, opts Options, log *slog.Logger) <-chan struct{} {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /livez", probe(probes.Live, "live"))
	mux.HandleFunc("GET /healthz", probe(probes.Live, "live")) // the name before /livez; probes and scripts use it
	mux.HandleFunc("GET /readyz", probe(probes.Ready, "ready"))
	// Profiles, for a process that uses more CPU than it should: only
	// when asked for.
	if opts.Pprof {
		mux.HandleFunc("GET /debug/pprof/", pprof.Index)
		mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	}
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
	log.Info("serving /metrics, /livez, /readyz and /status", "address", ln.Addr().String(), "pprof", opts.Pprof)
	return done
}
