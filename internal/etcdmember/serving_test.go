package etcdmember

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// One rule for both kinds of member: etcd's own pb.Member (etcdcluster)
// and the JSON gateway's (Lister).
func TestServingOf(t *testing.T) {
	want := Serving{
		URLs:      []string{"https://10.0.0.11:2379", "https://10.0.0.12:2379", "https://[fd00::13]:2379"},
		HostPorts: []string{"10.0.0.11:2379", "10.0.0.12:2379", "[fd00::13]:2379"},
		Hosts:     []string{"10.0.0.11", "10.0.0.12", "fd00::13"},
	}
	members := []*pb.Member{
		{ClientURLs: []string{"https://10.0.0.12:2379"}},
		{ClientURLs: []string{"https://127.0.0.1:2379", "https://10.0.0.11:2379"}},
		{ClientURLs: []string{"https://10.0.0.14:2379"}, IsLearner: true},
		{Name: "", PeerURLs: []string{"https://10.0.0.15:2380"}},
		{ClientURLs: []string{"https://[fd00::13]:2379", "::bad"}},
	}
	got := ServingOf(members)
	if d := cmp.Diff(want, got); d != "" {
		t.Fatal(d)
	}
	var gw []GatewayMember
	for _, m := range members {
		gw = append(gw, GatewayMember{Name: m.Name, PeerURLs: m.PeerURLs, ClientURLs: m.ClientURLs, IsLearner: m.IsLearner})
	}
	if d := cmp.Diff(want, ServingOf(gw)); d != "" {
		t.Fatalf("gateway members: %s", d)
	}
	if d := cmp.Diff([]string{"10.0.0.11:6443", "10.0.0.12:6443", "[fd00::13]:6443"}, WithPort(got.Hosts, 6443)); d != "" {
		t.Fatal(d)
	}
	// Only loopback: a single-node cluster on one machine.
	if d := cmp.Diff([]string{"127.0.0.1"}, ServingOf([]*pb.Member{{ClientURLs: []string{"http://127.0.0.1:2379"}}}).Hosts); d != "" {
		t.Fatal(d)
	}
}
