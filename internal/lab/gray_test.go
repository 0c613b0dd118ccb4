package lab

import (
	"bytes"
	"context"
	"encoding/json"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vigil-ha/vigil/internal/nstest"
)

func TestGrayRules(t *testing.T) {
	peers := []netip.Addr{netip.MustParseAddr("10.0.0.12"), netip.MustParseAddr("10.0.0.13")}
	in := grayRules(DirIn, peers, "drop")
	if !strings.Contains(in, "hook input") || strings.Contains(in, "hook output") || !strings.Contains(in, `iifname != "lo" ip saddr { 10.0.0.12, 10.0.0.13 } drop`) {
		t.Fatalf("one-way in:\n%s", in)
	}
	both := grayRules(DirBoth, nil, "numgen random mod 100 < 5 drop")
	if !strings.Contains(both, "hook input") || !strings.Contains(both, "hook output") || !strings.Contains(both, `oifname != "lo" numgen random mod 100 < 5 drop`) {
		t.Fatalf("loss both ways:\n%s", both)
	}
	for _, x := range []Loss{{Pct: -1, Dir: DirIn}, {Pct: 101, Dir: DirIn}, {Pct: 5, Dir: "sideways"}} {
		if err := x.Validate(); err == nil {
			t.Errorf("%+v accepted", x)
		}
	}
	for _, c := range []SweepConfig{{Each: 0, Losses: []int{5}}, {Each: time.Second}, {Each: time.Second, Latencies: []time.Duration{-time.Second}},
		{Each: time.Second, Losses: []int{120}}, {Each: time.Second, Latencies: []time.Duration{2 * time.Hour}}} {
		if err := c.Validate(); err == nil {
			t.Errorf("sweep %+v accepted", c)
		}
	}
	ok := Settings{Nodes: 3, Impl: ImplVigil}
	if err := (ChaosConfig{Duration: time.Minute, Faults: grayFaults}).Validate(ok); err != nil {
		t.Fatal(err)
	}
}

// TestGrayBadInput: `vigil-lab gray` refuses bad values with a clear error
// and a non-zero exit before it touches (or even looks for) a lab.
func TestGrayBadInput(t *testing.T) {
	bin := nstest.Binary(t, "vigil-lab")
	dir := filepath.Join(t.TempDir(), "no-lab")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"gray", "latency", "--", "-5ms"}, "negative"},
		{[]string{"gray", "latency", "3h"}, "over"},
		{[]string{"gray", "latency", "soon"}, "invalid duration"},
		{[]string{"gray", "latency", "10ms", "--jitter", "-1ms"}, "negative"},
		{[]string{"gray", "loss", "150"}, "outside 0-100"},
		{[]string{"gray", "loss", "--", "-3"}, "outside 0-100"},
		{[]string{"gray", "loss", "some"}, "whole percentage"},
		{[]string{"gray", "loss", "5", "--dir", "up"}, "in, out or both"},
		{[]string{"gray", "one-way", "--node", "n1", "--dir", "both"}, "in or out"},
		{[]string{"gray", "one-way", "--dir", "in"}, "--node is required"},
		{[]string{"gray", "sweep", "--losses", "101"}, "outside 0-100"},
		{[]string{"gray", "sweep", "--latencies", "-1s"}, "negative"},
		{[]string{"gray", "sweep", "--each", "0s"}, "must be positive"},
		{[]string{"chaos", "--faults", "latency,meteor"}, `unknown fault "meteor"`},
	} {
		cmd := exec.Command(bin, append([]string{"--dir", dir}, c.args...)...)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		if err == nil || !strings.Contains(out.String(), c.want) {
			t.Errorf("vigil-lab %s: %v, %q; want a failure saying %q", strings.Join(c.args, " "), err, out.String(), c.want)
		}
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Fatalf("vigil-lab %s created the lab directory (%v)", strings.Join(c.args, " "), err)
		}
	}
}

// TestGrayFaultsInTheLab: in a real 3-node lab, every etcd answer 250 ms
// late must not move the VIP (it took the VIP off every node before the
// renewal budget rule), 700 ms may take it but never puts it on two
// nodes and it comes back once etcd is fast, and 5 % loss on every path
// moves nothing. The lab is removed whatever happens.
func TestGrayFaultsInTheLab(t *testing.T) {
	nstest.RequireRoot(t)
	if testing.Short() {
		t.Skip("builds a 3-node lab; skipped with -short")
	}
	if nss, _ := labNamespaces(context.Background()); len(nss) > 0 {
		nstest.Unavailable(t, "a lab is already up (%v); not touching it (vigil-lab down removes it)", nss)
	}
	dir := t.TempDir()
	labBin := nstest.Binary(t, "vigil-lab")
	run := func(args ...string) []byte {
		t.Helper()
		cmd := exec.Command(labBin, append([]string{"--dir", filepath.Join(dir, "lab"), "--vigil-bin", nstest.Binary(t, "vigil")}, args...)...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("vigil-lab %s: %v\n%s\n%s", strings.Join(args, " "), err, out, stderr.String())
		}
		return out
	}
	t.Cleanup(func() {
		_ = exec.Command(labBin, "--dir", filepath.Join(dir, "lab"), "down").Run()
		_ = destroyAll(context.Background())
	})
	run("up")
	out := run("gray", "sweep", "--latencies", "250ms,700ms", "--losses", "5", "--each", "8s", "--json")
	var rows []SweepRow
	if err := json.Unmarshal(out, &rows); err != nil || len(rows) != 3 {
		t.Fatalf("sweep output (%v): %s", err, out)
	}
	for _, r := range rows {
		t.Log(r)
		if r.DualSamples > 0 {
			t.Errorf("%s: the VIP was on two nodes in %d samples", r.Fault, r.DualSamples)
		}
	}
	if r := rows[0]; r.VIPMoves != 0 || r.OutageMillis > 500 {
		t.Errorf("250ms of etcd latency moved the VIP %d times, outage %.0fms; want no move", r.VIPMoves, r.OutageMillis)
	}
	if r := rows[1]; r.BackMillis > 5000 {
		t.Errorf("after 700ms of etcd latency the VIP came back %.0fms after etcd was fast again", r.BackMillis)
	}
	if r := rows[2]; r.VIPMoves != 0 {
		t.Errorf("5%% loss moved the VIP %d times", r.VIPMoves)
	}
}
