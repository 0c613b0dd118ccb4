// Package testkit holds the helpers that every package's tests share:
// waiting on a condition instead of sleeping, a context bounded by the
// test, and a logger that writes into the test's own output (shown when the
// test fails, or with -v).
package testkit

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// pollEvery is how often WaitFor and WaitNil look again while waiting up to
// d: often enough that a wait ends within 1 % of d after the condition
// holds (at least 5 ms apart, at most 50 ms), rarely enough that a
// condition that reads etcd does not load it.
func pollEvery(d time.Duration) time.Duration {
	return min(max(d/100, 5*time.Millisecond), 50*time.Millisecond)
}

// WaitFor waits until cond holds and returns how long that took; if d
// passes first, it fails the test, naming what it waited for.
func WaitFor(t testing.TB, d time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for tick := pollEvery(d); ; time.Sleep(tick) {
		if cond() {
			return time.Since(start)
		}
		if time.Since(start) > d {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
	}
}

// WaitNil waits until f returns nil; if d passes first, it fails the test
// with f's last error.
func WaitNil(t testing.TB, d time.Duration, what string, f func() error) {
	t.Helper()
	WaitNilEvery(t, d, pollEvery(d), what, f)
}

// WaitNilEvery is WaitNil looking every tick: for an f that costs (runs a
// command, asks a server several things).
func WaitNilEvery(t testing.TB, d, tick time.Duration, what string, f func() error) {
	t.Helper()
	start := time.Now()
	for ; ; time.Sleep(tick) {
		err := f()
		if err == nil {
			return
		}
		if time.Since(start) > d {
			t.Fatalf("timed out after %v waiting for %s: %v", d, what, err)
		}
	}
}

// Context is a context that ends after d, or once the test's clean-ups
// registered before it have run (not t.Context, which ends before every
// clean-up: a clean-up may still need the context).
func Context(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// logKeep is how much of a test's log Log keeps for a failure: the last
// MiB or so.
const logKeep = 1 << 20

// Log is a logger for the code under test, at debug level. With -v it
// writes to stderr as it goes; otherwise it keeps the last MiB and prints
// it if the test fails. Records written after the test ended (a goroutine
// still winding down) are dropped: t.Log would panic.
func Log(t testing.TB) *slog.Logger {
	w := &logWriter{verbose: testing.Verbose()}
	t.Cleanup(func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.done = true
		if t.Failed() && !w.verbose && w.buf.Len() > 0 {
			t.Logf("the log of the code under test:\n%s", w.buf.Bytes())
		}
	})
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug})).With("test", t.Name())
}

type logWriter struct {
	verbose bool
	mu      sync.Mutex
	buf     bytes.Buffer
	done    bool
}

func (w *logWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case w.done:
	case w.verbose:
		_, _ = os.Stderr.Write(p)
	default:
		if w.buf.Len()+len(p) > logKeep {
			rest := w.buf.Bytes()[w.buf.Len()/2:]
			w.buf = *bytes.NewBuffer(append([]byte(nil), rest...))
		}
		w.buf.Write(p)
	}
	return len(p), nil
}

// Always checks, for d, that cond keeps holding, and fails the test at the
// first look where it does not: the way to assert that something does not
// happen for a while (rather than sleeping, then looking once).
func Always(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	start := time.Now()
	for tick := pollEvery(d); ; time.Sleep(tick) {
		if !cond() {
			t.Fatalf("after %v: no longer %s", time.Since(start).Round(time.Millisecond), what)
		}
		if time.Since(start) > d {
			return
		}
	}
}

// Record keeps values added from any goroutine (callbacks, fakes), in the
// order they were added. The zero value is ready to use.
type Record[T any] struct {
	mu    sync.Mutex
	items []T
}

// Add appends v.
func (r *Record[T]) Add(v T) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.items = append(r.items, v)
}

// All returns a copy of every value so far.
func (r *Record[T]) All() []T {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]T(nil), r.items...)
}

// Take returns every value so far and forgets them.
func (r *Record[T]) Take() []T {
	r.mu.Lock()
	defer r.mu.Unlock()
	items := r.items
	r.items = nil
	return items
}

// HappensAt checks, inside a testing/synctest bubble, that happened turns
// true exactly d from now: false 1 ns before d, true at d. It advances the
// bubble's clock to each instant and lets every goroutine woken there run
// (synctest.Wait) before it asks. what names the event in the failure.
func HappensAt(t testing.TB, d time.Duration, what string, happened func() bool) {
	t.Helper()
	time.Sleep(d - time.Nanosecond)
	synctest.Wait()
	if happened() {
		t.Fatalf("%s 1 ns before %v", what, d)
	}
	time.Sleep(time.Nanosecond)
	synctest.Wait()
	if !happened() {
		t.Fatalf("no %s at %v", what, d)
	}
}
