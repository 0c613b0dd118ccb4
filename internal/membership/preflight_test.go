package membership

import (
	"strings"
	"testing"
)

func TestPreflightRules(t *testing.T) {
	up := func(id uint64, name string) Member { return Member{ID: id, Name: name, Reachable: true} }
	down := func(id uint64, name string) Member { return Member{ID: id, Name: name, Error: "connection refused"} }
	find := func(fs []Finding, check string) Finding {
		for _, f := range fs {
			if f.Check == check {
				return f
			}
		}
		t.Fatalf("no check %q in %+v", check, fs)
		return Finding{}
	}

	// No quorum: the removal fixes are not offered (they cannot commit).
	v := View{Members: []Member{up(1, "a"), down(2, "b"), down(3, "c")}}
	fs := v.Preflight("", "")
	if q := find(fs, "etcd quorum"); q.OK || !strings.Contains(q.Fix[0], "vigil members recover") {
		t.Fatalf("quorum: %+v", q)
	}
	if h := find(fs, "every member healthy"); h.OK || len(h.Fix) != 0 {
		t.Fatalf("members without quorum: %+v", h)
	}
	if Passed(fs) {
		t.Fatal("passed without quorum")
	}

	// Two members named alike (the old machine's and a half-done join):
	// the fix names the dead one by ID.
	v = View{Members: []Member{up(1, "a"), up(2, "b"), up(3, "c"), down(0xabc, "c")}}
	fs = v.Preflight("c", "--etcd-endpoints https://x:2379")
	if h := find(fs, "every member healthy"); h.Fix[0] != "vigil members --etcd-endpoints https://x:2379 remove abc" {
		t.Fatalf("fix for a duplicate name: %+v", h)
	}
	if n := find(fs, "no member named c"); n.OK {
		t.Fatalf("name check: %+v", n)
	}

	// All well; skipped checks do not fail it.
	v = View{Members: []Member{up(1, "a"), up(2, "b"), up(3, "c")}}
	fs = append(v.Preflight("d", ""), Finding{Check: "x", Skip: true})
	if !Passed(fs) {
		t.Fatalf("healthy: %+v", fs)
	}
}
