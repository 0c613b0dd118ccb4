package etcdtest

import (
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestInterestingKeepsWhereTestsWait(t *testing.T) {
	dump := strings.Join([]string{
		"goroutine 1 [chan receive]:\ntesting.(*T).Run(...)\n\t/go/src/testing/testing.go:1",
		"goroutine 7 [select]:\ngo.etcd.io/etcd/server/v3/etcdserver/api/rafthttp.(*pipeline).handle(...)",
		"goroutine 9 [semacquire]:\ngo.etcd.io/etcd/server/v3/embed.(*Etcd).Close(...)\ngithub.com/vigil-ha/vigil/internal/etcdtest.(*Cluster).Close(...)",
		"goroutine 11 [IO wait]:\ngithub.com/vigil-ha/vigil/internal/membership.TestPrune(...)",
	}, "\n\n")
	got := string(interesting([]byte(dump)))
	for _, want := range []string{"goroutine 9 ", "goroutine 11 "} {
		if !strings.Contains(got, want) {
			t.Errorf("%q left out:\n%s", want, got)
		}
	}
	for _, not := range []string{"goroutine 1 ", "goroutine 7 "} {
		if strings.Contains(got, not) {
			t.Errorf("%q kept:\n%s", not, got)
		}
	}
}

// findLeaks waits for goroutines that end by themselves, and reports one
// that does not once the wait is over.
func TestFindLeaksWaitsForGoroutinesThatEnd(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	done := make(chan struct{})
	go func() { // ends after goleak's own retries (about 2 s) are over
		time.Sleep(3 * time.Second)
		close(done)
	}()
	start := time.Now()
	if err := findLeaks(10*time.Second, ignore); err != nil {
		t.Fatalf("a goroutine that ends after 3 s was reported: %v", err)
	}
	if took := time.Since(start); took < 2*time.Second {
		t.Fatalf("findLeaks returned after %v, before the goroutine could have ended", took)
	}
	<-done

	stuck := make(chan struct{})
	defer close(stuck)
	go func() { <-stuck }()
	start = time.Now()
	if err := findLeaks(time.Second, ignore); err == nil {
		t.Fatal("a goroutine blocked for good was not reported")
	}
	if took := time.Since(start); took < time.Second {
		t.Fatalf("reported after %v, before the wait was over", took)
	}
}
