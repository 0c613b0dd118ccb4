package lab

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/vigil-ha/vigil/internal/nstest"
)

// setInstanceForTest makes name this process's lab instance until the test
// ends.
func setInstanceForTest(t *testing.T, name string) {
	t.Helper()
	old := Instance()
	if err := SetInstance(name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := SetInstance(old); err != nil {
			t.Error(err)
		}
	})
}

func TestSetInstance(t *testing.T) {
	setInstanceForTest(t, Instance())
	for name, want := range map[string]string{"": "vlab-", "b": "vlabb-", "lane2": "vlablane2-", "12345678": "vlab12345678-"} {
		if err := SetInstance(name); err != nil {
			t.Fatalf("SetInstance(%q): %v", name, err)
		}
		if Prefix != want || switchNS != want+"sw" || clientNS != want+"cl" || machineCgroupRoot != "/"+want || Instance() != name {
			t.Errorf("instance %q: prefix %q, switch %q, client %q, cgroups %q", name, Prefix, switchNS, clientNS, machineCgroupRoot)
		}
	}
	// A dash would let one instance's prefix start another's (vlabb- and
	// vlabb-c-), and the down of one remove the other's namespaces.
	for _, bad := range []string{"B", "a-b", "b-", "123456789", "a b", "a/b", "é"} {
		before := Prefix
		err := SetInstance(bad)
		if err == nil || !strings.Contains(err.Error(), "lowercase letters and digits") {
			t.Errorf("SetInstance(%q): %v, want a refusal", bad, err)
		}
		if Prefix != before {
			t.Errorf("SetInstance(%q) failed but changed the prefix to %q", bad, Prefix)
		}
	}
}

// Down removes its own instance's namespaces and no other's.
func TestDownRemovesOnlyItsInstance(t *testing.T) {
	nstest.RequireRoot(t)
	ctx := context.Background()
	mine, other := "vlabt1-sw", "vlabt2-sw"
	for _, ns := range []string{mine, other} {
		if err := ip(ctx, "netns", "add", ns); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ip(context.Background(), "netns", "del", ns) })
	}
	setInstanceForTest(t, "t1")
	if got, err := labNamespaces(ctx); err != nil || !slices.Equal(got, []string{mine}) {
		t.Fatalf("instance t1's namespaces: %v (%v), want [%s]", got, err, mine)
	}
	l, err := New(Config{Dir: t.TempDir() + "/lab"}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Down(ctx); err != nil {
		t.Fatal(err)
	}
	out, err := ipOut(ctx, "netns", "list")
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			names[f[0]] = true
		}
	}
	if names[mine] || !names[other] {
		t.Fatalf("after instance t1's down: %s left %v, %s left %v; want only %s gone", mine, names[mine], other, names[other], mine)
	}
}

// The kubeadm lab binds host paths: only the default instance builds one,
// and the refusal comes before anything is built.
func TestKubeadmLabOnlyInTheDefaultInstance(t *testing.T) {
	nstest.RequireRoot(t)
	setInstanceForTest(t, "t3")
	l, err := New(Config{Dir: t.TempDir() + "/lab"}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	err = l.Up(context.Background(), Settings{Nodes: 3, Workers: 1, Impl: ImplVigil, Kubeadm: true, LBPort: APIServerPort, BackendPort: APIServerPort, LBListenPort: 16443})
	if err == nil || !strings.Contains(err.Error(), "one at a time, in the default instance") {
		t.Fatalf("up --kubeadm in instance t3: %v", err)
	}
	if nss, _ := labNamespaces(context.Background()); len(nss) > 0 {
		t.Fatalf("namespaces after the refusal: %v", nss)
	}
}
