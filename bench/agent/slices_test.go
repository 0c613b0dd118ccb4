package agentbench

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vigil-ha/vigil/internal/etcdtest"
	"github.com/vigil-ha/vigil/internal/kubelite"
	"github.com/vigil-ha/vigil/internal/kubetest"
	"github.com/vigil-ha/vigil/internal/testkit"
)

// BenchmarkEndpointSliceFanout measures what N agents' EndpointSlice
// watches cost a real kube-apiserver, and how fast a change reaches all of
// them. Each of the N followers is the agent's own watch (kubelite.APIServers)
// with its own clientset and TCP connection, as N workers would have; the
// agents' proxies and health checks are left out (BenchmarkControlPlaneLoad
// measures those), so that the slice can list addresses nobody dials.
//
// Reported: the API server's CPU over an idle window and its RSS with N
// watches open, and the fan-out time from the start of an update of the
// kubernetes EndpointSlice until the last of the N has seen it, median and
// worst of fanoutRounds updates. The N followers share the machine's two
// cores with the API server and etcd, so fan-out at large N includes their
// own CPU time.
//
//	go test ./bench/agent -run '^$' -bench EndpointSliceFanout -benchtime 1x
func BenchmarkEndpointSliceFanout(b *testing.B) {
	for _, n := range benchSizes() {
		b.Run(fmt.Sprintf("agents=%d", n), func(b *testing.B) {
			for range b.N {
				measureFanout(b, n)
			}
		})
	}
}

const fanoutRounds = 10

func measureFanout(b *testing.B, n int) {
	s := kubetest.Start(b, etcdtest.Start(b, 1).Endpoints[0])
	admin := s.Client(b, kubetest.AdminToken)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sl := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: kubelite.APIServerService, Namespace: kubelite.APIServerNamespace,
			Labels: map[string]string{discoveryv1.LabelServiceName: kubelite.APIServerService}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.0.0.11"}}},
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("https"), Port: ptr(int32(6443)), Protocol: ptr(corev1.ProtocolTCP)}},
	}
	slc := admin.DiscoveryV1().EndpointSlices(kubelite.APIServerNamespace)
	cur, err := slc.Create(ctx, sl, metav1.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}

	// seen[i] is when follower i last saw a set of a given size.
	var mu sync.Mutex
	seen := make([]map[int]time.Time, n)
	var wg sync.WaitGroup
	log := slog.New(slog.DiscardHandler)
	var followers []*kubelite.APIServers
	kubeconfig := s.Kubeconfig(b, kubetest.AdminToken)
	for i := range n {
		seen[i] = map[int]time.Time{}
		// A client of its own each: its own transport and connection, as
		// N workers have.
		c, err := kubelite.FromKubeconfig(kubeconfig)
		if err != nil {
			b.Fatal(err)
		}
		f := kubelite.NewAPIServers(c, func(bk []string) {
			mu.Lock()
			seen[i][len(bk)] = time.Now()
			mu.Unlock()
		}, log)
		followers = append(followers, f)
		wg.Go(func() { _ = f.Run(ctx) })
	}
	defer func() { cancel(); wg.Wait() }()
	for i, f := range followers {
		if !f.WaitSynced(ctxTimeout(b, 120*time.Second)) {
			b.Fatalf("follower %d never synced", i)
		}
	}

	// Idle: N watches open, nothing changes.
	time.Sleep(2 * time.Second)
	cpu0 := procCPU(b, s.PID())
	time.Sleep(window)
	idleCPU := procCPU(b, s.PID()) - cpu0
	rss := procRSS(b, s.PID())

	// Fan-out: grow the slice by one address per round.
	var fanouts []time.Duration
	for round := range fanoutRounds {
		size := round + 2
		cur.Endpoints = append(cur.Endpoints, discoveryv1.Endpoint{Addresses: []string{"10.0.1." + strconv.Itoa(round+1)}})
		written := time.Now() // the watches may deliver before the writer's answer
		if cur, err = slc.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
			b.Fatal(err)
		}
		// The followers' callbacks record when each saw it: looking
		// every 10 ms costs no precision.
		var last time.Time
		testkit.WaitNilEvery(b, 60*time.Second, 10*time.Millisecond, fmt.Sprintf("every follower to see round %d's change", round), func() error {
			mu.Lock()
			defer mu.Unlock()
			last = time.Time{}
			for i := range n {
				t, ok := seen[i][size]
				if !ok {
					return fmt.Errorf("follower %d has not", i)
				}
				if t.After(last) {
					last = t
				}
			}
			return nil
		})
		fanouts = append(fanouts, last.Sub(written))
		time.Sleep(500 * time.Millisecond)
	}
	slices.Sort(fanouts)
	median, worst := fanouts[len(fanouts)/2], fanouts[len(fanouts)-1]
	b.ReportMetric(idleCPU.Seconds()/window.Seconds(), "apiserver-cores-idle")
	b.ReportMetric(float64(rss)/(1<<20), "apiserver-MiB")
	b.ReportMetric(float64(median.Microseconds())/1000, "fanout-ms-median")
	b.ReportMetric(float64(worst.Microseconds())/1000, "fanout-ms-max")
	b.Logf("agents=%d: kube-apiserver %.3f cores idle, %.0f MiB RSS; fan-out median %v, worst %v over %d updates",
		n, idleCPU.Seconds()/window.Seconds(), float64(rss)/(1<<20), median.Round(time.Millisecond), worst.Round(time.Millisecond), fanoutRounds)
}

func ptr[T any](v T) *T { return &v }

func ctxTimeout(b *testing.B, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	b.Cleanup(cancel)
	return ctx
}

// procCPU is the user+system CPU time of process pid.
func procCPU(b *testing.B, pid int) time.Duration {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	f := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+2:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)          // utime, field 14
	st, _ := strconv.ParseInt(f[12], 10, 64)          // stime, field 15
	return time.Duration(ut+st) * (time.Second / 100) // USER_HZ
}

// procRSS is the resident set of process pid, in bytes.
func procRSS(b *testing.B, pid int) int64 {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for _, l := range strings.Split(string(raw), "\n") {
		if strings.HasPrefix(l, "VmRSS:") {
			kb, _ := strconv.ParseInt(strings.Fields(l)[1], 10, 64)
			return kb << 10
		}
	}
	b.Fatal("no VmRSS")
	return 0
}
