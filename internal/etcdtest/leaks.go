package etcdtest

import "go.uber.org/goleak"

// LeakOptions are the goleak options for packages that run embedded etcd:
// they ignore goroutines that belong to etcd and the libraries it uses, and
// nothing of vigil's (vigil runs no HTTP server and no peer transport).
func LeakOptions() []goleak.Option {
	return []goleak.Option{
		// Process-wide goroutines started by libraries etcd uses.
		goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"),
		goleak.IgnoreAnyFunction("github.com/golang/glog.(*fileSink).flushDaemon"),
		goleak.IgnoreAnyFunction("google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run"),
		// Keep-alive connections of embedded etcd's peer transport to a
		// member killed with HardStop or removed.
		goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
		// Peer requests a stopped or removed member was serving when it
		// went.
		goleak.IgnoreAnyFunction("net/http.(*conn).serve"),
		goleak.IgnoreAnyFunction("net/http.(*connReader).backgroundRead"),
	}
}
