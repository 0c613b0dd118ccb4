package recovery

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/vigil-ha/vigil/internal/etcdtest"
	"github.com/vigil-ha/vigil/internal/testkit"
)

// ctx bounds one step of a test.
func ctx(t *testing.T) context.Context { return testkit.Context(t, 2*time.Minute) }

func TestMain(m *testing.M) {
	etcdtest.Main(m, etcdtest.MemberChangeLeakOptions()...)
}

func client(t *testing.T, eps ...string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// treeHash is a digest of every file's path, mode and content under dir.
func treeHash(t *testing.T, dir string) string {
	t.Helper()
	h := sha256.New()
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%s %v\n", p, info.Mode())
		if info.Mode().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			h.Write(b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%x", h.Sum(nil))
}

// A 3-member cluster loses two members for good. Every refusal on the
// way leaves the survivor's data directory byte for byte as it was; then
// recover makes it a one-member cluster with every key it had, including
// the writes its database had not flushed when its etcd was killed.
func TestRecoverKeepsWhatTheSurvivorCommitted(t *testing.T) {
	c := etcdtest.StartDistinct(t, 3)
	c.WaitLeader(10 * time.Second)
	cli := client(t, c.Endpoints...)
	const keys = 200
	for i := range keys {
		if _, err := cli.Put(ctx(t), fmt.Sprintf("/k/%03d", i), fmt.Sprint(i)); err != nil {
			t.Fatal(err)
		}
	}
	dir := c.DataDir(0)
	cfg := Config{DataDir: dir, Name: c.Names[0], Now: func() time.Time { return time.Date(2026, 12, 5, 3, 0, 0, 0, time.UTC) }}
	refused := func(what string, cfg Config, want string) {
		t.Helper()
		before := ""
		if _, err := os.Stat(cfg.DataDir); err == nil {
			before = treeHash(t, cfg.DataDir)
		}
		_, err := Recover(ctx(t), cfg, t.Logf)
		if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "\n") {
			t.Fatalf("%s: Recover = %v; want a one-line refusal saying %q", what, err, want)
		}
		t.Logf("%s: %v", what, err)
		if before != "" && treeHash(t, cfg.DataDir) != before {
			t.Fatalf("%s: the data directory changed", what)
		}
		if _, err := os.Stat(dir + ".vigil-backup-20261205T030000Z"); err == nil {
			t.Fatalf("%s: a backup was made", what)
		}
	}

	// A running etcd holds its database.
	_, err := Recover(ctx(t), cfg, t.Logf)
	if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "etcd is running") {
		t.Fatalf("Recover on a running member = %v", err)
	}
	// A dry run may look while it runs (from a copy of the database), and
	// tells the truth: the cluster has its quorum.
	dryRunning := cfg
	dryRunning.DryRun = true
	if _, err := Recover(ctx(t), dryRunning, t.Logf); !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "has not lost its quorum") {
		t.Fatalf("a dry run on a running member of a healthy cluster = %v", err)
	}
	// Stopped, but the two others still make a quorum.
	c.Kill(0)
	refused("quorum reachable", cfg, "has not lost its quorum")
	// --force overrides that check alone (a dry run here: the real one
	// would split the cluster).
	forced := cfg
	forced.DryRun, forced.Force = true, true
	if r, err := Recover(ctx(t), forced, t.Logf); err != nil || len(r.Answering) != 2 {
		t.Fatalf("a forced dry run with the quorum reachable = %+v, %v; want it to go on, naming the 2 that answer", r, err)
	}
	forcedWrongName := forced
	forcedWrongName.Name = "m9"
	refused("wrong name, forced", forcedWrongName, `no member named "m9"`)
	// The two others are lost for good.
	c.Kill(1)
	c.Kill(2)
	refused("not etcd's", Config{DataDir: t.TempDir(), Name: "m1"}, "not an etcd data directory")
	refused("wrong name", Config{DataDir: dir, Name: "m9"}, `no member named "m9"`)
	refused("no name", Config{DataDir: dir}, "name is required")
	refused("wrong peer URL", Config{DataDir: dir, Name: c.Names[0], PeerURL: "http://10.0.0.99:2380"}, "not http://10.0.0.99:2380")
	before := treeHash(t, dir)
	dry := cfg
	dry.DryRun = true
	if r, err := Recover(ctx(t), dry, t.Logf); err != nil || len(r.Removed) != 2 || r.Backup != "" {
		t.Fatalf("dry run = %+v, %v", r, err)
	}
	if treeHash(t, dir) != before {
		t.Fatal("the dry run changed the data directory")
	}

	cfg.PeerURL = c.PeerURL(0)
	r, err := Recover(ctx(t), cfg, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	if r.Backup != dir+".vigil-backup-20261205T030000Z" || treeHash(t, r.Backup) == "" {
		t.Fatalf("backup %q", r.Backup)
	}
	t.Cleanup(func() { _ = os.RemoveAll(r.Backup) })
	// Run again: a one-member cluster has its quorum.
	if _, err := Recover(ctx(t), cfg, t.Logf); !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "has not lost its quorum") {
		t.Fatalf("a second recover = %v, want refused: the cluster of one has its quorum", err)
	}

	// Its etcd starts as before, a one-member cluster with every key.
	c.Restart(0)
	cli0 := client(t, c.Endpoints[0])
	ml, err := cli0.MemberList(ctx(t))
	if err != nil || len(ml.Members) != 1 || ml.Members[0].Name != c.Names[0] {
		t.Fatalf("member list after recovery = %v, %v", ml, err)
	}
	got, err := cli0.Get(ctx(t), "/k/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || got.Count != keys {
		t.Fatalf("keys after recovery = %v, %v; want %d", got, err, keys)
	}
	if _, err := cli0.Put(ctx(t), "/after", "recovery"); err != nil {
		t.Fatalf("a write after recovery: %v", err)
	}
}

// Of several survivors without a quorum, recover runs only on the one that
// knows the most committed, unless forced.
func TestRecoverRefusesALaggingSurvivor(t *testing.T) {
	c := etcdtest.StartDistinct(t, 5)
	c.WaitLeader(10 * time.Second)
	cli := client(t, c.Endpoints...)
	if _, err := cli.Put(ctx(t), "/before", "all five"); err != nil {
		t.Fatal(err)
	}
	// m0 stops first; the other four go on committing without it (once
	// they have a leader again, if m0 led: retried until then).
	c.Kill(0)
	for i := range 50 {
		key := fmt.Sprintf("/k/%02d", i)
		etcdtest.Retry(t, 30*time.Second, "put "+key, func() error {
			_, err := cli.Put(ctx(t), key, "without m0")
			return err
		})
	}
	// Then three of them are lost: m1 alone runs, without a quorum.
	c.Kill(2)
	c.Kill(3)
	c.Kill(4)
	dir := c.DataDir(0)
	before := treeHash(t, dir)
	cfg := Config{DataDir: dir, Name: c.Names[0]}
	_, err := Recover(ctx(t), cfg, t.Logf)
	want := c.Names[1] + " "
	if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "is further ahead") || !strings.HasPrefix(strings.TrimPrefix(err.Error(), ErrRefused.Error()+": "), want) {
		t.Fatalf("Recover on the lagging survivor = %v; want a refusal naming %s as further ahead", err, c.Names[1])
	}
	t.Log(err)
	if treeHash(t, dir) != before {
		t.Fatal("the refusal changed the data directory")
	}
	// Forced, a dry run goes on (and says what it overrides).
	var said []string
	forced := cfg
	forced.DryRun, forced.Force = true, true
	r, err := Recover(ctx(t), forced, func(f string, a ...any) { said = append(said, fmt.Sprintf(f, a...)) })
	if err != nil || len(r.Answering) != 1 || r.Answering[0].Name != c.Names[1] || r.Answering[0].Committed <= r.Self.Committed {
		t.Fatalf("forced dry run = %+v, %v", r, err)
	}
	if !slices.ContainsFunc(said, func(s string) bool {
		return strings.Contains(s, "warning (--force)") && strings.Contains(s, "further ahead")
	}) {
		t.Fatalf("the forced dry run did not say what it overrode: %q", said)
	}
	// On the survivor that is ahead (a dry run, while its etcd runs), no
	// refusal: nobody that answers knows more.
	if r, err := Recover(ctx(t), Config{DataDir: c.DataDir(1), Name: c.Names[1], DryRun: true}, t.Logf); err != nil || len(r.Answering) != 0 {
		t.Fatalf("dry run on the survivor ahead = %+v, %v", r, err)
	}
}

func TestMostAdvancedSkipsLearners(t *testing.T) {
	ms := []Member{
		{Name: "m2", Committed: 40},
		{Name: "m3", Committed: 90, IsLearner: true}, // recovery refuses learners
		{Name: "m4", Committed: 55},
	}
	if got := mostAdvanced(ms); got == nil || got.Name != "m4" {
		t.Fatalf("mostAdvanced = %+v, want m4", got)
	}
	if got := mostAdvanced([]Member{{Name: "m3", IsLearner: true, Committed: 9}}); got != nil {
		t.Fatalf("mostAdvanced of learners only = %+v, want nil", got)
	}
	if got := mostAdvanced(nil); got != nil {
		t.Fatalf("mostAdvanced(nil) = %+v", got)
	}
}
