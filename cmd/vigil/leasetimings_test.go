package main

import (
	"testing"
	"time"

	"github.com/vigil-ha/vigil/internal/daemon"
	"github.com/vigil-ha/vigil/internal/election"
)

// --election kubernetes has timings of its own for the flags not given;
// a flag given keeps its value.
func TestLeaseTimings(t *testing.T) {
	for _, tc := range []struct {
		args                []string
		lease, renew, retry time.Duration
	}{
		{nil, election.DefaultAPILeaseDuration, election.DefaultAPIRenewDeadline, election.DefaultAPIRetryPeriod},
		{[]string{"--retry-period", "150ms"}, election.DefaultAPILeaseDuration, election.DefaultAPIRenewDeadline, 150 * time.Millisecond},
		{[]string{"--lease-duration", "800ms", "--renew-deadline", "500ms"}, 800 * time.Millisecond, 500 * time.Millisecond, election.DefaultAPIRetryPeriod},
	} {
		cmd := newRunCmd()
		if err := cmd.Flags().Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		var cfg daemon.Config
		for name, v := range map[string]*time.Duration{"lease-duration": &cfg.LeaseDuration, "renew-deadline": &cfg.RenewDeadline, "retry-period": &cfg.RetryPeriod} {
			d, err := cmd.Flags().GetDuration(name)
			if err != nil {
				t.Fatal(err)
			}
			*v = d
		}
		leaseTimings(cmd.Flags(), &cfg)
		if cfg.LeaseDuration != tc.lease || cfg.RenewDeadline != tc.renew || cfg.RetryPeriod != tc.retry {
			t.Errorf("%v: lease %v renew %v retry %v, want %v %v %v", tc.args, cfg.LeaseDuration, cfg.RenewDeadline, cfg.RetryPeriod, tc.lease, tc.renew, tc.retry)
		}
		if err := election.ValidateTimings(cfg.LeaseDuration, cfg.RenewDeadline, cfg.RetryPeriod); err != nil {
			t.Errorf("%v: %v", tc.args, err)
		}
	}
}
