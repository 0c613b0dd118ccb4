package membership

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vigil-ha/vigil/internal/etcdtest"
	"github.com/vigil-ha/vigil/internal/netfault"
	"github.com/vigil-ha/vigil/internal/testkit"
	"github.com/vigil-ha/vigil/internal/validate"
)

// ctx bounds one step of a test.
func ctx(t *testing.T) context.Context { return testkit.Context(t, 60*time.Second) }

func TestMain(m *testing.M) {
	etcdtest.Main(m, etcdtest.MemberChangeLeakOptions()...)
}

func newCluster(t *testing.T, c *etcdtest.Cluster) *Cluster {
	t.Helper()
	cl, err := New(Config{Endpoints: c.Endpoints}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	return cl
}

func say(t *testing.T) Reporter {
	return func(e Event) { t.Logf("%s [%s %s]", e.Text, e.Kind, e.Member) }
}

func names(t *testing.T, cl *Cluster) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	v, err := cl.View(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range v.Members {
		out = append(out, m.Name)
	}
	return out
}

// settle waits until etcd accepts membership changes: it refuses them for a
// few seconds after start, until every member has been connected a while.
func settle(t *testing.T, c *etcdtest.Cluster) {
	t.Helper()
	c.WaitLeader(10 * time.Second)
	c.WaitReconfigurable()
}

func TestViewAndRemove(t *testing.T) {
	c := etcdtest.StartDistinct(t, 3)
	cl := newCluster(t, c)
	settle(t, c)
	v, err := cl.View(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	leaders := 0
	for _, m := range v.Members {
		if !m.Reachable || m.DBSize == 0 || m.RaftIndex == 0 {
			t.Fatalf("member %+v not observed as healthy", m)
		}
		if m.Leader {
			leaders++
		}
	}
	if leaders != 1 || v.LeaderID == 0 {
		t.Fatalf("%d leaders in %+v", leaders, v)
	}

	// Refusals leave the membership unchanged.
	for _, tc := range []struct {
		target string
		want   error
	}{{"m9", ErrUnknownMember}, {"m3", ErrRefused}} {
		if err := cl.Remove(ctx(t), tc.target, false, say(t)); !errors.Is(err, tc.want) {
			t.Fatalf("Remove(%s) = %v, want %v", tc.target, err, tc.want)
		}
		if got := names(t, cl); !slices.Equal(got, []string{"m1", "m2", "m3"}) {
			t.Fatalf("members after a refusal: %v", got)
		}
	}

	// A dead member goes without --force.
	c.Kill(2)
	if err := cl.Remove(ctx(t), "m3", false, say(t)); err != nil {
		t.Fatal(err)
	}
	if got := names(t, cl); !slices.Equal(got, []string{"m1", "m2"}) {
		t.Fatalf("members: %v", got)
	}

	// Now a 2-member cluster: with one of them dead there is no quorum, and
	// nothing is removed.
	c.Kill(1)
	err = cl.Remove(ctx(t), "m2", false, say(t))
	if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "no quorum") {
		t.Fatalf("Remove in a 2-member cluster with one dead = %v, want a no-quorum refusal", err)
	}
}

func TestRemoveLeaderMovesLeadershipFirst(t *testing.T) {
	c := etcdtest.StartDistinct(t, 3)
	cl := newCluster(t, c)
	settle(t, c)
	leader := c.Names[c.WaitLeader(10*time.Second)]
	var kinds []EventKind
	if err := cl.Remove(ctx(t), leader, true, func(e Event) {
		t.Logf("%s [%s %s]", e.Text, e.Kind, e.Member)
		if e.Kind != EventMoveRetry && e.Kind != EventUnhealthy { // retries depend on timing
			kinds = append(kinds, e.Kind)
		}
		if e.Member == "" || !strings.HasPrefix(e.Member, leader+" ") {
			t.Errorf("event %+v does not name the member removed, %s", e, leader)
		}
	}); err != nil {
		t.Fatal(err)
	}
	if want := []EventKind{EventMovingLeader, EventRemoving, EventRemoved}; !slices.Equal(kinds, want) {
		t.Fatalf("events %v, want %v: leadership moved first, then the removal", kinds, want)
	}
	if got := names(t, cl); slices.Contains(got, leader) || len(got) != 2 {
		t.Fatalf("members after removing the leader %s: %v", leader, got)
	}
}

func TestRefusalsAgainstRealCluster(t *testing.T) {
	t.Run("1 of 3 healthy", func(t *testing.T) {
		c := etcdtest.StartDistinct(t, 3)
		cl := newCluster(t, c)
		settle(t, c)
		c.Kill(1)
		c.Kill(2)
		err := cl.Remove(ctx(t), "m3", false, say(t))
		if !errors.Is(err, ErrRefused) {
			t.Fatalf("Remove = %v, want a refusal", err)
		}
		t.Log(err)
	})
	t.Run("learner does not count", func(t *testing.T) {
		c := etcdtest.StartDistinct(t, 3)
		cl := newCluster(t, c)
		settle(t, c)
		// A learner is added and started; then m3 dies. Removing healthy
		// m2 would leave m1 and the learner: one voter of two.
		peer, client := c.NewMemberURLs()
		add, err := cl.addAsLearner(ctx(t), peer)
		if err != nil {
			t.Fatal(err)
		}
		// Its etcd fetches the cluster from the first member that answers
		// and refuses to start ("member count is unequal") if that one has
		// not applied the addition yet; Replace waits for the same.
		if err := cl.awaitKnown(ctx(t), add.Member.ID, "l4", say(t)); err != nil {
			t.Fatal(err)
		}
		var initial []string
		for _, m := range add.Members {
			n := m.Name
			if m.ID == add.Member.ID {
				n = "l4"
			}
			initial = append(initial, n+"="+m.PeerURLs[0])
		}
		c.Add("l4", peer, client, strings.Join(initial, ","))
		c.Kill(2)
		err = cl.Remove(ctx(t), "m2", true, say(t))
		if !errors.Is(err, ErrRefused) {
			t.Fatalf("Remove = %v, want a refusal", err)
		}
		t.Log(err)
		if got := names(t, cl); len(got) != 4 {
			t.Fatalf("members after a refusal: %v", got)
		}
	})
}

// publishAs writes a report as observer would.
func publishAs(t *testing.T, c *etcdtest.Cluster, r Report) {
	t.Helper()
	cl := newCluster(t, c)
	// Publish gives each try one second, and a try balanced onto a member
	// the test just killed, or slowed by a loaded machine, can use it up:
	// the observer simply publishes again next round, and so does this.
	etcdtest.Retry(t, 15*time.Second, "publish "+r.Observer+"'s report", func() error {
		return cl.Publish(ctx(t), r)
	})
}

func byName(t *testing.T, cl *Cluster) map[string]Member {
	t.Helper()
	v, err := cl.View(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]Member{}
	for _, m := range v.Members {
		out[m.Name] = m
	}
	return out
}

func TestPrune(t *testing.T) {
	c := etcdtest.StartDistinct(t, 5)
	cl := newCluster(t, c)
	settle(t, c)
	ms := byName(t, cl)
	c.Kill(3)
	c.Kill(4)
	// m1, m2 and m3 report m4 down for two minutes. Only m1 lost m5;
	// m2 and m3 still reach it (a one-sided view).
	m4, m5 := ms["m4"], ms["m5"]
	unlinked(t, cl, "m4", "m5")
	// The reports live on a 10 s lease, as the observers' do, and every
	// prune reads raft twice a second apart: on a loaded machine the steps
	// below can outlast a lease (a cold CI-like run: the reports expired
	// before the two prunes at once, which then removed nothing). Each
	// step that needs the evidence publishes it again first, as the
	// observers would every round.
	publish := func() {
		publishAs(t, c, report("m1", seen{m4, 2 * time.Minute}, seen{m5, 2 * time.Minute}))
		publishAs(t, c, report("m2", seen{m4, 2 * time.Minute}, seen{m5, up}))
		publishAs(t, c, report("m3", seen{m4, 2 * time.Minute}, seen{m5, up}))
	}
	publish()
	fresh := func(string) bool { return true }

	// Down for less than min-down: nothing happens.
	removed, cases, err := cl.Prune(ctx(t), PruneConfig{MinDown: time.Hour, Fresh: fresh}, say(t))
	if err != nil || len(removed) != 0 || len(cases) != 2 {
		t.Fatalf("Prune(1h) = %v, %v, %v", removed, cases, err)
	}
	for _, cs := range cases {
		if want := map[string]string{"m4": NotYet, "m5": OneSided}[cs.Member.Name]; cs.Verdict != want {
			t.Fatalf("%s: verdict %s, want %s (%s)", cs.Member.Name, cs.Verdict, want, cs.Evidence())
		}
	}
	// Dry run says, does nothing.
	publish()
	if _, _, err := cl.Prune(ctx(t), PruneConfig{MinDown: time.Minute, DryRun: true, Fresh: fresh}, say(t)); err != nil {
		t.Fatal(err)
	}
	if got := names(t, cl); len(got) != 5 {
		t.Fatalf("dry run changed the membership: %v", got)
	}
	// Stale reports are no evidence.
	if removed, _, err := cl.Prune(ctx(t), PruneConfig{MinDown: time.Minute, Fresh: func(string) bool { return false }}, say(t)); err != nil || len(removed) != 0 {
		t.Fatalf("Prune on stale reports = %v, %v", removed, err)
	}

	// Two prunes at once: together they remove exactly m4, the member a
	// majority agrees is gone, and neither removes m5. A prune that cannot
	// read raft's view of m4 (on a loaded machine a member's metrics can
	// miss their deadline; without the raft leader's counts silence is not
	// known to be loss) keeps it, as it should, and the observers would
	// try again next round: so may this test, a few times.
	for round := 1; ; round++ {
		publish()
		var wg sync.WaitGroup
		errs := make([]error, 2)
		left := make([][]Case, 2)
		gone := make([][]Member, 2)
		for i := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				gone[i], left[i], errs[i] = cl.Prune(ctx(t), PruneConfig{MinDown: time.Minute, Fresh: fresh}, say(t))
			}()
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Errorf("concurrent prune: %v", err)
			}
			for _, m := range gone[i] {
				if m.Name != "m4" {
					t.Fatalf("a prune removed %s", m.Name)
				}
			}
			for _, cs := range left[i] {
				t.Logf("round %d, prune %d: %s stays: %s; raft: %s", round, i, cs.Member.Label(), cs.Evidence(), cs.RaftHolds())
			}
		}
		// Both may report m4: the second removal finds it gone already.
		if !slices.Contains(names(t, cl), "m4") || round == 5 {
			break
		}
	}
	if got := names(t, cl); !slices.Equal(got, []string{"m1", "m2", "m3", "m5"}) {
		t.Fatalf("members after two prunes: %v", got)
	}
	// --force acts on what this process sees.
	removed, _, err = cl.Prune(ctx(t), PruneConfig{MinDown: time.Minute, Fresh: fresh, Force: true}, say(t))
	if err != nil || len(removed) != 1 || removed[0].Name != "m5" {
		t.Fatalf("Prune --force = %v, %v", removed, err)
	}
}

// unlinked waits until raft has lost the members named: no answering
// member's transport hears from them any more (their etcd stopped).
func unlinked(t *testing.T, cl *Cluster, names ...string) {
	t.Helper()
	etcdtest.Retry(t, 15*time.Second, "raft to lose "+strings.Join(names, ", "), func() error {
		v, err := cl.View(ctx(t))
		if err != nil {
			return err
		}
		cl.CheckRaft(ctx(t), &v)
		for _, m := range v.Members {
			if slices.Contains(names, m.Name) && (m.Raft.Linked() || !m.Raft.Known()) {
				return fmt.Errorf("%s: raft %s", m.Name, m.Raft)
			}
		}
		return nil
	})
}

// A member whose client port does not answer (a proxy in front of it holds
// every answer back, as a filtered or stalled port would) while its peer
// port replicates as before is not pruned, not even by force, and list
// shows both views; once its etcd stops, raft loses it and prune removes
// it.
func TestFilteredClientPortIsNotPruned(t *testing.T) {
	var mu sync.Mutex
	proxies := map[int]*netfault.Proxy{}
	c := etcdtest.StartAdvertising(t, 3, func(i int, listen string) string {
		host, _, _ := strings.Cut(listen, ":")
		ln, err := net.Listen("tcp", host+":0")
		if err != nil {
			t.Fatal(err)
		}
		p := netfault.NewProxy(ln, listen, slog.New(slog.DiscardHandler))
		t.Cleanup(func() { _ = p.Close() })
		mu.Lock()
		proxies[i] = p
		mu.Unlock()
		return "http://" + ln.Addr().String()
	})
	cl := newCluster(t, c)
	settle(t, c)
	if err := proxies[2].Set(netfault.Delay{Latency: netfault.MaxDelay}); err != nil {
		t.Fatal(err)
	}
	// Both other members are asked what raft says of m3. Under load one
	// can miss the check's deadline (a cold CI run: "1 of 1 asked"), which
	// is not what this test is about: ask again until both have answered.
	var v View
	var m3 Member
	testkit.WaitNilEvery(t, 30*time.Second, 500*time.Millisecond, "both other members answering the raft check of m3", func() error {
		var err error
		if v, err = cl.View(ctx(t)); err != nil {
			return err
		}
		cl.CheckRaft(ctx(t), &v)
		if m3, err = v.Find("m3"); err != nil {
			return err
		}
		if m3.Raft.Asked != 2 {
			return fmt.Errorf("raft %s", m3.Raft)
		}
		return nil
	})
	if m3.Reachable || !m3.Raft.Linked() || m3.Raft.Asked != 2 {
		t.Fatalf("m3 with its client port held: reachable %v, raft %s; want unreachable and linked from both", m3.Reachable, m3.Raft)
	}
	// (Embedded in one process, the members share etcd's counters, so
	// what each answering member says of the other is not checked here;
	// the lab's prune-client-port drill runs each member in its own.)
	for _, name := range []string{"m1", "m2"} {
		if m, _ := v.Find(name); !m.Reachable || !m.Raft.Linked() {
			t.Fatalf("%s: reachable %v, raft %s; want reachable and linked", name, m.Reachable, m.Raft)
		}
	}
	// Both survivors report m3 down for an hour: the evidence is agreed,
	// and --force asks for it too.
	publishAs(t, c, report("m1", seen{m3, time.Hour}))
	publishAs(t, c, report("m2", seen{m3, time.Hour}))
	fresh := func(string) bool { return true }
	for _, force := range []bool{false, true} {
		removed, cases, err := cl.Prune(ctx(t), PruneConfig{MinDown: time.Minute, Fresh: fresh, Force: force}, say(t))
		if err != nil || len(removed) != 0 || len(cases) != 1 || cases[0].RaftHolds() == "" {
			t.Fatalf("Prune(force=%v) of a member raft still has = %v, %+v, %v", force, removed, cases, err)
		}
		t.Logf("force=%v: %s", force, cases[0].RaftHolds())
	}
	if got := names(t, cl); len(got) != 3 {
		t.Fatalf("members: %v", got)
	}
	// Its etcd stops: raft loses it, and the same evidence prunes it,
	// unless something else manages its machine (a veto). (The proxy
	// stops holding answers back first: its held answers would keep the
	// connections, and the member's stop, waiting for a minute.)
	if err := proxies[2].Set(netfault.Delay{}); err != nil {
		t.Fatal(err)
	}
	c.Kill(2)
	unlinked(t, cl, "m3")
	// The reports live on a 10 s lease, which may have run out by now.
	// Under load a prune's own raft check can get no counts in time and
	// keep the member ("cannot tell whether raft still has it", as it
	// must): each step is tried again, the reports published again first,
	// until it gets as far as it is meant to (a cold CI run).
	var vetoed []Event
	veto := func(_ context.Context, m Member) string { return "Cluster API manages node " + m.Name }
	testkit.WaitNilEvery(t, 30*time.Second, time.Second, "a prune of the stopped m3 to meet the veto", func() error {
		publishAs(t, c, report("m1", seen{m3, time.Hour}))
		publishAs(t, c, report("m2", seen{m3, time.Hour}))
		vetoed = nil
		removed, _, err := cl.Prune(ctx(t), PruneConfig{MinDown: time.Minute, Fresh: fresh, Veto: veto}, func(e Event) {
			if e.Kind == EventVetoed {
				vetoed = append(vetoed, e)
			}
		})
		if err != nil || len(removed) != 0 {
			t.Fatalf("Prune with a veto = %v, %v; vetoed %v", removed, err, vetoed)
		}
		if len(vetoed) != 1 || !strings.Contains(vetoed[0].Text, "Cluster API manages node m3") {
			return fmt.Errorf("vetoed %v", vetoed)
		}
		return nil
	})
	testkit.WaitNilEvery(t, 30*time.Second, time.Second, "a prune to remove the stopped m3", func() error {
		publishAs(t, c, report("m1", seen{m3, time.Hour}))
		publishAs(t, c, report("m2", seen{m3, time.Hour}))
		removed, _, err := cl.Prune(ctx(t), PruneConfig{MinDown: time.Minute, Fresh: fresh}, say(t))
		if err != nil || len(removed) > 1 || (len(removed) == 1 && removed[0].Name != "m3") {
			t.Fatalf("Prune after m3 stopped = %v, %v", removed, err)
		}
		if len(removed) == 0 {
			return errors.New("m3 kept")
		}
		return nil
	})
}

func TestPruneLeavesUnstartedMembers(t *testing.T) {
	c := etcdtest.StartDistinct(t, 3)
	cl := newCluster(t, c)
	settle(t, c)
	// Added, never started: no name, unreachable. Nothing tells how long
	// it has been down, so only `members remove` takes it out.
	peer, _ := c.NewMemberURLs()
	if _, err := cl.addAsLearner(ctx(t), peer); err != nil {
		t.Fatal(err)
	}
	removed, cases, err := cl.Prune(ctx(t), PruneConfig{Force: true}, say(t))
	if err != nil || len(removed) != 0 || len(cases) != 0 {
		t.Fatalf("Prune = %v, %v, %v; want nothing removed", removed, cases, err)
	}
}

// TestObserversPruneOnlyWhatTheyAgreeOn runs three observers on a real
// cluster, the way three vigil runs do: nothing is pruned while all are
// healthy; a dead member is pruned by the holder once both survivors have
// seen it down for the whole period, and not before.
func TestObserversPruneOnlyWhatTheyAgreeOn(t *testing.T) {
	c := etcdtest.StartDistinct(t, 3)
	settle(t, c)
	const pruneAfter = 3 * time.Second
	holderSince := time.Now()
	var pruned sync.Map
	octx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	obs := make([]*Observer, 3)
	for i := range 3 {
		name := c.Names[i]
		obs[i] = NewObserver(newCluster(t, c), ObserverConfig{
			Node: "node-" + name, Member: name, Interval: 200 * time.Millisecond, PruneAfter: pruneAfter,
			Holding:  func() (bool, time.Time) { return i == 0, holderSince },
			OnPruned: func(_ context.Context, m Member) { pruned.Store(m.Name, time.Now()) },
		}, slog.New(slog.DiscardHandler))
		wg.Add(1)
		go func() { defer wg.Done(); obs[i].Run(octx) }()
	}
	cl := newCluster(t, c)
	etcdtest.Retry(t, 10*time.Second, "three published reports", func() error {
		v, err := cl.View(ctx(t))
		if err != nil {
			return err
		}
		if len(v.Reports) != 3 {
			return fmt.Errorf("%d reports", len(v.Reports))
		}
		return nil
	})
	// All healthy: nothing may go.
	testkit.Always(t, 2*pruneAfter, "all three members kept while healthy", func() bool { return len(names(t, cl)) == 3 })
	killed := time.Now() // Kill takes a while; the member may stop answering at once
	c.Kill(2)
	etcdtest.Retry(t, pruneAfter+15*time.Second, "m3 pruned", func() error {
		if _, ok := pruned.Load("m3"); !ok {
			return errors.New("not yet")
		}
		return nil
	})
	at, _ := pruned.Load("m3")
	// A Status call sent a moment before the kill and never answered
	// counts from when it was sent: allow that moment.
	if d := at.(time.Time).Sub(killed); d < pruneAfter-50*time.Millisecond {
		t.Fatalf("m3 pruned %v after it died, before --prune-after %v", d, pruneAfter)
	}
	if got := names(t, cl); !slices.Equal(got, []string{"m1", "m2"}) {
		t.Fatalf("members: %v", got)
	}
	// A stopped observer withdraws its report.
	cancel()
	wg.Wait()
	if v, err := cl.View(ctx(t)); err != nil || len(v.Reports) != 0 {
		t.Fatalf("reports after the observers stopped: %v, %v", v.Reports, err)
	}
}

func TestReplaceDeadResumable(t *testing.T) {
	c := etcdtest.StartDistinct(t, 3)
	cl := newCluster(t, c)
	settle(t, c)
	c.Kill(2)
	peer, client := c.NewMemberURLs()

	// First attempt: interrupted right after the dead member was removed.
	cctx, cancel := context.WithCancel(ctx(t))
	err := cl.Replace(cctx, ReplaceConfig{Old: "m3", NewName: "m4", NewPeer: peer, Timeout: time.Minute}, func(e Event) {
		t.Log(e.Text)
		if e.Kind == EventRemoved {
			cancel()
		}
	})
	cancel()
	if err == nil {
		t.Fatal("interrupted replace reported success")
	}
	if got := names(t, cl); !slices.Equal(got, []string{"m1", "m2"}) {
		t.Fatalf("after the interruption: %v", got)
	}

	// Second attempt: the new member is added but never starts; the wait
	// times out, leaving a learner (no quorum impact).
	err = cl.Replace(ctx(t), ReplaceConfig{Old: "m3", NewName: "m4", NewPeer: peer, Timeout: 2 * time.Second}, say(t))
	if err == nil || !strings.Contains(err.Error(), "did not catch up") {
		t.Fatalf("replace without the new member starting = %v", err)
	}

	// Third attempt: it starts, is promoted; nothing is added twice.
	err = cl.Replace(ctx(t), ReplaceConfig{Old: "m3", NewName: "m4", NewPeer: peer, Timeout: time.Minute,
		OnAdded: func(initial string) { c.Add("m4", peer, client, initial) }}, say(t))
	if err != nil {
		t.Fatal(err)
	}
	v, err := cl.View(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	voters, healthy := v.counts()
	if voters != 3 || healthy != 3 || len(v.Members) != 3 {
		t.Fatalf("after replace: %d voters, %d healthy, members %+v", voters, healthy, v.Members)
	}
	// Running it once more changes nothing.
	if err := cl.Replace(ctx(t), ReplaceConfig{Old: "m3", NewName: "m4", NewPeer: peer, Timeout: time.Minute}, say(t)); err != nil {
		t.Fatalf("re-run after completion: %v", err)
	}
}

func TestReplaceHealthyUsesLearner(t *testing.T) {
	c := etcdtest.StartDistinct(t, 3)
	cl := newCluster(t, c)
	settle(t, c)
	peer, client := c.NewMemberURLs()
	var kinds []EventKind
	err := cl.Replace(ctx(t), ReplaceConfig{Old: "m3", NewName: "m4", NewPeer: peer, Timeout: time.Minute,
		OnAdded: func(initial string) { c.Add("m4", peer, client, initial) }},
		func(e Event) {
			t.Logf("%s [%s %s]", e.Text, e.Kind, e.Member)
			switch e.Kind {
			case EventStartEtcd, EventPromoted, EventRemoved, EventDone:
				kinds = append(kinds, e.Kind)
			}
		})
	if err != nil {
		t.Fatal(err)
	}
	// The learner is announced (start-etcd), promoted, and only then is
	// the old member removed.
	if want := []EventKind{EventStartEtcd, EventPromoted, EventRemoved, EventDone}; !slices.Equal(kinds, want) {
		t.Fatalf("steps %v, want %v", kinds, want)
	}
	if got := names(t, cl); !slices.Equal(got, []string{"m1", "m2", "m4"}) {
		t.Fatalf("members: %v", got)
	}
}

func TestBadInput(t *testing.T) {
	c := etcdtest.StartDistinct(t, 3)
	cl := newCluster(t, c)
	for _, w := range []string{"m4", "m4=", "=http://x:2380", "m4=10.0.0.1:2380", "m4=http://10.0.0.1", "m4=ftp://10.0.0.1:2380"} {
		if _, _, err := ParseNewMember(w); !errors.Is(err, validate.ErrInvalid) {
			t.Errorf("ParseNewMember(%q) = %v", w, err)
		}
	}
	if err := cl.Replace(ctx(t), ReplaceConfig{Old: "m3", NewName: "m4", NewPeer: "not-a-url", Timeout: time.Second}, say(t)); !errors.Is(err, validate.ErrInvalid) {
		t.Fatalf("replace with a bad URL: %v", err)
	}
	if got := names(t, cl); len(got) != 3 {
		t.Fatalf("membership changed: %v", got)
	}
	if _, err := New(Config{Endpoints: []string{"127.0.0.1:2379"}}, slog.New(slog.DiscardHandler)); !errors.Is(err, validate.ErrInvalid) {
		t.Fatalf("New with a bad endpoint: %v", err)
	}
	dead, err := New(Config{Endpoints: []string{"http://127.0.0.1:1"}}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer dead.Close()
	if err := dead.Remove(ctx(t), "m1", false, say(t)); err == nil || !strings.Contains(err.Error(), "is etcd reachable") {
		t.Fatalf("Remove through unreachable etcd = %v", err)
	}
}

// Removing the raft leader moves leadership to a member other than the VIP
// holder's (whose vigil would move it off again), and when leadership
// comes back to the member before its removal (a holder shedding it onto
// it), the removal moves it off again instead of removing the raft leader.
func TestRemoveLeaderKeepsLeadershipOffTheHolderAndNeverRemovesTheLeader(t *testing.T) {
	c := etcdtest.StartDistinct(t, 3)
	settle(t, c)
	li := c.WaitLeader(10 * time.Second)
	leader, holder, other := c.Names[li], c.Names[(li+1)%3], c.Names[(li+2)%3]
	cl, err := New(Config{Endpoints: c.Endpoints, VIPHolder: func(context.Context) (string, error) { return holder, nil }}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	v, err := cl.View(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	lm, err := v.Find(leader)
	if err != nil {
		t.Fatal(err)
	}
	var texts []string
	movedBack := false
	err = cl.Remove(ctx(t), leader, true, func(e Event) {
		t.Logf("%s [%s %s]", e.Text, e.Kind, e.Member)
		texts = append(texts, e.Text)
		if e.Kind == EventRemoving && !movedBack {
			// What a VIP holder's shedder does at the worst moment: it
			// hands leadership back to the member about to go.
			movedBack = true
			etcdtest.Retry(t, 10*time.Second, "moving leadership back", func() error {
				return cl.Etcd().MoveLeader(ctx(t), lm.ID)
			})
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	all := strings.Join(texts, "\n")
	if !strings.Contains(all, "moving leadership to "+other+" ") || strings.Contains(all, "moving leadership to "+holder+" ") {
		t.Fatalf("leadership moved to the VIP holder's member %s, or not to %s:\n%s", holder, other, all)
	}
	if !strings.Contains(all, "leads raft again") || strings.Count(all, "moving leadership to ") != 2 {
		t.Fatalf("the removal did not notice that leadership came back, and move it off again:\n%s", all)
	}
	if got := names(t, cl); slices.Contains(got, leader) || len(got) != 2 {
		t.Fatalf("members after removing the leader %s: %v", leader, got)
	}
	if e := c.WaitLeader(10 * time.Second); c.Names[e] != other {
		t.Fatalf("raft leader after the removal: %s, want %s (not the VIP holder's %s)", c.Names[e], other, holder)
	}
}
