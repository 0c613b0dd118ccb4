// Package etcdtest runs real etcd members in-process (go.etcd.io/etcd/server/v3/embed)
// on loopback for integration tests.
package etcdtest

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

// Cluster is a running embedded etcd cluster.
type Cluster struct {
	t         testing.TB
	Members   []*embed.Etcd
	Names     []string
	Endpoints []string
	cfgs      []*embed.Config
	stopped   []bool
	distinct  bool
}

func (c *Cluster) host(i int) string {
	if c.distinct {
		return Host(i)
	}
	return "127.0.0.1"
}

// PeerURL returns member i's peer URL.
func (c *Cluster) PeerURL(i int) string { return c.cfgs[i].AdvertisePeerUrls[0].String() }

// NewMemberURLs picks the peer and client URLs for the member Add will start
// next; the caller announces the peer URL with MemberAdd first.
func (c *Cluster) NewMemberURLs() (peerURL, clientURL string) {
	i := len(c.Members)
	return fmt.Sprintf("http://%s:%d", c.host(i), FreePort(c.t)), fmt.Sprintf("http://%s:%d", c.host(i), FreePort(c.t))
}

// Add starts a member that MemberAdd already announced with peerURL; cluster
// is the ETCD_INITIAL_CLUSTER MemberAdd's answer implies (name=peerURL,...
// including the new member). It returns the new member's index.
func (c *Cluster) Add(name, peerURL, clientURL, cluster string) int {
	c.t.Helper()
	pu, err := url.Parse(peerURL)
	if err != nil {
		c.t.Fatal(err)
	}
	cu, err := url.Parse(clientURL)
	if err != nil {
		c.t.Fatal(err)
	}
	cfg := hostConfig(c.t, name, pu.Hostname(), 0, 0, cluster)
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	cfg.ClusterState = embed.ClusterStateFlagExisting
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		c.t.Fatalf("start etcd member %s: %v", name, err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		e.Close()
		c.t.Fatalf("etcd member %s not ready", name)
	}
	c.Members = append(c.Members, e)
	c.cfgs = append(c.cfgs, cfg)
	c.stopped = append(c.stopped, false)
	c.Names = append(c.Names, name)
	c.Endpoints = append(c.Endpoints, clientURL)
	return len(c.Members) - 1
}

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Config returns the configuration of member name with the given ports on
// 127.0.0.1, as part of cluster (name=peerURL,...).
func Config(t testing.TB, name string, clientPort, peerPort int, cluster string) *embed.Config {
	return hostConfig(t, name, "127.0.0.1", clientPort, peerPort, cluster)
}

func hostConfig(t testing.TB, name, host string, clientPort, peerPort int, cluster string) *embed.Config {
	cfg := embed.NewConfig()
	cfg.Name = name
	cfg.Dir = t.TempDir()
	cu := url.URL{Scheme: "http", Host: fmt.Sprintf("%s:%d", host, clientPort)}
	pu := url.URL{Scheme: "http", Host: fmt.Sprintf("%s:%d", host, peerPort)}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{cu}, []url.URL{cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{pu}, []url.URL{pu}
	cfg.InitialCluster = cluster
	cfg.InitialClusterToken = "etcdtest"
	cfg.LogLevel = "error"
	return cfg
}

// Start runs an n-member cluster on 127.0.0.1 and stops it when the test
// ends.
func Start(t testing.TB, n int) *Cluster {
	t.Helper()
	return start(t, n, false)
}

// StartDistinct is Start with member i on its own loopback address,
// 127.0.0.(11+i), like nodes with an address each; see Host.
func StartDistinct(t testing.TB, n int) *Cluster {
	t.Helper()
	return start(t, n, true)
}

// Host is the loopback address of the i-th member StartDistinct or Add
// creates: 127.0.0.(11+i).
func Host(i int) string { return fmt.Sprintf("127.0.0.%d", 11+i) }

// StartAdvertising is StartDistinct where member i advertises the client
// URL front(i, listen) instead of the one it listens on: a proxy in front
// of it (a delay, a black hole), which every client that follows the
// member list then goes through. front is called again for each attempt.
func StartAdvertising(t testing.TB, n int, front func(i int, listen string) string) *Cluster {
	t.Helper()
	return startWith(t, n, true, front)
}

func start(t testing.TB, n int, distinct bool) *Cluster {
	return startWith(t, n, distinct, nil)
}

func startWith(t testing.TB, n int, distinct bool, front func(i int, listen string) string) *Cluster {
	// FreePort's ports were free a moment ago; another test binary running
	// beside this one (go test runs packages in parallel) may take one
	// first. Then the whole cluster starts again on new ports.
	for attempt := 1; ; attempt++ {
		c, err := tryStart(t, n, distinct, front)
		if err == nil {
			t.Cleanup(c.Close)
			return c
		}
		inUse := errors.Is(err, syscall.EADDRINUSE) || strings.Contains(err.Error(), "address already in use")
		if !inUse || attempt == 3 {
			t.Fatal(err)
		}
		t.Logf("%v; starting the cluster again on other ports", err)
	}
}

func tryStart(t testing.TB, n int, distinct bool, front func(i int, listen string) string) (*Cluster, error) {
	c := &Cluster{t: t, distinct: distinct}
	clientPorts, peerPorts := make([]int, n), make([]int, n)
	var initial []string
	for i := 0; i < n; i++ {
		clientPorts[i], peerPorts[i] = FreePort(t), FreePort(t)
		name := fmt.Sprintf("m%d", i+1)
		c.Names = append(c.Names, name)
		initial = append(initial, fmt.Sprintf("%s=http://%s:%d", name, c.host(i), peerPorts[i]))
		c.Endpoints = append(c.Endpoints, fmt.Sprintf("http://%s:%d", c.host(i), clientPorts[i]))
	}
	for i := 0; i < n; i++ {
		cfg := hostConfig(t, c.Names[i], c.host(i), clientPorts[i], peerPorts[i], strings.Join(initial, ","))
		if front != nil {
			adv, err := url.Parse(front(i, cfg.ListenClientUrls[0].Host))
			if err != nil {
				c.Close()
				return nil, fmt.Errorf("member %s's advertised client URL: %w", c.Names[i], err)
			}
			cfg.AdvertiseClientUrls = []url.URL{*adv}
			c.Endpoints[i] = adv.String()
		}
		e, err := embed.StartEtcd(cfg)
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("start etcd member %s: %w", c.Names[i], err)
		}
		c.Members = append(c.Members, e)
		c.cfgs = append(c.cfgs, cfg)
		c.stopped = append(c.stopped, false)
	}
	for i, e := range c.Members {
		select {
		case <-e.Server.ReadyNotify():
		case <-time.After(30 * time.Second):
			c.Close()
			return nil, fmt.Errorf("etcd member %s not ready", c.Names[i])
		}
	}
	return c, nil
}

// Leader returns the index of the raft leader, or -1.
func (c *Cluster) Leader() int {
	for i, e := range c.Members {
		if !c.stopped[i] && uint64(e.Server.Leader()) == uint64(e.Server.MemberID()) {
			return i
		}
	}
	return -1
}

// WaitLeader waits for a raft leader among the running members.
func (c *Cluster) WaitLeader(d time.Duration) int {
	c.t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if i := c.Leader(); i >= 0 {
			return i
		}
		time.Sleep(10 * time.Millisecond)
	}
	c.t.Fatalf("no etcd leader within %v", d)
	return -1
}

// Kill stops member i without handing raft leadership over (like SIGKILL)
// and closes its listeners.
func (c *Cluster) Kill(i int) {
	if c.stopped[i] {
		return
	}
	c.stopped[i] = true
	c.Members[i].Server.HardStop()
	c.Members[i].Close()
}

// Close stops every member. Safe to call twice.
func (c *Cluster) Close() {
	for i := range c.Members {
		if !c.stopped[i] {
			c.stopped[i] = true
			c.Members[i].Close()
		}
	}
}

// Retry calls f until it succeeds or d has passed, then fails the test.
// etcd refuses membership changes for a few seconds after members
// (re)connect ("unhealthy cluster"), so tests that change membership retry.
func Retry(t testing.TB, d time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
