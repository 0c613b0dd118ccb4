package main

import (
	"bytes"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/vigil-ha/vigil/internal/daemon"
	"github.com/vigil-ha/vigil/internal/discovery"
)

func TestStatusPrintsTheLocalView(t *testing.T) {
	since := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	conflictSince := since.Add(30 * time.Second)
	rep := daemon.Report{Node: "cp1", VIP: "10.0.0.100/24", Leader: true, Holder: "cp1", LeaderSince: &since, HolderMAC: "02:00:00:00:00:01",
		Conflict: daemon.ConflictReport{MACs: []string{"02:00:00:00:00:99"}, Since: &conflictSince, Total: 1},
		Etcd: &daemon.EtcdReport{ClusterID: "cdf818194e3a8c32", Foreign: []daemon.ForeignReport{
			{Endpoint: "https://10.0.0.13:2379", ClusterID: "1c5e9a1a2b3c4d5e", Answers: 42, Last: since.Add(80 * time.Second)}}},
		Renewal: &daemon.RenewalReport{LatencyMillis: 420, MarginMillis: 38, MinMarginMillis: 21, RenewDeadlineMillis: 500, AtRisk: "the lock store answered a renewal in 420ms"},
		Backends: []daemon.BackendReport{
			{Address: "10.0.0.11:6443", State: "up", Connections: 3},
			{Address: "10.0.0.12:6443", State: "down", Cause: "dead", LastError: "connection refused"},
		},
		Discovery: []discovery.SourceState{
			{Name: discovery.SourceEtcd, Backends: []string{"10.0.0.11:6443", "10.0.0.12:6443"}, Answered: true, Error: "context deadline exceeded"},
			{Name: discovery.SourceKubernetes},
		}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/status" {
			http.NotFound(w, r)
			return
		}
		_ = json.NewEncoder(w).Encode(rep)
	}))
	defer srv.Close()
	got, _, err := fetchStatus(strings.TrimPrefix(srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := printReport(&out, got, since.Add(90*time.Second)); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"holder cp1 (02:00:00:00:00:01)", "VIP CONFLICT: 02:00:00:00:00:99 answer(s) for the VIP besides the holder, since 2026-11-30T12:00:30Z (1m0s); 1 conflicts since start", "leads since 2026-11-30T12:00:00Z (1m30s)", "10.0.0.11:6443  up", "down (dead)", "connection refused",
		"discovery: etcd member list: 2 backends, last read failed: context deadline exceeded", "discovery: kubernetes EndpointSlices: no answer yet",
		"renewals: answered in 420ms, 38ms of the 500ms renew deadline left (least in 10s: 21ms)", "LEASE AT RISK: the lock store answered a renewal in 420ms",
		"etcd cluster cdf818194e3a8c32", "ETCD IMPOSTOR: https://10.0.0.13:2379 answers for cluster 1c5e9a1a2b3c4d5e (42 answers refused, the last 10s ago)"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

func TestStatusWithoutDaemon(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	if _, _, err := fetchStatus(addr); err == nil || !strings.Contains(err.Error(), "no vigil run answers on "+addr) {
		t.Fatalf("err = %v, want a clear 'no vigil run' message", err)
	}
}
