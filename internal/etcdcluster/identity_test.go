package etcdcluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/vigil-ha/vigil/internal/etcdtest"
	"github.com/vigil-ha/vigil/internal/netfault"
	"github.com/vigil-ha/vigil/internal/testaddr"
	"github.com/vigil-ha/vigil/internal/testkit"
)

// An impostor at a member's address: a fresh one-member etcd answers at
// the URL the real member advertised (a machine rebuilt with its address
// before the member was removed). It has no keys and no members but
// itself, and here it answers before the real members do. Nothing it says
// is taken: reads return the real cluster's values, the member list stays
// the real one and no real endpoint is dropped, the impostor is reported
// once, and StatusAll leaves it out.
func TestImpostorIsRefused(t *testing.T) {
	proxies := map[int]*netfault.Proxy{}
	var mu sync.Mutex
	real := etcdtest.StartAdvertising(t, 3, func(i int, listen string) string {
		host, _, _ := strings.Cut(listen, ":")
		ln, err := net.Listen("tcp", host+":0")
		if err != nil {
			t.Fatal(err)
		}
		p := netfault.NewProxy(ln, listen, testkit.Log(t))
		t.Cleanup(func() { _ = p.Close() })
		mu.Lock()
		proxies[i] = p
		mu.Unlock()
		return "http://" + ln.Addr().String()
	})
	impostor := etcdtest.Start(t, 1)
	var reported []Foreign
	c := newCluster(t, Config{Endpoints: real.Endpoints, OnForeign: func(f Foreign) {
		mu.Lock()
		reported = append(reported, f)
		mu.Unlock()
	}})
	if _, err := Do(ctx(t), c, func(ctx context.Context, m *Member) (*clientv3.PutResponse, error) {
		return m.Client.Put(ctx, "/k", "real")
	}); err != nil {
		t.Fatal(err)
	}
	if c.ClusterID() == 0 {
		t.Fatal("no cluster ID learned from the first operation")
	}
	before := c.Endpoints()

	// The real members answer 100 ms late; the impostor at once.
	for i := range 3 {
		if err := proxies[i].Set(netfault.Delay{Latency: 100 * time.Millisecond}); err != nil {
			t.Fatal(err)
		}
	}
	proxies[2].Retarget(strings.TrimPrefix(impostor.Endpoints[0], "http://"))
	if err := proxies[2].Set(netfault.Delay{}); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); {
		resp, err := Do(ctx(t), c, func(ctx context.Context, m *Member) (*clientv3.GetResponse, error) {
			return m.Client.Get(ctx, "/k")
		})
		if err != nil {
			t.Fatalf("a read with two real members up failed: %v", err)
		}
		if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "real" {
			t.Fatalf("a read answered %v: the impostor's (empty) store was believed", resp.Kvs)
		}
		list, err := c.FreshMemberList(ctx(t))
		if err != nil || len(list) != 3 {
			t.Fatalf("member list %v, %v: want the real cluster's 3", list, err)
		}
	}
	if got := c.Endpoints(); !slices.Equal(got, before) {
		t.Fatalf("endpoints %v, were %v: the impostor's member list was followed", got, before)
	}
	mu.Lock()
	n := len(reported)
	var first Foreign
	if n > 0 {
		first = reported[0]
	}
	mu.Unlock()
	if n != 1 || first.Endpoint != real.Endpoints[2] || first.ClusterID == c.ClusterID() {
		t.Fatalf("reported %d times (%+v); want once, for %s", n, first, real.Endpoints[2])
	}
	if f := c.Foreign(time.Minute); len(f) != 1 || f[0].Answers < 2 {
		t.Fatalf("Foreign = %+v; want the impostor, with its answers counted", f)
	}
	for _, st := range c.StatusAll(ctx(t)) {
		if st.Endpoint == real.Endpoints[2] {
			t.Fatalf("StatusAll took the impostor's status: %+v", st)
		}
	}
	// Its answers are errors like a dead member's, and say why.
	_, err := proxiesMember(c, real.Endpoints[2]).Client.Get(ctx(t), "/k")
	if !errors.Is(err, ErrForeignCluster) {
		t.Fatalf("a read through the impostor's connection = %v, want ErrForeignCluster", err)
	}
}

// The cluster ID is learned from a majority of the seeds: one seed that
// answers for another cluster, first, is not believed.
func TestIdentityNeedsAMajorityOfSeeds(t *testing.T) {
	real := etcdtest.StartDistinct(t, 3)
	impostor := etcdtest.Start(t, 1)
	c := newCluster(t, Config{Endpoints: []string{impostor.Endpoints[0], real.Endpoints[0], real.Endpoints[1]}})
	resp, err := Do(ctx(t), c, func(ctx context.Context, m *Member) (*clientv3.MemberListResponse, error) {
		return m.Client.MemberList(ctx)
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Members) != 3 || resp.Header.ClusterId != c.ClusterID() {
		t.Fatalf("learned cluster %x from a member list of %d members; want the real cluster's 3", c.ClusterID(), len(resp.Members))
	}
}

func proxiesMember(c *Cluster, endpoint string) *Member {
	for _, m := range c.Members() {
		if m.Endpoint == endpoint {
			return m
		}
	}
	return nil
}

// With one seed of three answering, no majority can name the cluster: a
// strict Cluster (vigil run) refuses the lone answer, a provisional one (a
// one-shot command diagnosing a cluster that lost its majority) takes it.
func TestProvisionalIdentity(t *testing.T) {
	e := etcdtest.Start(t, 1)
	// Ports of this binary's own loopback address that nothing listens on.
	dead := func() string { return fmt.Sprintf("http://%s:%d", testaddr.Loopback(t), testaddr.Port(t)) }
	seeds := []string{e.Endpoints[0], dead(), dead()}
	for _, prov := range []bool{false, true} {
		c := newCluster(t, Config{Endpoints: seeds, Provisional: prov})
		_, err := c.LocalMemberList(ctx(t))
		if prov && err != nil {
			t.Fatalf("provisional: %v", err)
		}
		if !prov && !errors.Is(err, errIDUnknown) {
			t.Fatalf("strict: %v, want the cluster ID unknown", err)
		}
	}
}
