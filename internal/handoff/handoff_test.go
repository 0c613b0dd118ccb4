package handoff

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/vigil-ha/vigil/internal/etcdcluster"
	"github.com/vigil-ha/vigil/internal/etcdtest"
)

func TestMain(m *testing.M) { etcdtest.Main(m, etcdtest.LeakOptions()...) }

func TestRules(t *testing.T) {
	now := time.Now()
	st := State{Request: &Request{ID: "r", From: "a", To: "b"}, Holds: map[string]Hold{"c": {Node: "c", Until: now.Add(time.Minute)}, "d": {Node: "d", Until: now.Add(-time.Second)}}}
	for node, want := range map[string]bool{"a": true, "b": false, "c": true, "e": true} {
		if _, y := st.Yield(node); y != want {
			t.Errorf("Yield(%s) = %v, want %v", node, y, want)
		}
	}
	st.Request.To = ""
	if _, y := st.Yield("c"); y {
		t.Error("without --to, a peer stands by")
	}
	if st.Eligible("c", now) == nil || st.Eligible("d", now) != nil || st.Eligible("a", now) != nil {
		t.Error("holds: c held, d expired, a free")
	}
	// Standbys: live, unheld, neither the holder nor the node to hold.
	live := []string{"a", "b", "c", "d", "b"}
	for _, tc := range []struct {
		holder, node string
		want         []string
	}{
		{"a", "", []string{"b", "d"}},
		{"a", "b", []string{"d"}},
		{"a", "a", []string{"b", "d"}},
		{"b", "d", []string{"a"}},
	} {
		if got := st.Standbys(live, tc.holder, tc.node, now); !slices.Equal(got, tc.want) {
			t.Errorf("Standbys(holder %s, hold %s) = %v, want %v", tc.holder, tc.node, got, tc.want)
		}
	}
}

// One request at a time; End removes only its own request; holds come
// and go; records on etcd leases expire by themselves.
func TestStore(t *testing.T) {
	e := etcdtest.Start(t, 1)
	cl, err := etcdcluster.New(etcdcluster.Config{Endpoints: e.Endpoints}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	s := NewStore(cl, "")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Begin(ctx, Request{ID: "r1", From: "a"}, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := s.Begin(ctx, Request{ID: "r2", From: "b"}, time.Minute); !errors.Is(err, ErrBusy) {
		t.Fatalf("second Begin = %v, want ErrBusy", err)
	}
	if err := s.End(ctx, "r2"); err != nil {
		t.Fatal(err)
	}
	if st, err := s.Read(ctx); err != nil || st.Request == nil || st.Request.ID != "r1" {
		t.Fatalf("End of another request removed r1: %+v, %v", st.Request, err)
	}
	if err := s.Report(ctx, Status{ID: "r1", Phase: Released}, time.Minute); err != nil {
		t.Fatal(err)
	}
	if st, err := s.StatusOf(ctx, "r1"); err != nil || st == nil || st.Phase != Released {
		t.Fatalf("StatusOf = %+v, %v", st, err)
	}
	if err := s.End(ctx, "r1"); err != nil {
		t.Fatal(err)
	}
	if st, _ := s.Read(ctx); st.Request != nil {
		t.Fatalf("request after End: %+v", st.Request)
	}
	if st, _ := s.StatusOf(ctx, "r1"); st != nil {
		t.Fatalf("status after End: %+v", st)
	}

	if err := s.PutHold(ctx, Hold{Node: "c", Until: time.Now().Add(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	if st, _ := s.Read(ctx); st.Eligible("c", time.Now()) == nil {
		t.Fatal("c not held")
	}
	if had, err := s.Release(ctx, "c"); err != nil || !had {
		t.Fatalf("Release = %v, %v", had, err)
	}
	if had, _ := s.Release(ctx, "c"); had {
		t.Fatal("released twice")
	}
	// Malformed records are ignored, with why, and change nothing: a value
	// that does not decode, a hold whose node is not its key's, a request
	// without an ID. The good hold beside them still counts.
	if err := s.PutHold(ctx, Hold{Node: "d", Until: time.Now().Add(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	for key, value := range map[string]string{
		DefaultPrefix + "hold/x":  "{not json",
		DefaultPrefix + "hold/y":  `{"node":"z","until":"2099-01-01T00:00:00Z"}`,
		DefaultPrefix + "request": `{"from":"a"}`,
	} {
		if _, err := cl.Members()[0].Client.Put(ctx, key, value); err != nil {
			t.Fatal(err)
		}
	}
	st, err := s.Read(ctx)
	if err != nil {
		t.Fatalf("one malformed record made the whole state unreadable: %v", err)
	}
	if len(st.Ignored) != 3 || st.Request != nil || st.Eligible("z", time.Now()) != nil || st.Eligible("y", time.Now()) != nil || st.Eligible("d", time.Now()) == nil {
		t.Fatalf("with malformed records: ignored %v, request %+v, holds %v", st.Ignored, st.Request, st.Holds)
	}
	for _, key := range []string{"hold/x", "hold/y", "request"} {
		if _, err := cl.Members()[0].Client.Delete(ctx, DefaultPrefix+key); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Release(ctx, "d"); err != nil {
		t.Fatal(err)
	}

	// A request of a command that died ends with its lease.
	if err := s.Begin(ctx, Request{ID: "r3", From: "a"}, time.Second); err != nil {
		t.Fatal(err)
	}
	etcdtest.Retry(t, 10*time.Second, "the request's lease to expire", func() error {
		if st, err := s.Read(ctx); err != nil || st.Request != nil {
			return errors.New("still there")
		}
		return nil
	})
}

// Records of every format are read: vigil 0.3.0's (no format) and a later
// one's with fields this version does not know; this version writes its
// own format.
func TestStoreReadsEveryFormat(t *testing.T) {
	e := etcdtest.Start(t, 1)
	cl, err := etcdcluster.New(etcdcluster.Config{Endpoints: e.Endpoints}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	s := NewStore(cl, "")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cli, err := clientv3.New(clientv3.Config{Endpoints: e.Endpoints, DialTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	until := time.Now().Add(time.Hour).UTC().Format(time.RFC3339Nano)
	for key, v := range map[string]string{
		s.requestKey():    `{"id":"r1","from":"n1","to":"n2","by":"host","at":"2026-12-01T10:00:00Z"}`,
		s.holdKey("n1"):   `{"node":"n1","by":"host","until":"` + until + `"}`,
		s.holdKey("n2"):   `{"node":"n2","by":"host","until":"` + until + `","format":2,"reason":"kernel upgrade"}`,
		s.statusKey("r1"): `{"id":"r1","phase":"released","at":"2026-12-01T10:00:01Z","busy":0,"total":4,"format":2,"drainedBytes":10}`,
	} {
		if _, err := cli.Put(ctx, key, v); err != nil {
			t.Fatal(err)
		}
	}
	st, err := s.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Ignored) > 0 || st.Request == nil || st.Request.To != "n2" || len(st.Holds) != 2 || st.Holds["n2"].By != "host" {
		t.Fatalf("read %+v", st)
	}
	status, err := s.StatusOf(ctx, "r1")
	if err != nil || status == nil || status.Phase != Released || status.Total != 4 {
		t.Fatalf("status = %+v, %v", status, err)
	}
	if err := s.PutHold(ctx, Hold{Node: "n3", By: "host", Until: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	resp, err := cli.Get(ctx, s.holdKey("n3"))
	if err != nil || len(resp.Kvs) != 1 || !strings.Contains(string(resp.Kvs[0].Value), `"format":1`) {
		t.Fatalf("written hold = %v, %v", resp, err)
	}
}
