package lab

import (
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
	}
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
