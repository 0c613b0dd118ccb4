package discovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/vigil-ha/vigil/internal/election"
	"github.com/vigil-ha/vigil/internal/etcdmember"
	"github.com/vigil-ha/vigil/internal/etcdtest"
	"github.com/vigil-ha/vigil/internal/testaddr"
	"github.com/vigil-ha/vigil/internal/testkit"
	"github.com/vigil-ha/vigil/internal/validate"
)

func TestFromMembers(t *testing.T) {
	cases := []struct {
		name    string
		members []*pb.Member
		want    []string
	}{
		{"one url each", []*pb.Member{
			{ClientURLs: []string{"https://10.0.0.12:2379"}},
			{ClientURLs: []string{"https://10.0.0.11:2379"}},
		}, []string{"10.0.0.11:6443", "10.0.0.12:6443"}},
		{"loopback dropped next to a routable url", []*pb.Member{
			{ClientURLs: []string{"https://127.0.0.1:2379", "https://10.0.0.11:2379"}},
		}, []string{"10.0.0.11:6443"}},
		{"loopback only is kept", []*pb.Member{
			{ClientURLs: []string{"http://127.0.0.1:2379"}},
		}, []string{"127.0.0.1:6443"}},
		{"unstarted member has no urls", []*pb.Member{
			{Name: "", PeerURLs: []string{"https://10.0.0.14:2380"}},
			{ClientURLs: []string{"https://10.0.0.11:2379"}},
		}, []string{"10.0.0.11:6443"}},
		{"ipv6 and names", []*pb.Member{
			{ClientURLs: []string{"https://[fd00::11]:2379"}},
			{ClientURLs: []string{"https://cp2.example:2379"}},
		}, []string{"[fd00::11]:6443", "cp2.example:6443"}},
		{"learners left out", []*pb.Member{
			{ClientURLs: []string{"https://10.0.0.11:2379"}},
			{ClientURLs: []string{"https://10.0.0.14:2379"}, IsLearner: true},
		}, []string{"10.0.0.11:6443"}},
		{"duplicates and garbage", []*pb.Member{
			{ClientURLs: []string{"https://10.0.0.11:2379", "https://10.0.0.11:4001", "::bad"}},
		}, []string{"10.0.0.11:6443"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if d := cmp.Diff(tc.want, etcdmember.WithPort(etcdmember.ServingOf(tc.members).Hosts, 6443)); d != "" {
				t.Fatal(d)
			}
		})
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	for _, cfg := range []Config{
		{Port: 0, Static: []string{"10.0.0.1:6443"}},
		{Port: 70000, Static: []string{"10.0.0.1:6443"}},
		{Port: 6443}, // no source at all
		{Port: 6443, Static: []string{"10.0.0.1"}}, // no port
		{Port: 6443, Static: []string{"10.0.0.1:99999"}},
	} {
		if _, err := New(cfg, log); !errors.Is(err, validate.ErrInvalid) {
			t.Errorf("New(%+v) = %v, want validate.ErrInvalid", cfg, err)
		}
	}
}

// sets records what OnChange published.
type sets struct {
	mu  sync.Mutex
	all [][]string
}

func (s *sets) add(b []string) {
	s.mu.Lock()
	s.all = append(s.all, b)
	s.mu.Unlock()
}

func (s *sets) last() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.all) == 0 {
		return nil
	}
	return s.all[len(s.all)-1]
}

func (s *sets) wait(t *testing.T, d time.Duration, want []string) {
	t.Helper()
	testkit.WaitNil(t, d, fmt.Sprintf("backends %v", want), func() error {
		if got := s.last(); !slices.Equal(got, want) {
			return fmt.Errorf("backends %v", got)
		}
		return nil
	})
}

func run(t *testing.T, cfg Config) (*Discovery, *sets) {
	t.Helper()
	s := &sets{}
	cfg.OnChange = s.add
	d, err := New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = d.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return d, s
}

// TestFollowsRealMembership runs a real 3-member etcd, each member on its own
// loopback address like a node, and changes its membership.
func TestFollowsRealMembership(t *testing.T) {
	c := etcdtest.StartDistinct(t, 3)
	lock, err := election.NewEtcdLock(election.EtcdConfig{Endpoints: c.Endpoints[:1]}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	backend := func(i int) string { return testaddr.Host(t, i) + ":6443" }

	d, s := run(t, Config{Members: lock.Cluster(), Port: 6443, Static: []string{"192.0.2.1:6443"}, Interval: 200 * time.Millisecond})
	s.wait(t, 10*time.Second, []string{backend(0), backend(1), backend(2)})
	if s.all[0][0] != "192.0.2.1:6443" {
		t.Errorf("first published set %v, want the static bootstrap backend", s.all[0])
	}

	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints[:1], DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()

	// Add a fourth member: its backend appears once it has started (a
	// member announced but not started has no client URL yet).
	peer, client := c.NewMemberURLs()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var added *clientv3.MemberAddResponse
	etcdtest.Retry(t, 20*time.Second, "member add", func() error { added, err = cli.MemberAdd(ctx, []string{peer}); return err })
	var initial []string
	for _, m := range added.Members {
		name := m.Name
		if m.ID == added.Member.ID {
			name = "m4"
		}
		initial = append(initial, fmt.Sprintf("%s=%s", name, m.PeerURLs[0]))
	}
	s.wait(t, 5*time.Second, []string{backend(0), backend(1), backend(2)}) // unstarted: unchanged
	c.Add("m4", peer, client, strings.Join(initial, ","))
	s.wait(t, 10*time.Second, []string{backend(0), backend(1), backend(2), backend(3)})

	// Remove the second member; Refresh makes it visible without waiting.
	c.Remove(1, 20*time.Second)
	d.Refresh()
	s.wait(t, 5*time.Second, []string{backend(0), backend(2), backend(3)})
	if got := d.Backends(); !slices.Equal(got, []string{backend(0), backend(2), backend(3)}) {
		t.Fatalf("Backends() = %v", got)
	}

	// etcd down entirely: the last set stays.
	c.Close()
	testkit.Always(t, time.Second, "the last set kept after etcd went away", func() bool {
		return slices.Equal(s.last(), []string{backend(0), backend(2), backend(3)})
	})
}

// published is a Follower whose set the test sets.
type published struct {
	mu     sync.Mutex
	set    []string
	synced bool
	poke   func()
}

func (p *published) Run(ctx context.Context) error { <-ctx.Done(); return nil }

func (p *published) Backends() ([]string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.set), p.synced
}

func (p *published) publish(b ...string) {
	p.mu.Lock()
	p.set, p.synced = b, true
	p.mu.Unlock()
	p.poke()
}

// members is a member list that can fail.
type members struct {
	mu    sync.Mutex
	list  []*pb.Member
	err   error
	reads int
}

func (m *members) Serving(context.Context) (etcdmember.Serving, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.reads++
	return etcdmember.ServingOf(m.list), m.err
}

func (m *members) readCount() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.reads
}

func (m *members) fail(err error) {
	m.mu.Lock()
	m.err = err
	m.mu.Unlock()
}

// The backends are the union of both sources; a source that fails or
// publishes nothing keeps its last answer. A change of the published set
// costs no member list read; OnMembers sees each read's whole answer.
func TestMergesPublishedWithMembers(t *testing.T) {
	ml := &members{list: []*pb.Member{{ClientURLs: []string{"https://10.0.0.11:2379"}}, {ClientURLs: []string{"https://10.0.0.12:2379"}}}}
	pub := &published{}
	var served []etcdmember.Serving
	var servedMu sync.Mutex
	// An hour: only the follower's notification and Refresh make Run read.
	d, s := run(t, Config{Members: ml, Published: pub, Port: 6443, Static: []string{"192.0.2.1:6443"}, Interval: time.Hour,
		OnMembers: func(sv etcdmember.Serving) { servedMu.Lock(); served = append(served, sv); servedMu.Unlock() }})
	pub.poke = d.PublishedChanged
	s.wait(t, 5*time.Second, []string{"10.0.0.11:6443", "10.0.0.12:6443"})
	servedMu.Lock()
	if len(served) != 1 || !slices.Equal(served[0].HostPorts, []string{"10.0.0.11:2379", "10.0.0.12:2379"}) {
		t.Errorf("OnMembers got %+v, want one read's answer", served)
	}
	servedMu.Unlock()

	// An API server apart from etcd (external etcd topology) joins.
	pub.publish("10.0.0.12:6443", "10.0.0.21:6443")
	s.wait(t, 5*time.Second, []string{"10.0.0.11:6443", "10.0.0.12:6443", "10.0.0.21:6443"})
	if n := ml.readCount(); n != 1 {
		t.Errorf("%d member list reads after a published change, want only the first", n)
	}

	// etcd unreachable and the slices emptied: both last answers stay.
	ml.fail(errors.New("etcd down"))
	d.Refresh()
	pub.publish()
	testkit.Always(t, 200*time.Millisecond, "both last answers kept after both sources went quiet", func() bool {
		return slices.Equal(s.last(), []string{"10.0.0.11:6443", "10.0.0.12:6443", "10.0.0.21:6443"})
	})
	pub.publish("10.0.0.21:6443")
	s.wait(t, 5*time.Second, []string{"10.0.0.11:6443", "10.0.0.12:6443", "10.0.0.21:6443"})
	pub.publish("10.0.0.22:6443")
	s.wait(t, 5*time.Second, []string{"10.0.0.11:6443", "10.0.0.12:6443", "10.0.0.22:6443"})
	want := []SourceState{
		{Name: SourceEtcd, Backends: []string{"10.0.0.11:6443", "10.0.0.12:6443"}, Answered: true, Error: "etcd down"},
		{Name: SourceKubernetes, Backends: []string{"10.0.0.22:6443"}, Answered: true},
	}
	if diff := cmp.Diff(want, d.Sources()); diff != "" {
		t.Fatalf("Sources() (-want +got):\n%s", diff)
	}
}

// With only the published source, the static backends serve until it has
// answered.
func TestPublishedOnly(t *testing.T) {
	pub := &published{}
	d, s := run(t, Config{Published: pub, Port: 6443, Static: []string{"192.0.2.1:6443"}, Interval: time.Hour})
	pub.poke = d.PublishedChanged
	s.wait(t, 5*time.Second, []string{"192.0.2.1:6443"})
	pub.publish("10.0.0.21:6443")
	s.wait(t, 5*time.Second, []string{"10.0.0.21:6443"})
}

// TestJitter: within (4/5·d, d], and spread, so processes started together
// drift apart.
func TestJitter(t *testing.T) {
	const d = 2 * time.Second
	seen := map[time.Duration]bool{}
	for range 1000 {
		j := Jitter(d)
		if j > d || j < d-d/5 {
			t.Fatalf("Jitter(%v) = %v, outside [%v, %v]", d, j, d-d/5, d)
		}
		seen[j] = true
	}
	if len(seen) < 100 {
		t.Fatalf("1000 draws gave %d distinct intervals", len(seen))
	}
	if Jitter(0) != 0 {
		t.Fatal("Jitter(0) != 0")
	}
}
