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

// Main runs the package's tests as goleak.VerifyTestMain does, but lets
// goroutines take up to leakWait to end, and with a watchdog: a package
// whose tests hang (an embedded etcd that does not stop, a wait without a
// deadline) ends after watchdogAfter with the stacks of the goroutines in
// vigil's code and in etcd's start and stop, the ones that tell where it
// hangs, printed last.
func Main(m *testing.M, opts ...goleak.Option) {
	t := time.AfterFunc(watchdogAfter, func() {
		fmt.Fprintf(os.Stderr, "\netcdtest: the tests still run after %v; where they wait:\n%s\netcdtest: ending the test binary\n", watchdogAfter, interesting(allStacks()))
		os.Exit(2)
	})
	code := m.Run()
	t.Stop()
	if code == 0 {
		if err := findLeaks(leakWait, opts...); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: Errors on successful test run: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// leakWait is how long Main lets goroutines end by themselves after the
// tests before it calls them leaked. goleak alone gives up within about
// 2 s; an embedded member's peer connections read with a 5 s deadline
// (rafthttp.ConnReadTimeout), and a peer request a removed or killed
// member was serving, with the keep-alive connection it came on, can
// outlive goleak's wait on a loaded machine (a report after 12 agent
// tests with -race, every test passed). A goroutine blocked for good is
// reported all the same, leakWait later.
const leakWait = 10 * time.Second

// findLeaks is goleak.Find, tried until it finds nothing or wait has
// passed. When the goroutines needed more than goleak's own retries, it
// says how long they took.
func findLeaks(wait time.Duration, opts ...goleak.Option) error {
	start := time.Now()
	for tries := 1; ; tries++ {
		err := goleak.Find(opts...)
		if err == nil {
			if tries > 1 {
				fmt.Fprintf(os.Stderr, "etcdtest: the tests' goroutines took %v to end after them\n", time.Since(start).Round(100*time.Millisecond))
			}
			return nil
		}
		if time.Since(start) > wait {
			return err
		}
	}
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
