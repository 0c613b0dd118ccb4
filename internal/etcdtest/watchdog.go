package etcdtest

import (
	"bytes"
	"fmt"
	"os"
	"runtime"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// watchdogAfter is how long a package's tests may run before Main ends the
// binary: below go test's -timeout (20 m in hack/test.sh) so that its report,
// not the timeout's dump of thousands of etcd goroutines, ends the output.
const watchdogAfter = 12 * time.Minute

// Main runs the package's tests as goleak.VerifyTestMain does, with a
// watchdog: a package whose tests hang (an embedded etcd that does not
// stop, a wait without a deadline) ends after watchdogAfter with the stacks
// of the goroutines in vigil's code and in etcd's start and stop, the ones
// that tell where it hangs, printed last.
func Main(m *testing.M, opts ...goleak.Option) {
	t := time.AfterFunc(watchdogAfter, func() {
		fmt.Fprintf(os.Stderr, "\netcdtest: the tests still run after %v; where they wait:\n%s\netcdtest: ending the test binary\n", watchdogAfter, interesting(allStacks()))
		os.Exit(2)
	})
	defer t.Stop()
	goleak.VerifyTestMain(m, opts...)
}

func allStacks() []byte {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return buf[:n]
		}
		buf = make([]byte, 2*len(buf))
	}
}

// interesting keeps, of a dump of every goroutine, those that run vigil's
// code or are inside an embedded etcd's start or stop.
func interesting(dump []byte) []byte {
	var out bytes.Buffer
	for _, g := range bytes.Split(dump, []byte("\n\n")) {
		if bytes.Contains(g, []byte("github.com/vigil-ha/vigil/")) ||
			bytes.Contains(g, []byte("embed.(*Etcd).Close")) ||
			bytes.Contains(g, []byte("embed.StartEtcd")) ||
			bytes.Contains(g, []byte("(*EtcdServer).HardStop")) ||
			bytes.Contains(g, []byte("(*EtcdServer).Stop")) {
			out.Write(g)
			out.WriteString("\n\n")
		}
	}
	return out.Bytes()
}
