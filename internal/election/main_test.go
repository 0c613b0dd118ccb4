package election

import (
	"testing"

	"go.etcd.io/etcd/server/v3/embed"

	"github.com/vigil-ha/vigil/internal/etcdtest"
)

func startEmbedded(cfg *embed.Config) (*embed.Etcd, error) {
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, err
	}
	<-e.Server.ReadyNotify()
	return e, nil
}

func TestMain(m *testing.M) {
	// The package kills raft leaders (HardStop) and runs 3-member clusters
	// for many seconds: etcd's peer transport then leaves keep-alive
	// connections behind now and then (seen once in a full run, and in
	// most runs of TestCutOffHolderStepsDownBeforeTakeover alone, before
	// and after the renewal pipeline). The price: an HTTP goroutine leaked
	// by the Lease backend's client would not be reported here either.
	etcdtest.Main(m, etcdtest.MemberChangeLeakOptions()...)
}
