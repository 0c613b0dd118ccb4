package observe

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// serve runs Serve on a listener of its own and returns its base URL.
func serve(t *testing.T, opts Options) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0") // the kernel's free port, held from here on
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := Serve(ctx, ln, prometheus.NewRegistry(), func() any { return map[string]string{"state": "fine"} }, Probes{}, opts, slog.New(slog.DiscardHandler))
	t.Cleanup(func() { cancel(); <-done })
	return "http://" + ln.Addr().String()
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// Profiles are served only when asked for; the rest always.
func TestPprofOnlyWhenAskedFor(t *testing.T) {
	for _, on := range []bool{false, true} {
		base := serve(t, Options{Pprof: on})
		for _, p := range []string{"/metrics", "/livez", "/readyz", "/healthz", "/status"} {
			if code, _ := get(t, base+p); code != http.StatusOK {
				t.Errorf("pprof %v: %s answered %d", on, p, code)
			}
		}
		code, body := get(t, base+"/debug/pprof/")
		if on && (code != http.StatusOK || len(body) == 0) {
			t.Errorf("with pprof: /debug/pprof/ answered %d", code)
		}
		if !on && code != http.StatusNotFound {
			t.Errorf("without pprof: /debug/pprof/ answered %d, want 404", code)
		}
	}
}
