// Package clock holds the one way vigil waits: for a duration, or until
// its context is done, whichever comes first.
package clock

import (
	"context"
	"time"
)

// Sleep waits d, or until ctx is done; it reports whether the whole d
// passed (false: ctx ended it, or was done already, even for d = 0).
func Sleep(ctx context.Context, d time.Duration) bool {
	if ctx.Err() != nil {
		return false
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
