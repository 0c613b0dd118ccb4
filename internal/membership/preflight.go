package membership

import (
	"fmt"
	"strings"
)

// Finding is one preflight check: what was checked, whether it passes, and
// when it does not, why and the commands that fix it.
type Finding struct {
	Check  string   `json:"check"`
	OK     bool     `json:"ok"`
	Skip   bool     `json:"skipped,omitempty"` // could not be checked; does not fail the preflight
	Detail string   `json:"detail"`
	Fix    []string `json:"fix,omitempty"`
}

// Preflight answers, from the membership alone, whether a new
// control-plane node can join now, as kubeadm join --control-plane checks
// etcd:
//   - kubeadm's CheckEtcd wants every member healthy, not just a quorum;
//   - it adds the new member as a learner, and etcd allows one learner at a
//     time (--max-learners 1);
//   - a member left behind under the joining name, or announced but never
//     started, stays unhealthy and fails the next join too.
//
// joining is the new node's name ("" to skip that check). fixFlags are the
// connection flags the fix commands repeat.
func (v View) Preflight(joining, fixFlags string) []Finding {
	voters, healthy := v.counts()
	cmd := func(s string) string { return strings.TrimSpace("vigil members " + fixFlags + " " + s) }
	var out []Finding

	q := Finding{Check: "etcd quorum", OK: healthy >= quorum(voters),
		Detail: fmt.Sprintf("%d of %d voters healthy (quorum %d)", healthy, voters, quorum(voters))}
	if !q.OK {
		q.Detail += ": no membership change can commit"
		q.Fix = []string{"bring members back, or if they are lost for good: vigil members recover --kubeadm --name <survivor> on a surviving node (docs/operations.md, disaster recovery)"}
	}
	out = append(out, q)

	var dead []string
	var fixes []string
	for _, m := range v.Members {
		if m.Reachable {
			continue
		}
		why := m.Error
		if why == "" {
			why = "does not answer"
		}
		dead = append(dead, fmt.Sprintf("%s: %s", m.Label(), why))
		fixes = append(fixes, cmd("remove "+v.removeArg(m)))
	}
	h := Finding{Check: "every member healthy", OK: len(dead) == 0}
	if h.OK {
		h.Detail = fmt.Sprintf("all %d members answer", len(v.Members))
	} else {
		h.Detail = "kubeadm join checks every member, and these do not answer: " + strings.Join(dead, "; ")
		if q.OK {
			h.Fix = append(fixes, "or, once a majority of the vigils agree they are down: "+cmd("prune"))
		}
	}
	out = append(out, h)

	var learners []string
	for _, m := range v.Members {
		if m.Learner {
			learners = append(learners, m.Label())
		}
	}
	l := Finding{Check: "learner slot free", OK: len(learners) == 0}
	if l.OK {
		l.Detail = "no learner: kubeadm may add the new member as one"
	} else {
		l.Detail = "etcd allows one learner at a time, and " + strings.Join(learners, ", ") + " is one: a join that adds a learner is refused"
		l.Fix = []string{"let the learner catch up and promote it (its replace command finishes that), or remove it: " + cmd("remove <learner> --force")}
	}
	out = append(out, l)

	if joining != "" {
		n := Finding{Check: "no member named " + joining, OK: true, Detail: "no member has this name"}
		for _, m := range v.Members {
			if m.Name == joining {
				n.OK = false
				n.Detail = fmt.Sprintf("%s is still a member (peer URLs %s), left from an earlier life of this node", m.Label(), strings.Join(m.PeerURLs, ","))
				force := ""
				if m.Reachable {
					force = " --force"
				}
				n.Fix = []string{cmd("remove " + v.removeArg(m) + force)}
			}
		}
		out = append(out, n)
	}
	return out
}

// removeArg names m for vigil members remove: its name, or its ID when it
// has none (announced, never started) or shares its name.
func (v View) removeArg(m Member) string {
	if m.Name == "" {
		return m.IDString()
	}
	for _, o := range v.Members {
		if o.Name == m.Name && o.ID != m.ID {
			return m.IDString()
		}
	}
	return m.Name
}

// Passed tells whether every finding passes or was skipped.
func Passed(fs []Finding) bool {
	for _, f := range fs {
		if !f.OK && !f.Skip {
			return false
		}
	}
	return true
}
