package lab

import (
	"context"
	"net/netip"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/vigil-ha/vigil/internal/election"
)

func TestPromptServers(t *testing.T) {
	t0 := time.Date(2026, 12, 5, 9, 0, 0, 0, time.UTC)
	a, b, c := netip.MustParseAddr("10.250.0.11"), netip.MustParseAddr("10.250.0.12"), netip.MustParseAddr("10.250.0.13")
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	probes := []serverProbe{
		// a answers promptly until +2 s, then stalls.
		{server: a, start: at(0), took: 20 * time.Millisecond, ok: true},
		{server: a, start: at(1800), took: 30 * time.Millisecond, ok: true},
		{server: a, start: at(2100), took: 5 * time.Second},
		// b answers, but too late to count, around +3 s.
		{server: b, start: at(2900), took: 1500 * time.Millisecond, ok: true},
		// c refuses (no server there yet), then answers with an error.
		{server: c, start: at(0), took: time.Millisecond},
		{server: c, start: at(3000), took: 10 * time.Millisecond},
		// a is back at +8 s.
		{server: a, start: at(8000), took: 10 * time.Millisecond, ok: true},
	}
	for _, tc := range []struct {
		at   int
		want []netip.Addr
	}{
		{0, []netip.Addr{a}},
		{2500, []netip.Addr{a}}, // a's answer at +1.8 s is within 1 s
		{2900, nil},             // a's last prompt answer began 1.1 s earlier
		{5000, nil},             // every server stalled or failed
		{7000, []netip.Addr{a}}, // a's answer at +8 s began within 1 s
		{9001, nil},
	} {
		if got := promptServers(probes, at(tc.at)); !slices.Equal(got, tc.want) {
			t.Errorf("at +%d ms: prompt servers %v, want %v", tc.at, got, tc.want)
		}
	}
	names := map[netip.Addr]string{a: "n1"}
	if got := serverNames([]netip.Addr{a, b}, names); got != "n1 10.250.0.12" {
		t.Errorf("serverNames = %q", got)
	}
	if got := serverNames(nil, names); got != "none" {
		t.Errorf("serverNames(nil) = %q", got)
	}
}

func TestWatchedServers(t *testing.T) {
	l := &Lab{st: state{Nodes: []*Node{{Index: 1, IP: nodeIP(1)}, {Index: 3, IP: nodeIP(3)}}, Retired: []int{4}}}
	want := []netip.Addr{nodeIP(1), nodeIP(3), nodeIP(5), nodeIP(6)}
	if got := l.watchedServers(2); !slices.Equal(got, want) {
		t.Errorf("watchedServers(2) = %v, want %v", got, want)
	}
}

func TestSlowStoreDark(t *testing.T) {
	t0 := time.Date(2026, 12, 5, 9, 40, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	// The VIP answers every 10 ms, but for 400 ms from +5 s, 60 ms from
	// +12 s (a holder that stepped down and took the VIP back at once) and
	// 300 ms from +20 s; one late answer (+16 s) leaves a silence of 40 ms.
	var rs []reply
	for ms := 0; ms <= 30000; ms += 10 {
		if (ms > 5000 && ms < 5400) || (ms > 12000 && ms < 12060) || (ms > 16000 && ms < 16040) || (ms > 20000 && ms < 20300) {
			continue
		}
		rs = append(rs, reply{at: at(ms), node: "n2"})
	}
	dark := darkSpans(rs)
	if len(dark) != 3 || !dark[0].from.Equal(at(5000)) || !dark[0].to.Equal(at(5400)) || !dark[1].from.Equal(at(12000)) || !dark[2].from.Equal(at(20000)) {
		t.Fatalf("dark spans %v", dark)
	}
	writes := []storeProbe{
		{start: at(4400), took: 450 * time.Millisecond, ok: true}, // slow, just before the first silence
		{start: at(4900), took: 80 * time.Millisecond, ok: true},
		{start: at(11600), took: 2 * time.Second, ok: true},        // slow, across the short silence
		{start: at(15800), took: 500 * time.Millisecond, ok: true}, // slow, across the late answer
		{start: at(18000), took: 600 * time.Millisecond, ok: true}, // slow, but ended 1.4 s before the last
		{start: at(19500), took: 150 * time.Millisecond, ok: true},
		{start: at(25000), took: 2 * time.Second}, // failed, no silence near it
	}
	for _, tc := range []struct {
		start, end int
		want       bool
	}{
		{4800, 9800, true},    // in flight across the first silence
		{5900, 6000, true},    // within a second after it
		{6500, 6600, false},   // more than a second after it
		{1000, 4900, false},   // before it
		{11900, 12900, true},  // across the short silence
		{15900, 16900, false}, // across a late answer, which is no silence
		{19900, 24900, false}, // across the last silence, etcd answered in time then
		{25000, 26000, false}, // etcd failed, but the VIP stayed
	} {
		_, _, got := slowStoreDark(dark, writes, at(tc.start), at(tc.end))
		if got != tc.want {
			t.Errorf("request +%d..+%d ms: excused %v, want %v", tc.start, tc.end, got, tc.want)
		}
	}
	if _, slowest, _ := slowStoreDark(dark, writes, at(4800), at(9800)); slowest != 450*time.Millisecond {
		t.Errorf("slowest write %v, want 450ms", slowest)
	}
}

// TestSlowStoreBefore: the VIP seen off its holder at a check is excused
// only by a write through etcd slower than vigil's promise, or failed, that
// was under way in the second and the check interval before.
func TestSlowStoreBefore(t *testing.T) {
	base := time.Date(2026, 12, 7, 3, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return base.Add(time.Duration(ms) * time.Millisecond) }
	writes := []storeProbe{
		{start: at(0), took: 20 * time.Millisecond, ok: true},
		{start: at(1000), took: 650 * time.Millisecond, ok: true}, // slow: 1000..1650
		{start: at(5000), took: storeDoubt, ok: true},             // within the promise, as far as the watch can tell
		{start: at(9000), took: 2 * time.Second},                  // failed: 9000..11000
	}
	for _, tc := range []struct {
		seen int
		want time.Duration
	}{
		{1300, 650 * time.Millisecond}, // seen while the slow write was under way
		{2800, 650 * time.Millisecond}, // 1150 ms after it ended: within a second and a check
		{2900, 0},                      // 1250 ms after: too long ago
		{900, 0},                       // before it began
		{5500, 0},                      // writes answered within storeDoubt
		{10500, 2 * time.Second},       // a failed write
	} {
		got, ok := slowStoreBefore(writes, at(tc.seen), checkEvery)
		if ok != (tc.want != 0) || got != tc.want {
			t.Errorf("VIP off its holder at +%d ms: excused by %v (%v), want %v", tc.seen, got, ok, tc.want)
		}
	}
}

// TestStoreWatchSeesEveryStallThatFences holds the store watch to what it
// must tell the drills: etcd stalls (every write whose answer falls in the
// stall is answered at its end), at every phase against the holder's
// renewals and the watch's writes, for 300 to 600 ms. A holder at the
// default timings renews every RetryPeriod, and is fenced when the renew
// deadline after the start of the last renewal answered passes before the
// next answer. Every stall that fences it must leave a write of the
// watch's slower than storeDoubt under way before the fence (so the VIP's
// move is excused), and no stall that every write rides out within
// storeDoubt may leave one (a move then is vigil's fault). Between the two
// (a slowest write of the watch's between storeDoubt and storePromise) the watch cannot tell
// whether a renewal of the holder's took longer than storePromise, and
// excuses.
func TestStoreWatchSeesEveryStallThatFences(t *testing.T) {
	const (
		answer = 2 * time.Millisecond // a write's time when etcd does not stall
		retry  = election.DefaultRetryPeriod
		renew  = election.DefaultRenewDeadline
	)
	fenced, kept := 0, 0
	for watchPhase := time.Duration(0); watchPhase < storeWatchInterval; watchPhase += storeWatchInterval / 6 {
		for off := time.Duration(0); off < retry; off += 5 * time.Millisecond {
			for stall := 300 * time.Millisecond; stall <= 600*time.Millisecond; stall += 10 * time.Millisecond {
				synctest.Test(t, func(t *testing.T) {
					t0 := time.Now() // the holder renews at t0 + k*retry
					from := t0.Add(time.Second + off)
					to := from.Add(stall)
					answerAt := func(start time.Time) time.Time {
						a := start.Add(answer)
						if !a.Before(from) && a.Before(to) {
							a = to
						}
						return a
					}
					// The holder: the last renewal answered before the
					// stall, and whether its deadline passes before the
					// stall's end; the longest any renewal took.
					var last time.Time
					var holderSlowest time.Duration
					for r := t0; r.Before(to.Add(time.Second)); r = r.Add(retry) {
						a := answerAt(r)
						holderSlowest = max(holderSlowest, a.Sub(r))
						if a.Before(from) {
							last = r
						}
					}
					fence := last.Add(renew)
					isFenced := fence.Before(to)

					time.Sleep(watchPhase)
					w := startStoreWatch(func(ctx context.Context) error {
						select {
						case <-time.After(time.Until(answerAt(time.Now()))):
							return nil
						case <-ctx.Done():
							return ctx.Err()
						}
					})
					time.Sleep(time.Until(to.Add(time.Second)))
					probes := w.close()
					excused := false
					if isFenced {
						_, excused = slowStoreBefore(probes, fence, 0)
					}
					anySlow := slices.ContainsFunc(probes, func(p storeProbe) bool { return p.slow() })
					switch {
					case isFenced && !excused:
						t.Errorf("a %v stall at +%v (watch phase %v) fences the holder at +%v, and no write of the watch's before it was slower than %v", stall, off, watchPhase, fence.Sub(t0), storeDoubt)
					case stall+answer <= storeDoubt && anySlow:
						t.Errorf("a %v stall at +%v (watch phase %v): every write was answered within %v, yet the watch saw one slower", stall, off, watchPhase, storeDoubt)
					case isFenced && holderSlowest <= storePromise:
						t.Errorf("a %v stall at +%v fences the holder at +%v, though its renewals were answered within %v (%v at most): the model of the holder is wrong", stall, off, fence.Sub(t0), storePromise, holderSlowest)
					}
					if isFenced {
						fenced++
					} else {
						kept++
					}
				})
			}
		}
	}
	// Both kinds of stall were tried.
	if fenced == 0 || kept == 0 {
		t.Fatalf("%d stalls fenced the holder and %d did not; the test needs both", fenced, kept)
	}
	t.Logf("%d stalls fenced the holder, each seen by the watch; %d did not", fenced, kept)
}
