package lab

import (
	"net"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/vigil-ha/vigil/internal/feed"
)

func TestSettingsValidate(t *testing.T) {
	for _, s := range []Settings{{Nodes: 0, Impl: ImplVigil}, {Nodes: 10, Impl: ImplVigil}, {Nodes: 3, Impl: "haproxy"},
		{Nodes: 3, Impl: ImplKeepalived, Workers: 2}, {Nodes: 3, Impl: ImplVigil, Workers: 10},
		{Nodes: 3, Impl: ImplVigil, APIServer: "k3s"}, {Nodes: 3, Impl: ImplKeepalived, APIServer: APIServerKube},
		{Nodes: 3, Impl: ImplVigil, Election: ElectionKubernetes}, {Nodes: 3, Impl: ImplVigil, Election: "raft"},
		{Nodes: 3, Impl: ImplVigil, EtcdLogLevel: "verbose"},
		// The kubeadm lab runs vigil from its manifest, behind kubeadm's
		// own API servers, with the etcd election.
		{Nodes: 3, Impl: ImplKeepalived, Kubeadm: true, LBPort: APIServerPort, BackendPort: APIServerPort},
		{Nodes: 3, Impl: ImplVigil, Kubeadm: true, LBPort: APIServerPort, BackendPort: APIServerPort, APIServer: APIServerKube},
		{Nodes: 3, Impl: ImplVigil, Kubeadm: true, LBPort: APIServerPort, BackendPort: APIServerPort, LeaseDuration: time.Second},
		{Nodes: 3, Impl: ImplVigil, Kubeadm: true, LBPort: 7443, BackendPort: APIServerPort},
		{Nodes: 3, Impl: ImplVigil, Kubeadm: true, LBPort: APIServerPort, BackendPort: APIServerPort, VIPLink: true},
		{Nodes: 3, Impl: ImplVigil, Kubeadm: true, LBPort: APIServerPort, BackendPort: APIServerPort, LBListenPort: APIServerPort},
		{Nodes: 3, Impl: ImplVigil, LBListenPort: 16443}, // without kubeadm
		// IPv6 and dual-stack labs run vigil, outside the kubeadm lab.
		{Nodes: 3, Impl: ImplVigil, IPFamily: "ipv5"}, {Nodes: 3, Impl: ImplKeepalived, IPFamily: IPv6},
		{Nodes: 3, Impl: ImplVigil, Kubeadm: true, LBPort: APIServerPort, BackendPort: APIServerPort, IPFamily: Dual},
		// The router's hashing is an ECMP lab's; BFD's interval needs BFD,
		// within what vigil run takes.
		{Nodes: 3, Impl: ImplVigil, Announce: AnnounceBGP, RouterHash: RouterHashResilient},
		{Nodes: 3, Impl: ImplVigil, LBPort: APIServerPort, Announce: AnnounceBGP, BGPMode: BGPModeECMP, RouterHash: "consistent"},
		{Nodes: 3, Impl: ImplVigil, Announce: AnnounceBGP, BFDInterval: 50 * time.Millisecond},
		{Nodes: 3, Impl: ImplVigil, Announce: AnnounceBGP, BGPBFD: true, BFDInterval: 10 * time.Millisecond},
		{Nodes: 3, Impl: ImplVigil, Announce: AnnounceBGP, BGPBFD: true, BFDInterval: 2 * time.Second},
		// --lb-max-conns is vigil's balancer's, in a lab of its own vigils.
		{Nodes: 3, Impl: ImplVigil, LBPort: APIServerPort, LBMaxConns: -2},
		{Nodes: 3, Impl: ImplVigil, LBMaxConns: 10000},
		{Nodes: 3, Impl: ImplKeepalived, LBPort: APIServerPort, LBMaxConns: 10000},
		// So is --lb-event-loops.
		{Nodes: 3, Impl: ImplVigil, LBPort: APIServerPort, LBEventLoops: -2},
		{Nodes: 3, Impl: ImplVigil, LBEventLoops: -1},
		{Nodes: 3, Impl: ImplVigil, Kubeadm: true, LBPort: APIServerPort, BackendPort: APIServerPort, LBEventLoops: 2}} {
		if err := s.Validate(); err == nil {
			t.Errorf("%+v accepted", s)
		}
	}
	for _, s := range []Settings{{Nodes: 3, Impl: ImplKeepalived}, {Nodes: 3, Impl: ImplVigil, IPFamily: Dual, Announce: AnnounceBGP}, {Nodes: 3, Impl: ImplVigil, Kubeadm: true, LBPort: APIServerPort, BackendPort: APIServerPort, Workers: 1, PruneAfter: 30 * time.Second},
		{Nodes: 3, Impl: ImplVigil, Kubeadm: true, LBPort: APIServerPort, BackendPort: APIServerPort, LBListenPort: 16443},
		{Nodes: 3, Impl: ImplVigil, LBPort: APIServerPort, Announce: AnnounceBGP, BGPMode: BGPModeECMP, RouterHash: RouterHashThreshold, BGPBFD: true, BFDInterval: 50 * time.Millisecond},
		{Nodes: 3, Impl: ImplVigil, LBPort: 7443, BackendPort: 7000, LBEventLoops: -1}} {
		if err := s.Validate(); err != nil {
			t.Error(err)
		}
	}
}

// TestListenPortsBelowEphemeral: no outgoing connection inside a lab
// namespace can draw a port a lab process is about to listen on.
func TestListenPortsBelowEphemeral(t *testing.T) {
	_, prom, err := net.SplitHostPort(promListen)
	if err != nil {
		t.Fatal(err)
	}
	promPort, err := strconv.Atoi(prom)
	if err != nil {
		t.Fatal(err)
	}
	ports := map[string]int{
		"etcd direct": etcdDirectPort, "etcd front": etcdFrontPort, "etcd client": etcdClientPort,
		"etcd peer": 2380, "kubeadm etcd metrics": 2381,
		"API server": APIServerPort, "bulk": BulkPort, "responder": ResponderPort,
		"bench vigil": BenchVigilPort, "bench HAProxy": BenchHAProxyPort,
		"agent feed": feed.DefaultPort, "vigil metrics": labMetricsPort, "Prometheus": promPort,
		"kubelet": 10250, "kube-controller-manager": 10257, "kube-scheduler": 10259,
	}
	for name, p := range ports {
		if p <= 0 || p >= ephemeralFloor {
			t.Errorf("%s listens on %d, not below the lab's ephemeral range (%d-%d)", name, p, ephemeralFloor, ephemeralCeiling)
		}
	}
	if ephemeralCeiling-ephemeralFloor < 50000 {
		t.Errorf("ephemeral range %d-%d: under 50,000 ports for the benchmarks' clients", ephemeralFloor, ephemeralCeiling)
	}
}

func TestReservedPorts(t *testing.T) {
	s := Settings{LBPort: APIServerPort, BackendPort: 20000, HealthPort: 20000, LBListenPort: 16443}
	if got := s.reservedPorts(); !slices.Equal(got, []int{16443, 20000}) {
		t.Fatalf("reservedPorts = %v, want [16443 20000]", got)
	}
	if got := (Settings{LBPort: APIServerPort, BackendPort: APIServerPort}).reservedPorts(); len(got) != 0 {
		t.Fatalf("reservedPorts = %v, want none", got)
	}
}
