package clock

import (
	"context"
	"testing"
	"testing/synctest"
	"time"
)

func TestSleep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		if !Sleep(context.Background(), time.Second) || time.Since(start) != time.Second {
			t.Fatalf("Sleep(1s) ended after %v", time.Since(start))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		start = time.Now()
		if Sleep(ctx, time.Hour) || time.Since(start) != 300*time.Millisecond {
			t.Fatalf("Sleep(1h) with a context done after 300ms: ended after %v", time.Since(start))
		}
		if Sleep(ctx, 0) {
			t.Fatal("Sleep on a done context reported the whole wait")
		}
	})
}
