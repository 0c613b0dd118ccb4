package election

import (
	"testing"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/goleak"
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
	goleak.VerifyTestMain(m,
		// Process-wide goroutines started by libraries etcd uses.
		goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"),
		goleak.IgnoreAnyFunction("github.com/golang/glog.(*fileSink).flushDaemon"),
		goleak.IgnoreAnyFunction("google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run"),
		// Keep-alive connections of embedded etcd's peer transport to a
		// member killed with HardStop or removed; they belong to etcd (vigil
		// speaks no HTTP).
		goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
		// Peer requests the hard-stopped member was serving when it died
		// (vigil runs no HTTP server).
		goleak.IgnoreAnyFunction("net/http.(*conn).serve"),
		goleak.IgnoreAnyFunction("net/http.(*connReader).backgroundRead"),
	)
}
