package daemon

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/vigil-ha/vigil/internal/kube"
	"github.com/vigil-ha/vigil/internal/membership"
)

// capiVeto keeps vigil run --prune-after from racing Cluster API. Where
// Cluster API manages the control-plane machines (KubeadmControlPlane),
// its remediation removes a failed machine's etcd member itself; two
// removers of one member, each with its own idea of when, is what neither
// was built for. So the holder does not prune a member when this node's
// Node, or the Node named like the member (kubeadm names members after
// their nodes), carries Cluster API's machine annotation. It says so in
// its log, once per member. vigil members prune, run by hand, still works.
//
// Without --kubeconfig nothing can be checked: document it, do not guess.
// A Node that cannot be read (the API server is down) does not veto: the
// check is about who else removes members, and an unreadable Node says
// nothing about that.
type capiVeto struct {
	cs   kubernetes.Interface
	self string
	log  *slog.Logger

	mu     sync.Mutex
	cache  map[string]capiAnswer
	warned map[string]bool
}

type capiAnswer struct {
	manager string
	at      time.Time
}

// capiCacheFor is how long an answer is kept: a Node's annotations change
// when Cluster API adopts or releases a machine, which is rare, and a
// veto is asked every observation round while a member is removable.
const capiCacheFor = time.Minute

// capiReadTimeout bounds one Node read.
const capiReadTimeout = 3 * time.Second

func newCAPIVeto(cs kubernetes.Interface, self string, log *slog.Logger) *capiVeto {
	return &capiVeto{cs: cs, self: self, log: log, cache: map[string]capiAnswer{}, warned: map[string]bool{}}
}

// check is membership.ObserverConfig.Veto.
func (v *capiVeto) check(ctx context.Context, m membership.Member) string {
	for _, name := range []string{v.self, m.Name} {
		if name == "" {
			continue
		}
		if mgr := v.manager(ctx, name); mgr != "" {
			return "Cluster API manages node " + name + " (" + mgr + "); its remediation removes etcd members itself, and vigil does not race it (vigil members prune by hand still works)"
		}
	}
	return ""
}

func (v *capiVeto) manager(ctx context.Context, node string) string {
	v.mu.Lock()
	a, ok := v.cache[node]
	v.mu.Unlock()
	if ok && time.Since(a.at) < capiCacheFor {
		return a.manager
	}
	rctx, cancel := context.WithTimeout(ctx, capiReadTimeout)
	mgr, err := kube.ClusterAPIManager(rctx, v.cs, node)
	cancel()
	if err != nil {
		// Said once per node, then quietly: asked again next round.
		v.mu.Lock()
		first := !v.warned[node]
		v.warned[node] = true
		v.mu.Unlock()
		if first {
			v.log.Warn("cannot read a Node to check whether Cluster API manages it; pruning as if it does not", "node", node, "err", err)
		}
		return ""
	}
	v.mu.Lock()
	v.cache[node] = capiAnswer{manager: mgr, at: time.Now()}
	v.mu.Unlock()
	return mgr
}
