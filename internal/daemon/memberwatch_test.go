package daemon

import (
	"context"
	"log/slog"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/vigil-ha/vigil/internal/membership"
)

// Each observation sets one unreachable-seconds series per member, and a
// member gone from etcd loses its series; a prune is counted.
func TestMemberWatch(t *testing.T) {
	m := newNodeMetrics()
	w := &memberWatch{m: m, cfg: Config{NodeSettings: NodeSettings{NodeName: "n1"}}, log: slog.New(slog.DiscardHandler)}
	report := func(s ...membership.Sighting) membership.Report {
		r := membership.Report{Members: map[string]membership.Sighting{}}
		for _, x := range s {
			r.Members[x.Name] = x
		}
		return r
	}
	ctx := context.Background()
	w.observed(ctx, membership.View{}, report(membership.Sighting{Name: "n2", Reachable: true}, membership.Sighting{Name: "n3", DownMillis: 4500}))
	if got := value(t, m.memberDown.WithLabelValues("n3")); got != 4.5 {
		t.Fatalf("n3 unreachable for %v s, want 4.5", got)
	}
	if n := count(m.memberDown); n != 2 {
		t.Fatalf("%d series, want one per member", n)
	}
	w.observed(ctx, membership.View{}, report(membership.Sighting{Name: "n2", Reachable: true}))
	if n := count(m.memberDown); n != 1 {
		t.Fatalf("%d series after n3 left etcd, want 1", n)
	}
	w.pruned(ctx, membership.Member{Name: "n3"})
	if got := value(t, m.prunes); got != 1 {
		t.Fatalf("prunes = %v, want 1", got)
	}
}

func value(t *testing.T, c prometheus.Metric) float64 {
	t.Helper()
	var d dto.Metric
	if err := c.Write(&d); err != nil {
		t.Fatal(err)
	}
	switch {
	case d.Gauge != nil:
		return d.Gauge.GetValue()
	case d.Counter != nil:
		return d.Counter.GetValue()
	}
	t.Fatalf("%v is neither a gauge nor a counter", c.Desc())
	return 0
}

func count(c prometheus.Collector) int {
	ch := make(chan prometheus.Metric, 100)
	c.Collect(ch)
	close(ch)
	return len(ch)
}
