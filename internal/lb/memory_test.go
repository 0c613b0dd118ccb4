package lb

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vigil-ha/vigil/internal/health"
	"github.com/vigil-ha/vigil/internal/nstest"
)

// What one idle proxied connection costs the balancer's process in RSS.
// The backend and the clients run in a child process (this test binary
// again), so their memory is not counted. VIGIL_LB_IDLE_CONNS sets how many
// connections (default 2000; bench/lb records 1k, 5k and 20k).
func TestIdleConnectionMemory(t *testing.T) {
	if os.Getenv("VIGIL_LB_MEMORY_HELPER") != "" {
		t.Skip("helper process")
	}
	n := 2000
	if v := os.Getenv("VIGIL_LB_IDLE_CONNS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			t.Fatalf("VIGIL_LB_IDLE_CONNS=%q", v)
		}
	}
	raiseFileLimit(t, n)
	child := exec.Command(os.Args[0], "-test.run=^TestIdleConnectionMemoryHelper$")
	child.Env = append(os.Environ(), "VIGIL_LB_MEMORY_HELPER=1", "VIGIL_LB_IDLE_CONNS="+strconv.Itoa(n))
	child.Stderr = os.Stderr
	stdin, err := child.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { stdin.Close(); _ = child.Wait() }()
	out := bufio.NewReader(stdout)
	backend := helperLine(t, out)

	b, err := New(Config{Listen: "127.0.0.1:0", MaxConns: -1, MaxConnsPerSource: -1, Loops: testLoops}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	b.SetBackends([]string{backend})
	b.Update(health.Status{Backend: backend, State: health.Up})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()
	defer func() { cancel(); <-done }()

	before := rss(t)
	fmt.Fprintln(stdin, b.Addr().String())
	if got := helperLine(t, out); got != "ready" {
		rest, _ := io.ReadAll(out)
		t.Fatalf("helper: %s\n%s", got, rest)
	}
	waitConns(t, b, n)
	time.Sleep(time.Second) // let every copier settle into its wait
	after := rss(t)
	per := (after - before) / int64(n)
	t.Logf("%d idle connections (event loops %v): RSS %d KiB -> %d KiB, %.1f KiB per connection; copy buffers held: %d",
		n, b.eventLoops() > 0, before>>10, after>>10, float64(per)/1024, buffersInUse.Load())
	if buffersInUse.Load() != 0 {
		t.Errorf("idle connections hold %d copy buffers", buffersInUse.Load())
	}
	if per > 4*MemoryPerConn {
		t.Errorf("%d bytes per idle connection, more than 4 x MemoryPerConn (%d)", per, MemoryPerConn)
	}
}

// TestIdleConnectionMemoryHelper is the child of TestIdleConnectionMemory:
// a backend that greets and echoes, and the clients that connect through
// the balancer, say hello, read the greeting and then stay idle.
func TestIdleConnectionMemoryHelper(t *testing.T) {
	if os.Getenv("VIGIL_LB_MEMORY_HELPER") == "" {
		t.Skip("run by TestIdleConnectionMemory")
	}
	n, _ := strconv.Atoi(os.Getenv("VIGIL_LB_IDLE_CONNS"))
	raiseFileLimit(t, n)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				r := bufio.NewReader(c)
				if _, err := r.ReadString('\n'); err == nil {
					_, _ = io.WriteString(c, "hello\n")
					// Not spliced: a blocked splice holds a pipe, two more
					// descriptors per connection.
					_, _ = io.Copy(struct{ io.Writer }{c}, struct{ io.Reader }{r})
				}
				c.Close()
			}()
		}
	}()
	fmt.Println(ln.Addr().String())
	in := bufio.NewReader(os.Stdin)
	lbAddr := strings.TrimSpace(helperLine(t, in))
	var conns []net.Conn
	for range n {
		c, err := net.Dial("tcp", lbAddr)
		if err != nil {
			t.Fatalf("connection %d of %d: %v", len(conns)+1, n, err)
		}
		conns = append(conns, c)
		if _, err := io.WriteString(c, "hi\n"); err != nil {
			t.Fatal(err)
		}
		if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
			t.Fatal(err)
		}
	}
	fmt.Println("ready")
	_, _ = io.Copy(io.Discard, os.Stdin) // until the parent is done
	for _, c := range conns {
		c.Close()
	}
}

func helperLine(t *testing.T, r *bufio.Reader) string {
	t.Helper()
	line, err := r.ReadString('\n')
	if err != nil {
		t.Fatalf("helper process: %v", err)
	}
	return strings.TrimSpace(line)
}

// rss is this process's resident set after a GC that returns freed memory.
func rss(t *testing.T) int64 {
	t.Helper()
	runtime.GC()
	debug.FreeOSMemory()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Skipf("no /proc/self/status: %v", err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) == 3 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	t.Fatal("no VmRSS in /proc/self/status")
	return 0
}

// raiseFileLimit makes room for conns proxied connections: two
// descriptors each, and some to spare.
func raiseFileLimit(t *testing.T, conns int) {
	t.Helper()
	want := 2*conns + 1000
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		t.Fatal(err)
	}
	if l.Cur >= uint64(want) {
		return
	}
	have := l.Cur
	l.Cur = uint64(want)
	l.Max = max(l.Max, l.Cur)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		nstest.Unavailable(t, "%d connections need %d file descriptors; the limit is %d and cannot be raised (%v)", conns, want, have, err)
	}
}
