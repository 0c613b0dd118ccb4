package etcdcluster

import (
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/vigil-ha/vigil/internal/etcdtest"
)

func TestParsePeerTraffic(t *testing.T) {
	const text = `# HELP etcd_network_peer_received_bytes_total The total number of bytes received from peers.
# TYPE etcd_network_peer_received_bytes_total counter
etcd_network_peer_received_bytes_total{From="0"} 2760
etcd_network_peer_received_bytes_total{From="26fe03edd2e3918e"} 724839
etcd_network_peer_received_bytes_total{From="e05d56363bb2aac0"} 1.427e+04
etcd_network_peer_sent_bytes_total{To="e05d56363bb2aac0"} 99
`
	got, err := parsePeerTraffic(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	if want := map[uint64]float64{0x26fe03edd2e3918e: 724839, 0xe05d56363bb2aac0: 14270}; !maps.Equal(got, want) {
		t.Fatalf("traffic = %v, want %v (link heartbeats, From 0, left out)", got, want)
	}
	for _, bad := range []string{
		`etcd_network_peer_received_bytes_total{From="zz"} 1`,
		`etcd_network_peer_received_bytes_total{From="b2"} one`,
		`etcd_network_peer_received_bytes_total{From="b2"`,
	} {
		if _, err := parsePeerTraffic(strings.NewReader(bad + "\n")); err == nil {
			t.Errorf("parsePeerTraffic(%q) = nil error", bad)
		}
	}
}

// What a member's transport received from each peer is read from its
// client URL: the count for a live peer grows, and once the peer's etcd
// stops it stands still.
func TestPeerTrafficFollowsTheTransport(t *testing.T) {
	e := etcdtest.Start(t, 3)
	c := newCluster(t, Config{Endpoints: e.Endpoints})
	lead := e.WaitLeader(10 * time.Second)
	victim := (lead + 1) % 3
	id := uint64(e.Members[victim].Server.MemberID())
	read := func() float64 {
		t.Helper()
		tr, err := c.PeerTraffic(ctx(t), e.Endpoints[lead])
		if err != nil {
			t.Fatal(err)
		}
		return tr[id]
	}
	etcdtest.Retry(t, 10*time.Second, "the leader to receive from a live follower", func() error {
		a := read()
		time.Sleep(500 * time.Millisecond)
		if b := read(); b <= a {
			return fmt.Errorf("received %v, then %v", a, b)
		}
		return nil
	})
	e.Kill(victim)
	etcdtest.Retry(t, 10*time.Second, "the count for a stopped follower to stand still", func() error {
		a := read()
		time.Sleep(time.Second)
		if b := read(); b != a {
			return fmt.Errorf("received %v, then %v", a, b)
		}
		return nil
	})
	if _, err := c.PeerTraffic(ctx(t), e.Endpoints[victim]); err == nil {
		t.Fatal("PeerTraffic of a stopped member answered")
	}
}
