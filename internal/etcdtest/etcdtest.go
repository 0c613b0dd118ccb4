// Package etcdtest runs real etcd members in-process (go.etcd.io/etcd/server/v3/embed)
// on loopback for integration tests.
package etcdtest

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vigil-ha/vigil/internal/testaddr"
	"github.com/vigil-ha/vigil/internal/testkit"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"google.golang.org/grpc"
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
	ready     time.Time // when every member first answered
}

func (c *Cluster) host(i int) string {
	if c.distinct {
		return testaddr.Host(c.t, i)
	}
	return testaddr.Loopback(c.t)
}

// PeerURL returns member i's peer URL.
func (c *Cluster) PeerURL(i int) string { return c.cfgs[i].AdvertisePeerUrls[0].String() }

// NewMemberURLs picks the peer and client URLs for the member Add will start
// next; the caller announces the peer URL with MemberAdd first.
func (c *Cluster) NewMemberURLs() (peerURL, clientURL string) {
	i := len(c.Members)
	return fmt.Sprintf("http://%s:%d", c.host(i), testaddr.Port(c.t)), fmt.Sprintf("http://%s:%d", c.host(i), testaddr.Port(c.t))
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
	// The new member fetches the cluster from the first peer that answers
	// and refuses to start ("member count is unequal") if that peer has
	// not applied the addition yet: a follower can be a moment behind the
	// leader that answered MemberAdd.
	testkit.WaitNilEvery(c.t, 10*time.Second, 10*time.Millisecond, "every running member to list "+peerURL, func() error {
		for i, e := range c.Members {
			if !c.stopped[i] && !listsPeer(e, peerURL) {
				return fmt.Errorf("member %s does not list it yet", c.Names[i])
			}
		}
		return nil
	})
	cfg := hostConfig(c.t, name, pu.Hostname(), 0, 0, cluster)
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	cfg.ClusterState = embed.ClusterStateFlagExisting
	e, err := startMember(cfg)
	if err != nil {
		c.t.Fatalf("start etcd member %s: %v", name, err)
	}
	if err := ready(e, name); err != nil {
		stopMember(c.t, e, name)
		c.t.Fatal(err)
	}
	c.Members = append(c.Members, e)
	c.cfgs = append(c.cfgs, cfg)
	c.stopped = append(c.stopped, false)
	c.Names = append(c.Names, name)
	c.Endpoints = append(c.Endpoints, clientURL)
	return len(c.Members) - 1
}

// listsPeer tells whether member e has applied a member with peerURL.
func listsPeer(e *embed.Etcd, peerURL string) bool {
	for _, m := range e.Server.Cluster().Members() {
		for _, u := range m.PeerURLs {
			if u == peerURL {
				return true
			}
		}
	}
	return false
}

// Config returns the configuration of member name with the given ports
// (from testaddr.Port) on testaddr.Loopback, as part of cluster (name=peerURL,...).
func Config(t testing.TB, name string, clientPort, peerPort int, cluster string) *embed.Config {
	return hostConfig(t, name, testaddr.Loopback(t), clientPort, peerPort, cluster)
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
	lg, err := logger()
	if err != nil {
		t.Fatalf("etcd's logger: %v", err)
	}
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(lg)
	// Note each gRPC server of the member, so that stopMember can stop
	// them first (cfg.Dir as it is when the member starts: Restart sets
	// it after this). A stop waits for the handlers under way to return.
	cfg.ServiceRegister = func(gs *grpc.Server) {
		grpcMu.Lock()
		defer grpcMu.Unlock()
		grpcServers[cfg.Dir] = append(grpcServers[cfg.Dir], gs)
	}
	cfg.GRPCAdditionalServerOptions = []grpc.ServerOption{grpc.WaitForHandlers(true)}
	return cfg
}

// grpcServers holds each member's gRPC servers, by data directory.
var (
	grpcMu      sync.Mutex
	grpcServers = map[string][]*grpc.Server{}
)

// stopClients stops the gRPC servers of the member with data directory
// dir: every connection closes, the requests and watches under way are
// cancelled, and it returns once their handlers have returned. etcd
// answers a request on a member whose server has stopped with a read of
// its closed database, a nil dereference that no recover catches (a
// Status call met it: etcd-io/etcd#21966's family), and embedded in a test
// binary that ends every test of the package. So the clients go first,
// then the server.
func stopClients(dir string) {
	grpcMu.Lock()
	servers := grpcServers[dir]
	delete(grpcServers, dir)
	grpcMu.Unlock()
	for _, gs := range servers {
		gs.Stop()
	}
}

// stopClientsWhenStopping stops e's gRPC servers as soon as its server
// starts stopping by itself: a member removed from the cluster does, and
// it closes its database while it would still be answering.
func stopClientsWhenStopping(e *embed.Etcd) {
	dir := e.Config().Dir
	go func() {
		<-e.Server.StoppingNotify()
		stopClients(dir)
	}()
}

// Start runs an n-member cluster on testaddr.Loopback and stops it when the test
// ends.
func Start(t testing.TB, n int) *Cluster {
	t.Helper()
	return start(t, n, false)
}

// StartDistinct is Start with member i on its own loopback address,
// testaddr.Host(i), like nodes with an address each.
func StartDistinct(t testing.TB, n int) *Cluster {
	t.Helper()
	return start(t, n, true)
}

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
	t.Helper()
	c := &Cluster{t: t, distinct: distinct}
	t.Cleanup(c.Close)
	clientPorts, peerPorts := make([]int, n), make([]int, n)
	var initial []string
	for i := 0; i < n; i++ {
		clientPorts[i], peerPorts[i] = testaddr.Port(t), testaddr.Port(t)
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
				t.Fatalf("member %s's advertised client URL: %v", c.Names[i], err)
			}
			cfg.AdvertiseClientUrls = []url.URL{*adv}
			c.Endpoints[i] = adv.String()
		}
		e, err := startMember(cfg)
		if err != nil {
			t.Fatalf("start etcd member %s: %v", c.Names[i], err)
		}
		c.Members = append(c.Members, e)
		c.cfgs = append(c.cfgs, cfg)
		c.stopped = append(c.stopped, false)
	}
	for i, e := range c.Members {
		if err := ready(e, c.Names[i]); err != nil {
			t.Fatal(err)
		}
	}
	c.ready = time.Now()
	return c
}

// reconfigAfter is how long etcd refuses membership changes after its
// members connected ("unhealthy cluster"): every peer must have been
// active for its HealthInterval (5 s), and a margin.
const reconfigAfter = 5500 * time.Millisecond

// WaitReconfigurable waits until the cluster accepts membership changes:
// reconfigAfter since its members were first all up. etcd has no call that
// tells (it answers only the change itself), so this is the one wait on a
// clock in etcdtest.
func (c *Cluster) WaitReconfigurable() {
	time.Sleep(time.Until(c.ready.Add(reconfigAfter)))
}

// Bounds on an embedded member's start and stop. A member that takes
// longer is stuck (embed.StartEtcd closes a member that fails to start,
// and that close has been seen to wait for ever): the test fails with the
// goroutines that tell where, instead of hanging until go test's timeout.
const (
	startWait = time.Minute
	readyWait = 30 * time.Second
	stopWait  = 30 * time.Second
)

// errStuck is returned by startMember when embed.StartEtcd did not return.
var errStuck = errors.New("embed.StartEtcd did not return")

// startMember runs embed.StartEtcd, bounded by startWait.
func startMember(cfg *embed.Config) (*embed.Etcd, error) {
	type result struct {
		e   *embed.Etcd
		err error
	}
	ch := make(chan result, 1)
	go func() {
		e, err := embed.StartEtcd(cfg)
		ch <- result{e, err}
	}()
	select {
	case r := <-ch:
		if r.err == nil {
			stopClientsWhenStopping(r.e)
		}
		return r.e, r.err
	case <-time.After(startWait):
		return nil, fmt.Errorf("%w within %v; where it waits:\n%s", errStuck, startWait, interesting(allStacks()))
	}
}

func ready(e *embed.Etcd, name string) error {
	select {
	case <-e.Server.ReadyNotify():
		return nil
	case <-time.After(readyWait):
		return fmt.Errorf("etcd member %s not ready within %v", name, readyWait)
	}
}

// stopMember stops e at once (HardStop: no leadership transfer, like
// SIGKILL) and closes its listeners, failing the test if that takes more
// than stopWait.
func stopMember(t testing.TB, e *embed.Etcd, name string) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		stopClients(e.Config().Dir)
		e.Server.HardStop()
		e.Close()
	}()
	select {
	case <-done:
	case <-time.After(stopWait):
		t.Errorf("etcd member %s did not stop within %v; where it waits:\n%s", name, stopWait, interesting(allStacks()))
	}
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
	i := -1
	testkit.WaitNilEvery(c.t, d, 10*time.Millisecond, "an etcd leader", func() error {
		if i = c.Leader(); i < 0 {
			return errors.New("none among the running members")
		}
		return nil
	})
	return i
}

// Kill stops member i without handing raft leadership over (like SIGKILL)
// and closes its listeners.
func (c *Cluster) Kill(i int) {
	if c.stopped[i] {
		return
	}
	c.stopped[i] = true
	stopMember(c.t, c.Members[i], c.Names[i])
}

// DataDir returns member i's data directory.
func (c *Cluster) DataDir(i int) string { return c.cfgs[i].Dir }

// Restart starts member i again after Kill, from its data directory, on
// the same URLs.
func (c *Cluster) Restart(i int) {
	c.t.Helper()
	if !c.stopped[i] {
		c.t.Fatalf("etcd member %s is running", c.Names[i])
	}
	old := c.cfgs[i]
	cfg := hostConfig(c.t, old.Name, "", 0, 0, old.InitialCluster)
	cfg.Dir = old.Dir
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = old.ListenClientUrls, old.AdvertiseClientUrls
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = old.ListenPeerUrls, old.AdvertisePeerUrls
	cfg.ClusterState = embed.ClusterStateFlagExisting
	e, err := startMember(cfg)
	if err != nil {
		c.t.Fatalf("restart etcd member %s: %v", c.Names[i], err)
	}
	if err := ready(e, c.Names[i]); err != nil {
		stopMember(c.t, e, c.Names[i])
		c.t.Fatal(err)
	}
	c.Members[i], c.cfgs[i], c.stopped[i] = e, cfg, false
}

// Close stops every member as Kill does, all at once. Safe to call twice.
func (c *Cluster) Close() {
	var wg sync.WaitGroup
	for i := range c.Members {
		if !c.stopped[i] {
			c.stopped[i] = true
			wg.Go(func() { stopMember(c.t, c.Members[i], c.Names[i]) })
		}
	}
	wg.Wait()
}

// removeAttempt bounds one MemberRemove call of Remove's.
const removeAttempt = 5 * time.Second

// Remove removes member i from the cluster through the other running
// members, retrying for up to d while etcd refuses ("unhealthy cluster")
// and failing the test after that.
//
// It never asks member i itself: a member that applies its own removal
// stops, and the request it was serving can then go unanswered (etcd 3.6's
// EtcdServer.configure, once the change is applied, waits for raft to
// advance with no way out, and a member that stopped first never
// advances). Each attempt is bounded all the same, and a member already
// gone counts as removed: an earlier attempt took effect and its answer
// was lost.
func (c *Cluster) Remove(i int, d time.Duration) {
	c.t.Helper()
	var others []string
	for j, ep := range c.Endpoints {
		if j != i && !c.stopped[j] {
			others = append(others, ep)
		}
	}
	if len(others) == 0 {
		c.t.Fatalf("remove etcd member %s: no other member is running", c.Names[i])
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: others, DialTimeout: removeAttempt, Logger: zap.NewNop()})
	if err != nil {
		c.t.Fatal(err)
	}
	defer cli.Close()
	id := uint64(c.Members[i].Server.MemberID())
	Retry(c.t, d, "etcd to remove member "+c.Names[i], func() error {
		ctx, cancel := context.WithTimeout(context.Background(), removeAttempt)
		defer cancel()
		_, err := cli.MemberRemove(ctx, id)
		if errors.Is(err, rpctypes.ErrMemberNotFound) {
			return nil
		}
		return err
	})
}

// Retry calls f every 200 ms (testkit.WaitNilEvery) until it succeeds or d
// has passed, then fails the test.
// etcd refuses membership changes for a few seconds after members
// (re)connect ("unhealthy cluster"), so tests that change membership retry.
func Retry(t testing.TB, d time.Duration, what string, f func() error) {
	t.Helper()
	testkit.WaitNilEvery(t, d, 200*time.Millisecond, what, f)
}
