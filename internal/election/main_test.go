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
	etcdtest.Main(m, etcdtest.LeakOptions()...)
}
