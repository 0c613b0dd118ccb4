package etcdcluster

import (
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/vigil-ha/vigil/internal/etcdtest"
)

func TestParsePeerLinks(t *testing.T) {
	const text = `# HELP etcd_network_active_peers The current number of active peer connections.
# TYPE etcd_network_active_peers gauge
etcd_network_active_peers{Local="a1",Remote="b2"} 1
etcd_network_active_peers{Local="a1",Remote="c3"} 0
etcd_network_active_peers{Local="ff",Remote="a1"} 1
etcd_network_disconnected_peers_total{Local="a1",Remote="c3"} 2
`
	got, err := parsePeerLinks(strings.NewReader(text), 0xa1)
	if err != nil {
		t.Fatal(err)
	}
	if want := map[uint64]bool{0xb2: true, 0xc3: false}; !maps.Equal(got, want) {
		t.Fatalf("links of a1 = %v, want %v (another member's lines left out)", got, want)
	}
	if got, err := parsePeerLinks(strings.NewReader(text), 0xd4); err != nil || len(got) != 0 {
		t.Fatalf("links of a member with no lines = %v, %v; want none", got, err)
	}
	for _, bad := range []string{
		`etcd_network_active_peers{Local="a1",Remote="zz"} 1`,
		`etcd_network_active_peers{Local="a1",Remote="b2"} one`,
		`etcd_network_active_peers{Local="a1",Remote="b2"`,
	} {
		if _, err := parsePeerLinks(strings.NewReader(bad+"\n"), 0xa1); err == nil {
			t.Errorf("parsePeerLinks(%q) = nil error", bad)
		}
	}
}

// A member's transport links with its peers are read from its client
// URL; a peer whose etcd stops is seen unlinked within seconds.
func TestPeerLinksFollowTheTransport(t *testing.T) {
	e := etcdtest.Start(t, 3)
	c := newCluster(t, Config{Endpoints: e.Endpoints})
	e.WaitLeader(10 * time.Second)
	id := func(i int) uint64 { return uint64(e.Members[i].Server.MemberID()) }
	etcdtest.Retry(t, 10*time.Second, "member 1 linked with both peers", func() error {
		links, err := c.PeerLinks(ctx(t), e.Endpoints[0], id(0))
		if err != nil {
			return err
		}
		if !links[id(1)] || !links[id(2)] {
			return fmt.Errorf("links %v", links)
		}
		return nil
	})
	e.Kill(2)
	start := time.Now()
	etcdtest.Retry(t, 15*time.Second, "member 1 to lose its link with member 3", func() error {
		links, err := c.PeerLinks(ctx(t), e.Endpoints[0], id(0))
		if err != nil {
			return err
		}
		if links[id(2)] || !links[id(1)] {
			return fmt.Errorf("links %v", links)
		}
		return nil
	})
	t.Logf("link lost %v after the kill", time.Since(start).Round(time.Millisecond))
	if _, err := c.PeerLinks(ctx(t), e.Endpoints[2], id(2)); err == nil {
		t.Fatal("PeerLinks of a stopped member answered")
	}
}
