package lab

import (
	"errors"
	"slices"
	"testing"
)

// holders counts two holders only when a second read finds both still
// holding: a reader descheduled between two nodes' reads sees the old
// holder before it let go and the new one after it took over.
func TestHoldersReadTwice(t *testing.T) {
	nodes := []*Node{{Name: "n1"}, {Name: "n2"}, {Name: "n3"}}
	for _, c := range []struct {
		name    string
		answers map[string][]bool // each node's answers, read by read
		want    []string
		reads   int
	}{
		{"one holder, one pass", map[string][]bool{"n1": {true}, "n2": {false}, "n3": {false}}, []string{"n1"}, 3},
		{"none", map[string][]bool{"n1": {false}, "n2": {false}, "n3": {false}}, []string{}, 3},
		{"a takeover between two reads", map[string][]bool{"n1": {true, false}, "n2": {true, true}, "n3": {false}}, []string{"n2"}, 5},
		{"two holders at once", map[string][]bool{"n1": {true, true}, "n2": {false}, "n3": {true, true}}, []string{"n1", "n3"}, 5},
	} {
		t.Run(c.name, func(t *testing.T) {
			reads := 0
			has := func(node string) (bool, error) {
				reads++
				a := c.answers[node]
				if len(a) == 0 {
					return false, errors.New("read " + node + " once too often")
				}
				c.answers[node] = a[1:]
				return a[0], nil
			}
			got, err := holders(has, nodes)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, c.want) || reads != c.reads {
				t.Errorf("holders = %v after %d reads, want %v after %d", got, reads, c.want, c.reads)
			}
		})
	}
	failing := func(string) (bool, error) { return false, errors.New("netlink: no such namespace") }
	if _, err := holders(failing, nodes); err == nil {
		t.Error("holders hid a read error")
	}
}
