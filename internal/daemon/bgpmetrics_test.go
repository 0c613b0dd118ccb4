package daemon

import (
	"io"
	"log/slog"
	"net/netip"
	"testing"
	"time"

	"github.com/vigil-ha/vigil/internal/bgp"
)

// The BGP gauges, with the BFD one only under --bgp-bfd; before the
// speaker starts, no session counts.
func TestBGPMetrics(t *testing.T) {
	for _, bfd := range []bool{false, true} {
		cfg := bgp.Config{LocalAS: 65001, RouterID: netip.MustParseAddr("10.0.0.11"),
			Peers: []bgp.Peer{{Address: netip.MustParseAddr("10.0.0.1"), AS: 65000}}}
		if bfd {
			cfg.BFDInterval, cfg.BFDMultiplier = 100*time.Millisecond, 3
		}
		sp, err := bgp.New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err != nil {
			t.Fatal(err)
		}
		m := newNodeMetrics()
		m.registerBGP(sp)
		mfs, err := m.reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]float64{}
		for _, mf := range mfs {
			if len(mf.GetMetric()) == 1 && mf.GetMetric()[0].GetGauge() != nil {
				got[mf.GetName()] = mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		if v, ok := got["vigil_bgp_sessions_established"]; !ok || v != 0 {
			t.Errorf("bfd %v: vigil_bgp_sessions_established = %v, %v; want 0", bfd, v, ok)
		}
		if v, ok := got["vigil_bgp_bfd_sessions_up"]; ok != bfd || v != 0 {
			t.Errorf("bfd %v: vigil_bgp_bfd_sessions_up = %v, present %v", bfd, v, ok)
		}
	}
}
