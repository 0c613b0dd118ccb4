package testkit

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// fatalTB records a Fatalf instead of failing the test that runs it.
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Helper() {}
func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// run calls f with a fatalTB in a goroutine of its own (Fatalf ends it) and
// returns what Fatalf said, "" if nothing.
func run(t *testing.T, f func(testing.TB)) string {
	tb := &fatalTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(tb)
	}()
	<-done
	return tb.msg
}

func TestWaitFor(t *testing.T) {
	var n atomic.Int32
	took := WaitFor(t, 5*time.Second, "the third look", func() bool { return n.Add(1) >= 3 })
	if n.Load() != 3 || took > 2*time.Second {
		t.Fatalf("looked %d times in %v, want 3", n.Load(), took)
	}
	msg := run(t, func(tb testing.TB) { WaitFor(tb, 30*time.Millisecond, "never", func() bool { return false }) })
	if !strings.Contains(msg, "timed out after 30ms waiting for never") {
		t.Fatalf("Fatalf said %q", msg)
	}
}

func TestWaitNil(t *testing.T) {
	var n atomic.Int32
	WaitNil(t, 5*time.Second, "the second try", func() error {
		if n.Add(1) < 2 {
			return errors.New("not yet")
		}
		return nil
	})
	msg := run(t, func(tb testing.TB) {
		WaitNil(tb, 30*time.Millisecond, "never", func() error { return errors.New("still down") })
	})
	if !strings.Contains(msg, "waiting for never: still down") {
		t.Fatalf("Fatalf said %q", msg)
	}
}

func TestContextEndsAfterD(t *testing.T) {
	ctx := Context(t, 20*time.Millisecond)
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the context did not end")
	}
}

func TestLogWriterKeepsTheEndAndDropsAfterDone(t *testing.T) {
	w := &logWriter{}
	line := strings.Repeat("x", 1023) + "\n"
	for range 3 * logKeep / len(line) {
		w.Write([]byte(line))
	}
	w.Write([]byte("last\n"))
	if w.buf.Len() > logKeep || !strings.HasSuffix(w.buf.String(), "last\n") {
		t.Fatalf("kept %d bytes ending %q; want at most %d ending with the last record", w.buf.Len(), w.buf.String()[w.buf.Len()-10:], logKeep)
	}
	w.done = true
	n := w.buf.Len()
	if k, err := w.Write([]byte("late\n")); k != 5 || err != nil || w.buf.Len() != n {
		t.Fatalf("a write after the test: %d, %v, buffer %d -> %d bytes", k, err, n, w.buf.Len())
	}
}

func TestAlways(t *testing.T) {
	var n atomic.Int32
	Always(t, 50*time.Millisecond, "below 1000 looks", func() bool { return n.Add(1) < 1000 })
	if n.Load() < 2 {
		t.Fatalf("looked %d times in 50ms", n.Load())
	}
	n.Store(0)
	msg := run(t, func(tb testing.TB) { Always(tb, 5*time.Second, "below 3 looks", func() bool { return n.Add(1) < 3 }) })
	if !strings.Contains(msg, "no longer below 3 looks") || n.Load() != 3 {
		t.Fatalf("Fatalf said %q after %d looks", msg, n.Load())
	}
}

// Record keeps what any goroutine adds, in order; All copies, Take empties.
func TestRecord(t *testing.T) {
	var r Record[int]
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 100 {
			r.Add(i)
		}
	}()
	<-done
	all := r.All()
	if len(all) != 100 || all[0] != 0 || all[99] != 99 {
		t.Fatalf("All = %v", all)
	}
	all[0] = -1
	if got := r.Take(); len(got) != 100 || got[0] != 0 {
		t.Fatalf("Take after changing All's copy = %v", got)
	}
	if got := r.All(); len(got) != 0 {
		t.Fatalf("All after Take = %v", got)
	}
}
