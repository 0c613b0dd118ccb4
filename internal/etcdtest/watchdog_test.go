package etcdtest

import (
	"strings"
	"testing"
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
