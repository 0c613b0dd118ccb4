package election

import (
	"strings"
	"testing"
	"time"
)

// Ready follows how fresh the view of the lock is; Live how recently the
// loop turned, and is generous.
func TestReadyAndLive(t *testing.T) {
	e := &Elector{cfg: Config{LeaseDuration: 2 * time.Second, RenewDeadline: 1500 * time.Millisecond, RetryPeriod: 200 * time.Millisecond}}
	now := time.Now()
	if err := e.Ready(now); err == nil || !strings.Contains(err.Error(), "holder is unknown") {
		t.Fatalf("Ready before any read = %v", err)
	}
	if err := e.Live(now); err != nil {
		t.Fatalf("Live before Run = %v, want live", err)
	}
	e.status.Seen = now
	e.beat.Store(now.UnixNano())
	// readyWindow = 2*(2s + 2s, the read budget) = 8s; liveWindow = max(30s, 4*(2s+1s+2s)).
	for _, c := range []struct {
		after       time.Duration
		ready, live bool
	}{
		{0, true, true},
		{7900 * time.Millisecond, true, true},
		{8100 * time.Millisecond, false, true},
		{29 * time.Second, false, true},
		{31 * time.Second, false, false},
	} {
		if err := e.Ready(now.Add(c.after)); (err == nil) != c.ready {
			t.Errorf("Ready %v after the last read = %v, want ready=%v", c.after, err, c.ready)
		}
		if err := e.Live(now.Add(c.after)); (err == nil) != c.live {
			t.Errorf("Live %v after the last turn = %v, want live=%v", c.after, err, c.live)
		}
	}
}
