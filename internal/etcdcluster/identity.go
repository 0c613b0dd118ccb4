package etcdcluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
)

// Which etcd cluster a process follows. Every etcd answer carries the
// cluster's ID in its header. A URL can answer for another cluster: a
// machine rebuilt with a member's address and a fresh etcd before that
// member was removed, a wrong `snapshot restore`, a test cluster on a
// reused address. Such an impostor has no lock record, no members but
// itself, and answers at once; believed, it takes the election over and
// makes every vigil drop the real members' URLs for its own.
//
// So a Cluster learns the cluster ID, then refuses every answer with
// another: each member connection checks the header of every unary answer
// (an interceptor), and watches check theirs (Accept). A refused answer is
// an error like a dead member's, so operations go on through the members
// of the known cluster, and member lists from the impostor are never
// followed.
//
// Learning: the first ID that a majority of the seed endpoints answer with
// (one seed: its first answer). A one-shot command (Config.Provisional),
// which must still say what is wrong with a cluster that lost its
// majority, takes the ID most answers carried when no majority answers,
// until one does. Answers before that are refused, and each
// counts as a vote; operations sent through every member (Do) then return
// with the answer that completes the majority. The ID is kept for the life
// of the process: a cluster restored from a snapshot has a new ID, and
// vigil must be restarted to follow it (its log says so).

// ErrForeignCluster is the error of an answer from another etcd cluster
// than the one this process follows.
var ErrForeignCluster = errors.New("etcdcluster: the endpoint answers for another etcd cluster")

// errIDUnknown is the error of an answer that came before the cluster ID
// was learned (it counted as a vote).
var errIDUnknown = errors.New("etcdcluster: the etcd cluster ID is not known yet (waiting for a majority of the endpoints to agree on it)")

// Foreign is an endpoint that answered for another cluster.
type Foreign struct {
	Endpoint  string
	ClusterID uint64
	Last      time.Time // the last such answer
	Answers   int64
}

// identity is the cluster ID and how it was learned.
type identity struct {
	asking  sync.Mutex    // one identify round at a time
	learned chan struct{} // closed once id is set
	mu      sync.Mutex
	id      uint64
	// provisional (Config.Provisional) is the ID taken after an identify
	// round without a majority: the one most answers carried.
	provisional uint64
	allowProv   bool
	need        int                        // agreeing seeds needed to learn it
	votes       map[uint64]map[string]bool // before it is learned: ID -> endpoints
	foreign     map[string]*Foreign        // by endpoint
	onNew       func(Foreign)              // Config.OnForeign, outside mu
	log         *slog.Logger
}

// ClusterID returns the ID of the etcd cluster this process follows (0
// until learned).
func (c *Cluster) ClusterID() uint64 {
	c.ident.mu.Lock()
	defer c.ident.mu.Unlock()
	return c.ident.id
}

// Foreign returns the endpoints that answered for another cluster within
// the last window, sorted by endpoint.
func (c *Cluster) Foreign(window time.Duration) []Foreign {
	c.ident.mu.Lock()
	defer c.ident.mu.Unlock()
	var out []Foreign
	for _, ep := range slices.Sorted(maps.Keys(c.ident.foreign)) {
		if f := c.ident.foreign[ep]; time.Since(f.Last) <= window {
			out = append(out, *f)
		}
	}
	return out
}

// Accept tells whether an answer from endpoint with cluster ID cid is from
// the cluster this process follows, learning the ID if it is not known
// yet. An ID of 0 (no header) is accepted.
func (c *Cluster) Accept(endpoint string, cid uint64) error {
	if cid == 0 {
		return nil
	}
	id := &c.ident
	id.mu.Lock()
	if id.id == 0 {
		if id.votes[cid] == nil {
			id.votes[cid] = map[string]bool{}
		}
		id.votes[cid][endpoint] = true
		if len(id.votes[cid]) < id.need {
			prov := id.provisional
			id.mu.Unlock()
			if prov == cid {
				return nil
			}
			return errIDUnknown
		}
		id.id = cid
		close(id.learned)
		from := slices.Sorted(maps.Keys(id.votes[cid]))
		others := len(id.votes) - 1
		id.votes = nil
		id.mu.Unlock()
		id.log.Info("etcd cluster ID learned; answers with another are refused from now on", "cluster_id", fmt.Sprintf("%x", cid), "from", strings.Join(from, ","), "other_ids_seen", others)
		return nil
	}
	if cid == id.id {
		id.mu.Unlock()
		return nil
	}
	f := id.foreign[endpoint]
	first := f == nil || f.ClusterID != cid
	if first {
		f = &Foreign{Endpoint: endpoint, ClusterID: cid}
		id.foreign[endpoint] = f
	}
	f.Last = time.Now()
	f.Answers++
	snap, ours := *f, id.id
	onNew := id.onNew
	id.mu.Unlock()
	if first {
		id.log.Warn("refusing an etcd endpoint that answers for another cluster (an impostor at a member's address: a rebuilt machine, a wrong snapshot restore?); its answers and member lists are ignored", "endpoint", endpoint, "cluster_id", fmt.Sprintf("%x", cid), "expected", fmt.Sprintf("%x", ours))
		if onNew != nil {
			onNew(snap)
		}
	}
	return fmt.Errorf("%w: %s answers for cluster %x, not %x", ErrForeignCluster, endpoint, cid, ours)
}

// identifyWait bounds an identify round.
const identifyWait = 2 * time.Second

// identify learns the cluster ID before an operation, if it is not known:
// it asks every member for its status (each answer a vote) and returns once
// the ID is learned, every member answered, identifyWait passed, or ctx
// ended. Without it the first operations of a process would lose the
// answers that come before the majority. One round at a time; the others
// wait for it.
func (c *Cluster) identify(ctx context.Context) {
	id := &c.ident
	select {
	case <-id.learned:
		return
	default:
	}
	id.asking.Lock()
	defer id.asking.Unlock()
	select {
	case <-id.learned:
		return
	default:
	}
	ctx, cancel := context.WithTimeout(ctx, identifyWait)
	defer cancel() // the members not yet answered are not needed
	done := make(chan struct{})
	var wg sync.WaitGroup
	for _, m := range c.Members() {
		wg.Go(func() { _, _ = m.maint.Status(ctx, &pb.StatusRequest{}) })
	}
	go func() { wg.Wait(); close(done) }()
	select {
	case <-id.learned:
		return
	case <-done:
	case <-ctx.Done():
	}
	if id.allowProv {
		id.mu.Lock()
		defer id.mu.Unlock()
		if id.id != 0 || id.provisional != 0 {
			return
		}
		best, most, tie := uint64(0), 0, false
		for cid, eps := range id.votes {
			switch {
			case len(eps) > most:
				best, most, tie = cid, len(eps), false
			case len(eps) == most:
				tie = true
			}
		}
		if most > 0 && !tie {
			id.provisional = best
			id.log.Warn("no majority of the etcd endpoints answered; taking the cluster ID the answers carried until one does", "cluster_id", fmt.Sprintf("%x", best), "endpoints", most, "needed", id.need)
		}
	}
}

// headered is every etcd answer with a response header.
type headered interface{ GetHeader() *pb.ResponseHeader }

// checkIdentity is the unary interceptor of the connection to endpoint.
func (c *Cluster) checkIdentity(endpoint string) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if err := invoker(ctx, method, req, reply, cc, opts...); err != nil {
			return err
		}
		if h, ok := reply.(headered); ok {
			return c.Accept(endpoint, h.GetHeader().GetClusterId())
		}
		return nil
	}
}
