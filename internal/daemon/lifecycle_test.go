package daemon

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"

	"github.com/vigil-ha/vigil/internal/announce"
	"github.com/vigil-ha/vigil/internal/discovery"
	"github.com/vigil-ha/vigil/internal/membership"
	"github.com/vigil-ha/vigil/internal/vip"
)

// recordedPart starts (recording it, and failing with err if set), runs
// until its context ends, and records its cancellation and its end.
func recordedPart(c *calls, name string, err error) part {
	return part{
		name: name,
		start: func(context.Context) error {
			c.add("start " + name)
			return err
		},
		run: func(ctx context.Context) {
			<-ctx.Done()
			c.add("cancelled " + name)
			c.add("ended " + name)
		},
	}
}

// Parts start in the order added and stop the other way round, each one
// cancelled only after the part started after it has ended.
func TestLifecycleStopsInReverse(t *testing.T) {
	c := &calls{}
	l := &lifecycle{}
	for _, n := range []string{"a", "b", "c"} {
		l.parts = append(l.parts, recordedPart(c, n, nil))
	}
	if err := l.start(); err != nil {
		t.Fatal(err)
	}
	wantCalls(t, "start", c.take(), "start a", "start b", "start c")
	l.stop()
	wantCalls(t, "stop", c.take(), "cancelled c", "ended c", "cancelled b", "ended b", "cancelled a", "ended a")
	l.stop() // a second stop (Run's defer) does nothing
	wantCalls(t, "second stop", c.take())
}

// A part that cannot start stops the parts started before it, the last
// first, and the error names the part; no later part starts.
func TestLifecycleStartFailureStopsWhatStarted(t *testing.T) {
	c := &calls{}
	l := &lifecycle{}
	boom := errors.New("no route to peer")
	l.parts = append(l.parts, recordedPart(c, "a", nil), recordedPart(c, "b", nil), recordedPart(c, "speaker", boom), recordedPart(c, "d", nil))
	err := l.start()
	if !errors.Is(err, boom) || !strings.HasPrefix(err.Error(), "speaker: ") {
		t.Fatalf("start = %v, want the speaker's error, named", err)
	}
	wantCalls(t, "failed start", c.take(), "start a", "start b", "start speaker", "cancelled b", "ended b", "cancelled a", "ended a")
	l.stop()
	wantCalls(t, "stop after a failed start", c.take())
}

// The node's parts, in the order Run starts them: the metrics server first
// (it serves the whole shutdown), discovery before what it feeds, the
// systemd notifier last. Parts a configuration leaves out are not there.
func TestNodePartsOrder(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	n := &node{
		metricsLn: ln,
		disc:      &discovery.Discovery{},
		keeper:    &vip.Keeper{},
		observer:  &membership.Observer{},
		feed:      &feedPart{},
		ann:       &announce.Announcer{},
		conflicts: &conflicts{},
		h:         &holder{handoffs: &handoffs{}},
	}
	got := n.parts().names()
	want := []string{"metrics", "link monitor", "discovery", "vip keeper", "membership observer", "agent feed", "conflict probe", "handoffs", "systemd"}
	wantCalls(t, "parts", got, want...)

	// ecmp: no keeper, no conflict probe, no handoffs without etcd.
	n = &node{ecmp: &ecmpAnnouncer{}, h: &holder{}}
	wantCalls(t, "ecmp parts", n.parts().names(), "link monitor", "ecmp", "systemd")
}
