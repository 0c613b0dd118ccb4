package daemon

import (
	"errors"
	"testing"
	"time"
)

type discardCloser struct{}

func (discardCloser) Write(p []byte) (int, error) { return len(p), nil }
func (discardCloser) Close() error                { return nil }

// The holder keeps the VIP while its guard's oldest unanswered deadline is
// younger than the bound; a candidate campaigns only within half of it.
func TestGuardSilenceBoundsHolderAndCandidate(t *testing.T) {
	g := &guardProc{ackBound: 500 * time.Millisecond}
	for name, f := range map[string]func() error{"Eligible": g.Eligible, "EligibleToCampaign": g.EligibleToCampaign} {
		if err := f(); !errors.Is(err, errNoGuard) {
			t.Errorf("%s without a guard = %v, want %v", name, err, errNoGuard)
		}
	}
	g.w = discardCloser{}
	for _, tc := range []struct {
		silent           time.Duration // age of the one unanswered deadline; 0: none
		holder, campaign bool          // whether each may hold or take the VIP
	}{
		{0, true, true},
		{100 * time.Millisecond, true, true},
		{300 * time.Millisecond, true, false},
		{600 * time.Millisecond, false, false},
	} {
		g.words, g.acked = 0, 0
		if tc.silent > 0 {
			g.words = 1
			g.sentAt[1] = time.Now().Add(-tc.silent)
		}
		for name, c := range map[string]struct {
			f  func() error
			ok bool
		}{"Eligible": {g.Eligible, tc.holder}, "EligibleToCampaign": {g.EligibleToCampaign, tc.campaign}} {
			err := c.f()
			if c.ok && err != nil {
				t.Errorf("%s with a deadline unanswered for %v = %v, want nil", name, tc.silent, err)
			}
			if !c.ok && !errors.Is(err, errGuardSilent) {
				t.Errorf("%s with a deadline unanswered for %v = %v, want %v", name, tc.silent, err, errGuardSilent)
			}
		}
	}
	// Answered: both again.
	g.acked = g.words
	if err := g.EligibleToCampaign(); err != nil {
		t.Errorf("EligibleToCampaign once the guard answered = %v", err)
	}
}
