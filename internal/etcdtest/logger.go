package etcdtest

import (
	"runtime"
	"sync"
	"sync/atomic"

	"go.etcd.io/etcd/client/pkg/v3/logutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// removedMemberPanic is the message etcd panics with when a request reads
// the local member's learner flag while the member is being removed
// (RaftCluster.IsLocalMemberLearner; etcd-io/etcd#21966, open for 3.6).
// A Maintenance/Status call that reaches a member at the moment raft
// applies its removal hits it. In production that crashes only the
// removed member's own process, which was about to exit anyway. Embedded
// in a test binary it would end every test in the package, so the test
// logger ends the request's goroutine instead: the request gets no answer,
// its connection closes as the member stops, and the client sees it as a
// member that went away. Every other etcd panic still panics.
const removedMemberPanic = "failed to find local ID in cluster members"

// panicHook is zap's action after a Panic-level entry.
type panicHook struct{}

func (panicHook) OnWrite(ce *zapcore.CheckedEntry, fields []zapcore.Field) {
	if ce.Message == removedMemberPanic {
		removedMemberPanics.Add(1)
		runtime.Goexit()
	}
	zapcore.WriteThenPanic.OnWrite(ce, fields)
}

// The same hammering of Status through a removal also met a second etcd
// race: a Status call reading the storage version of a member whose
// database is closed dereferences a nil bbolt transaction, a runtime panic
// that no logger hook can catch. That one is kept away by stopping the
// member's gRPC servers before its database closes (stopClients), and is
// tested by TestStopWhileClientsAsk.

// removedMemberPanics counts the requests panicHook ended.
var removedMemberPanics atomic.Int64

// logger is etcd's own default logger at error level (what LogLevel
// "error" builds), with panicHook.
var logger = sync.OnceValues(func() (*zap.Logger, error) {
	cfg := logutil.DefaultZapLoggerConfig
	cfg.Level = zap.NewAtomicLevelAt(zap.ErrorLevel)
	return cfg.Build(zap.WithPanicHook(panicHook{}))
})
