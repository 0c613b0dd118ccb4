package etcdtest

import "go.uber.org/goleak"

// LeakOptions are the goleak options for packages that run embedded etcd:
// they ignore the process-wide goroutines of libraries etcd uses, and
// nothing else. An HTTP goroutine left behind (a health check's connection,
// a server that was not shut down) is reported.
func LeakOptions() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"),
		goleak.IgnoreAnyFunction("github.com/golang/glog.(*fileSink).flushDaemon"),
		goleak.IgnoreAnyFunction("google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run"),
		// An embedded member's peer HTTP handler that a peer's version
		// probe reached while the member was being killed: it waits for
		// the member's backend lock and finishes when the process does.
		// Only etcd's own handler, never an HTTP goroutine of ours.
		goleak.IgnoreAnyFunction("go.etcd.io/etcd/server/v3/etcdserver/api/etcdhttp.newPeerHandler.versionHandler.func1"),
	}
}

// MemberChangeLeakOptions add to LeakOptions the HTTP goroutines of embedded
// etcd's peer transport that outlive a member killed with HardStop or
// removed from the cluster: keep-alive connections to it, and peer requests
// it was serving when it went. Only for packages whose code under test
// speaks no HTTP of its own (membership: etcd's gRPC API only), since these
// options would hide any HTTP goroutine.
func MemberChangeLeakOptions() []goleak.Option {
	return append(LeakOptions(),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreAnyFunction("net/http.(*conn).serve"),
		goleak.IgnoreAnyFunction("net/http.(*connReader).backgroundRead"),
	)
}
