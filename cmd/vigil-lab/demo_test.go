package main

import (
	"bytes"
	"strings"
	"testing"
)

// Bad input to vigil-lab demo, drill and storm is refused before any lab is built
// or touched, with a message that names the flag.
func TestDemoBadInput(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"demo", "--count", "0"}, "--count 0: must be at least 1"},
		{[]string{"demo", "--full", "--count", "-1"}, "--count -1: must be at least 1"},
		{[]string{"demo", "extra"}, "unknown command"},
		{[]string{"drill", "rolling-upgrade"}, "rolling-upgrade needs it"},
		{[]string{"drill", "kill-leader", "--from", "HEAD~1"}, "--from goes with the drill rolling-upgrade"},
		{[]string{"--instance", "B", "down"}, `lab instance "B": want 1 to 8 lowercase letters and digits`},
		{[]string{"--instance", "a-b", "status"}, `lab instance "a-b"`},
		{[]string{"storm"}, "--config is required"},
		{[]string{"storm", "--config", "{"}, "--config: unexpected end of JSON input"},
		{[]string{"storm", "--config", `{"clients":0}`}, "need targets, sources and clients above 0"},
		{[]string{"storm", "--config", `{"targets":["10.250.0.100:6443"],"sources":["10.250.1.1"],"clients":1,"every":1000}`}, "every 1µs is below the stand-in's"},
	} {
		root := newRoot()
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetErr(&out)
		root.SetArgs(tc.args)
		err := root.Execute()
		if err == nil || !strings.Contains(err.Error()+out.String(), tc.want) {
			t.Errorf("vigil-lab %v: %v\n%s\nwant an error saying %q", tc.args, err, out.String(), tc.want)
		}
	}
}
