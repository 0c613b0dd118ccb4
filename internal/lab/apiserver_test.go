package lab

import (
	"bufio"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// The stand-in API server's /watch refuses an interval it cannot keep
// (unparsable, or below WatchTick) with 400 and says what it wants, and
// streams one line per interval otherwise, the first at once.
func TestStandInWatch(t *testing.T) {
	s := &standIn{cfg: APIServerConfig{Name: "n1"}, log: slog.New(slog.DiscardHandler), mode: ModeOK}
	srv := httptest.NewServer(http.HandlerFunc(s.serve))
	defer srv.Close()
	for _, every := range []string{"x", "50ms", "-1s", "0"} {
		resp, err := http.Get(srv.URL + "/watch?every=" + every)
		if err != nil {
			t.Fatal(err)
		}
		body := make([]byte, 200)
		n, _ := resp.Body.Read(body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body[:n]), "want a duration of at least "+WatchTick.String()) {
			t.Errorf("every=%s: %d %q, want 400 naming the least interval", every, resp.StatusCode, body[:n])
		}
	}
	resp, err := http.Get(srv.URL + "/watch?every=200ms")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	r := bufio.NewReader(resp.Body)
	start := time.Now()
	for seq := range 3 {
		line, err := r.ReadString('\n')
		if err != nil || line != `{"node":"n1","seq":`+string(rune('0'+seq))+"}\n" {
			t.Fatalf("line %d: %q, %v", seq, line, err)
		}
	}
	if took := time.Since(start); took < 350*time.Millisecond {
		t.Fatalf("three lines at 200 ms intervals took %v", took)
	}
}
