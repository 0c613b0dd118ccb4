package lab

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// Bad chaos input is refused before any lab is built, with a message that
// names the flag or fault.
func TestChaosConfigValidate(t *testing.T) {
	ok := Settings{Nodes: 3, Impl: ImplVigil, VIPLink: true}
	tests := []struct {
		name string
		cfg  ChaosConfig
		s    Settings
		want string
	}{
		{"valid", ChaosConfig{Duration: time.Minute}, ok, ""},
		{"valid with faults", ChaosConfig{Duration: time.Minute, Faults: []string{FaultPause, FaultFlap}}, ok, ""},
		{"unknown fault", ChaosConfig{Duration: time.Minute, Faults: []string{"meteor"}}, ok, `unknown fault "meteor"`},
		{"no duration", ChaosConfig{}, ok, "--duration"},
		{"pause too short", ChaosConfig{Duration: time.Minute, MaxPause: time.Second}, ok, "--max-pause"},
		{"negative freeze bound", ChaosConfig{Duration: time.Minute, FreezeBound: -time.Second}, ok, "--freeze-bound"},
		{"one node", ChaosConfig{Duration: time.Minute}, Settings{Nodes: 1, Impl: ImplVigil, VIPLink: true}, "at least 2 nodes"},
		{"keepalived", ChaosConfig{Duration: time.Minute}, Settings{Nodes: 3, Impl: ImplKeepalived}, "vigil lab"},
		{"link fault without vip link", ChaosConfig{Duration: time.Minute, Faults: []string{FaultVIPLinkDown}}, Settings{Nodes: 3, Impl: ImplVigil}, "--vip-link"},
		{"routed lab", ChaosConfig{Duration: time.Minute, Faults: DefaultFaults(Settings{Announce: AnnounceBGP})}, Settings{Nodes: 3, Impl: ImplVigil, Announce: AnnounceBGP}, ""},
	}
	if got := DefaultFaults(ok); len(got) != len(ChaosFaults) {
		t.Fatalf("DefaultFaults with a VIP link = %v, want every kind", got)
	}
	if got := DefaultFaults(Settings{Announce: AnnounceBGP}); slices.Contains(got, FaultFlap) || slices.Contains(got, FaultVIPLinkDown) || slices.Contains(got, FaultStrayLo) || len(got) != len(ChaosFaults)-3 {
		t.Fatalf("DefaultFaults without a VIP link = %v (want every kind but flap, vip-link-down and stray-lo: the VIP is on lo)", got)
	}
	// The loss and one-way faults need the nft command: Validate looks for
	// it on PATH, here one that holds an nft and one that does not.
	withNft := t.TempDir()
	if err := os.WriteFile(filepath.Join(withNft, "nft"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", withNft)
	t.Run("no nft", func(t *testing.T) {
		t.Setenv("PATH", t.TempDir())
		for _, faults := range [][]string{nil, {FaultLoss}, {FaultPause, FaultOneWay}} {
			err := ChaosConfig{Duration: time.Minute, Faults: faults}.Validate(ok)
			if err == nil || !strings.Contains(err.Error(), "apt-get install nftables") {
				t.Errorf("faults %v without nft: err = %v, want one that says to install nftables", faults, err)
			}
		}
		if err := (ChaosConfig{Duration: time.Minute, Faults: []string{FaultPause}}).Validate(ok); err != nil {
			t.Errorf("pause alone needs no nft, refused: %v", err)
		}
	})
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate(tc.s)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("err = %v, want one naming %q", err, tc.want)
			}
		})
	}
}

// The prune drills refuse a lab they cannot judge before they touch or
// wait for anything; no lab is needed to see it.
func TestPruneDrillsRefuseUnsuitableLabs(t *testing.T) {
	three := []*Node{{Name: "n1"}, {Name: "n2"}, {Name: "n3"}}
	for _, tc := range []struct {
		name  string
		s     Settings
		nodes []*Node
		want  string
	}{
		{"no --prune-after", Settings{Impl: ImplVigil}, three, "needs a lab started with --prune-after"},
		{"keepalived lab", Settings{Impl: ImplKeepalived, PruneAfter: 10 * time.Second}, three, "needs etcd and vigil"},
		{"two nodes", Settings{Impl: ImplVigil, PruneAfter: 10 * time.Second}, three[:2], "needs 3 or more nodes"},
	} {
		for _, kind := range PruneDrills {
			t.Run(tc.name+"/"+kind, func(t *testing.T) {
				l := &Lab{}
				l.st.Settings, l.st.Nodes = tc.s, tc.nodes
				if r := l.Drill(context.Background(), kind, 1); !strings.Contains(r.Error, tc.want) {
					t.Fatalf("error %q, want it to say %q", r.Error, tc.want)
				}
			})
		}
	}
}

// The watch drills refuse a lab without vigil's load balancer in front of
// the stand-in API servers before they touch anything.
func TestWatchDrillsRefuseUnsuitableLabs(t *testing.T) {
	three := []*Node{{Name: "n1"}, {Name: "n2"}, {Name: "n3"}}
	for _, tc := range []struct {
		name string
		s    Settings
	}{
		{"no load balancer", Settings{Impl: ImplVigil}},
		{"bench backends", Settings{Impl: ImplVigil, LBPort: BenchVigilPort, BackendPort: BulkPort}},
		{"keepalived lab", Settings{Impl: ImplKeepalived, LBPort: APIServerPort}},
		{"real kube-apiserver", Settings{Impl: ImplVigil, LBPort: APIServerPort, APIServer: APIServerKube}},
	} {
		for _, kind := range []string{DrillBackendPaused, DrillBackendKilled, DrillReconnectStorm} {
			t.Run(tc.name+"/"+kind, func(t *testing.T) {
				l := &Lab{}
				l.st.Settings, l.st.Nodes = tc.s, three
				if r := l.Drill(context.Background(), kind, 1); !strings.Contains(r.Error, "needs vigil's load balancer in front of the stand-in API servers") {
					t.Fatalf("error %q, want it to name what the drill needs", r.Error)
				}
			})
		}
	}
}

// TestStormNeedsConnections: reconnect-storm refuses a lab whose balancer
// would reset most of its clients, before it touches anything, and says
// what to run instead; DrillsFor leaves it out there.
func TestStormNeedsConnections(t *testing.T) {
	three := []*Node{{Name: "n1"}, {Name: "n2"}, {Name: "n3"}}
	for _, max := range []int{0, StormClients - 1} {
		l := &Lab{}
		l.st.Settings = Settings{Nodes: 3, Impl: ImplVigil, LBPort: APIServerPort, BackendPort: APIServerPort, LBMaxConns: max}
		l.st.Nodes = three
		if r := l.Drill(context.Background(), DrillReconnectStorm, 1); !strings.Contains(r.Error, "vigil-lab up --lb-max-conns") {
			t.Errorf("--lb-max-conns %d: error %q, want it to say how to run the drill", max, r.Error)
		}
		if slices.Contains(DrillsFor(l.st.Settings), DrillReconnectStorm) {
			t.Errorf("--lb-max-conns %d: DrillsFor lists %s", max, DrillReconnectStorm)
		}
	}
	for _, max := range []int{-1, StormClients} {
		s := Settings{Nodes: 3, Impl: ImplVigil, LBPort: APIServerPort, BackendPort: APIServerPort, LBMaxConns: max}
		if !slices.Contains(DrillsFor(s), DrillReconnectStorm) {
			t.Errorf("--lb-max-conns %d: DrillsFor leaves out %s", max, DrillReconnectStorm)
		}
	}
}

func TestLBBenchConfigValidate(t *testing.T) {
	ok := LBBenchConfig{Rounds: 1, Duration: time.Second, Workers: 1, Streams: 1, Samples: 1, FloodSources: 1}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []func(*LBBenchConfig){
		func(c *LBBenchConfig) { c.Flood = -1 },
		func(c *LBBenchConfig) { c.Rounds = -1 },
		func(c *LBBenchConfig) { c.Ejections = -2 },
		func(c *LBBenchConfig) { c.Duration = 0 },
		func(c *LBBenchConfig) { c.Workers = 0 },
		func(c *LBBenchConfig) { c.Samples = 0 },
		func(c *LBBenchConfig) { c.FloodSources = 0 },
		func(c *LBBenchConfig) { c.FloodSources = MaxFloodSources + 1 },
	} {
		c := ok
		bad(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
}

// The stray faults add the VIP in a form vigil did not configure.
func TestStrayForm(t *testing.T) {
	for _, tc := range []struct {
		kind, vip, wantAddr, wantDev string
	}{
		{FaultStrayVIP, "10.250.0.100/24", "10.250.0.100/24", "vip0"},
		{FaultStrayPrefix, "10.250.0.100/24", "10.250.0.100/32", "vip0"},
		{FaultStrayPrefix, "10.250.0.100/32", "10.250.0.100/24", "vip0"},
		{FaultStrayPrefix, "fd00::100/64", "fd00::100/128", "vip0"},
		{FaultStrayPrefix, "fd00::100/128", "fd00::100/120", "vip0"},
		{FaultStrayLo, "10.250.0.100/24", "10.250.0.100/24", "lo"},
	} {
		got, dev := strayForm(tc.kind, netip.MustParsePrefix(tc.vip), "vip0")
		if got.String() != tc.wantAddr || dev != tc.wantDev {
			t.Errorf("%s of %s: %s on %s, want %s on %s", tc.kind, tc.vip, got, dev, tc.wantAddr, tc.wantDev)
		}
		if !isStray(tc.kind) {
			t.Errorf("isStray(%s) = false", tc.kind)
		}
	}
}
