// Package etcdtest runs real etcd members in-process (go.etcd.io/etcd/server/v3/embed)
// on loopback for integration tests.
package etcdtest

import (
	"fmt"
	"net"
	"net/url"
	"strings"
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

// Config returns the configuration of member name with the given ports,
// as part of cluster (name=peerURL,...).
func Config(t testing.TB, name string, clientPort, peerPort int, cluster string) *embed.Config {
	cfg := embed.NewConfig()
	cfg.Name = name
	cfg.Dir = t.TempDir()
	cu := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", clientPort)}
	pu := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", peerPort)}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{cu}, []url.URL{cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{pu}, []url.URL{pu}
	cfg.InitialCluster = cluster
	cfg.InitialClusterToken = "etcdtest"
	cfg.LogLevel = "error"
	return cfg
}

// Start runs an n-member cluster and stops it when the test ends.
func Start(t testing.TB, n int) *Cluster {
	t.Helper()
	c := &Cluster{t: t}
	clientPorts, peerPorts := make([]int, n), make([]int, n)
	var initial []string
	for i := 0; i < n; i++ {
		clientPorts[i], peerPorts[i] = FreePort(t), FreePort(t)
		name := fmt.Sprintf("m%d", i+1)
		c.Names = append(c.Names, name)
		initial = append(initial, fmt.Sprintf("%s=http://127.0.0.1:%d", name, peerPorts[i]))
		c.Endpoints = append(c.Endpoints, fmt.Sprintf("http://127.0.0.1:%d", clientPorts[i]))
	}
	for i := 0; i < n; i++ {
		cfg := Config(t, c.Names[i], clientPorts[i], peerPorts[i], strings.Join(initial, ","))
		e, err := embed.StartEtcd(cfg)
		if err != nil {
			c.Close()
			t.Fatalf("start etcd member %s: %v", c.Names[i], err)
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
			t.Fatalf("etcd member %s not ready", c.Names[i])
		}
	}
	t.Cleanup(c.Close)
	return c
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
