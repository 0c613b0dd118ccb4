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

// A move waits while the leader answers later than the slowest other voter
// by more than shedLeaderLag; a learner's answer does not count, and a
// leader that did not answer lags by the whole status timeout.
func TestLeaderLag(t *testing.T) {
	ms := time.Millisecond
	voters := map[uint64]string{1: "n1", 2: "n2", 3: "n3"}
	for _, tc := range []struct {
		name    string
		answers []Status
		want    time.Duration
	}{
		{"as quick as the others", []Status{{ID: 1, Took: 2 * ms}, {ID: 2, Took: 3 * ms}, {ID: 3, Took: 1 * ms}}, 0},
		{"behind the slowest", []Status{{ID: 1, Took: 40 * ms}, {ID: 2, Took: 3 * ms}, {ID: 3, Took: 9 * ms}}, 31 * ms},
		{"a slow learner does not count", []Status{{ID: 1, Took: 40 * ms}, {ID: 2, Took: 3 * ms}, {ID: 4, Took: 90 * ms, Learner: true}}, 37 * ms},
		{"a slow non-voter does not count", []Status{{ID: 1, Took: 40 * ms}, {ID: 2, Took: 3 * ms}, {ID: 9, Took: 90 * ms}}, 37 * ms},
		{"no answer from the leader", []Status{{ID: 2, Took: 3 * ms}, {ID: 3, Took: 1 * ms}}, statusTimeout},
	} {
		if got := leaderLag(tc.answers, 1, voters); got != tc.want {
			t.Errorf("%s: leaderLag = %v, want %v", tc.name, got, tc.want)
		}
	}
}
