package main

import (
	"bytes"
	"strings"
	"testing"
)

// Bad input to vigil-lab demo is refused before any lab is built, with a
// message that names the flag.
func TestDemoBadInput(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"demo", "--count", "0"}, "--count 0: must be at least 1"},
		{[]string{"demo", "--full", "--count", "-1"}, "--count -1: must be at least 1"},
		{[]string{"demo", "extra"}, "unknown command"},
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
