//go:build linux

package daemon

import (
	"bufio"
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vigil-ha/vigil/internal/nstest"
	"github.com/vigil-ha/vigil/internal/testkit"
)

// startEtcd3 runs a three-member etcd inside ns on 127.0.0.1-3 and returns
// the client URLs.
func startEtcd3(t *testing.T, ns string) []string {
	t.Helper()
	var initial, urls []string
	for i := 1; i <= 3; i++ {
		initial = append(initial, fmt.Sprintf("e%d=http://127.0.0.%d:2380", i, i))
		urls = append(urls, fmt.Sprintf("http://127.0.0.%d:2379", i))
	}
	for i := 1; i <= 3; i++ {
		host := fmt.Sprintf("127.0.0.%d", i)
		startIn(t, ns, fmt.Sprintf("etcd%d.log", i), nstest.Binary(t, "vigil-lab"), "etcd", "--name", fmt.Sprintf("e%d", i),
			"--data-dir", filepath.Join(t.TempDir(), "etcd"),
			"--listen-client-urls", "http://"+host+":2379", "--advertise-client-urls", "http://"+host+":2379",
			"--listen-peer-urls", "http://"+host+":2380", "--initial-advertise-peer-urls", "http://"+host+":2380",
			"--initial-cluster", strings.Join(initial, ","), "--log-level", "error")
	}
	return urls
}

// etcdConns counts the established TCP connections from pid to an etcd
// client port (2379) inside ns.
func etcdConns(t *testing.T, ns string, pid int) int {
	t.Helper()
	out, err := exec.Command("ip", "netns", "exec", ns, "ss", "-Htnp", "state", "established", "( dport = :2379 )").Output()
	if err != nil {
		t.Fatalf("ss: %v", err)
	}
	n := 0
	for line := range strings.Lines(string(out)) {
		if strings.Contains(line, "pid="+strconv.Itoa(pid)+",") {
			n++
		}
	}
	return n
}

// memberListRPCs sums what every etcd member answered to MemberList so far,
// from its own metrics.
func memberListRPCs(t *testing.T, ns string, urls []string) int {
	t.Helper()
	total := 0
	for _, u := range urls {
		body := get(t, ns, u+"/metrics")
		if body == "" {
			t.Fatalf("no metrics from %s", u)
		}
		sc := bufio.NewScanner(strings.NewReader(body))
		for sc.Scan() {
			l := sc.Text()
			if strings.HasPrefix(l, "grpc_server_handled_total{") && strings.Contains(l, `grpc_method="MemberList"`) {
				f := strings.Fields(l)
				v, err := strconv.ParseFloat(f[len(f)-1], 64)
				if err != nil {
					t.Fatalf("metric line %q: %v", l, err)
				}
				total += int(v)
			}
		}
	}
	return total
}

// One vigil run opens one etcd connection per member, seeded with one
// endpoint and following the member list, and keeps exactly those: the
// lock, discovery, the member observer and the raft shedder share them
// (internal/etcdcluster). The member list is read once per interval for the
// whole process, through every member at once.
func TestOneEtcdConnectionPerMember(t *testing.T) {
	p := nstest.NewPair(t)
	urls := startEtcd3(t, p.A)
	vigil := startIn(t, p.A, "vigil.log", nstest.Binary(t, "vigil"), "run", "--vip", testVIP+"/24", "--interface", "a0",
		"--node-name", "n1", "--etcd-endpoints", urls[0], "--etcd-member-name", "e1")
	testkit.WaitFor(t, 30*time.Second, "the VIP on a0", func() bool { return hasVIP(t, p.A) })
	testkit.WaitFor(t, 10*time.Second, "a connection to each of the 3 members", func() bool { return etcdConns(t, p.A, vigil.Process.Pid) == 3 })

	// A window of observer rounds, discovery reads, renewals and status
	// probes: the count never moves (before, every status probe dialled
	// a connection of its own, and three clients each kept their own).
	before := memberListRPCs(t, p.A, urls)
	start := time.Now()
	testkit.Always(t, 10*time.Second, "one connection to each of the 3 etcd members", func() bool { return etcdConns(t, p.A, vigil.Process.Pid) == 3 })
	rpcs := memberListRPCs(t, p.A, urls) - before
	window := time.Since(start)
	// One read per 2 s interval, sent to each of the 3 members: 15 in 10 s.
	// Allow one interval of slack at each end; the three readers of before
	// (lock, discovery, observer) made about 31.
	limit := 3 * (int(window/(2*time.Second)) + 2)
	t.Logf("MemberList answered %d times in %v by 3 members (limit %d)", rpcs, window.Round(time.Millisecond), limit)
	if rpcs > limit {
		t.Fatalf("the member list was read %d times in %v, more than once per interval (limit %d)", rpcs, window, limit)
	}
	if rpcs == 0 {
		t.Fatal("the member list was never read: discovery and the observer stopped?")
	}
}
