// Package handoff keeps the records of planned VIP moves (vigil handoff)
// in etcd, where every vigil run reads them:
//
//	<prefix>request        the handoff under way: move the VIP off From
//	                       (to To, when given). It lives on an etcd lease
//	                       of the command's --timeout, so it ends by
//	                       itself if the command dies.
//	<prefix>hold/<node>    <node> does not campaign (vigil handoff --hold),
//	                       on a lease of --hold-for; --release deletes it.
//	<prefix>status/<id>    what From's vigil did about request <id>, for
//	                       the command to print.
//
// The rules are in State: whom a request makes stand by or step down
// (Yield), and whom a hold keeps out (Eligible).
package handoff

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/vigil-ha/vigil"
	"github.com/vigil-ha/vigil/internal/etcdcluster"
)

// DefaultPrefix is where the records live, beside the lock (/vigil/leader).
const DefaultPrefix = "/vigil/handoff/"

// Request asks the VIP holder From to hand the VIP over, to To when set
// (else to any healthy peer).
type Request struct {
	ID   string    `json:"id"`
	From string    `json:"from"`
	To   string    `json:"to,omitempty"`
	By   string    `json:"by"` // where the command ran
	At   time.Time `json:"at"`
	// Format is vigil.RecordFormat, set when written (0: vigil 0.3.0 or
	// before). Readers ignore fields they do not know.
	Format int `json:"format,omitempty"`
}

// Hold keeps Node from campaigning until Until (or --release). A holder
// held gives the VIP up only while some peer may take it, unless Force
// (vigil handoff --hold --force).
type Hold struct {
	Node  string    `json:"node"`
	By    string    `json:"by"`
	Until time.Time `json:"until"`
	Force bool      `json:"force,omitempty"`
	// Format: as Request's.
	Format int `json:"format,omitempty"`
}

// Phase is where From's vigil is in a request (Status.Phase).
type Phase string

// The phases of a request, as From's vigil reports them.
const (
	// Draining: waiting for a moment with no exchange in flight through
	// its load balancer.
	Draining Phase = "draining"
	// Released: it stepped down.
	Released Phase = "released"
)

// Status is what From's vigil reports about a request.
type Status struct {
	ID    string    `json:"id"`
	Phase Phase     `json:"phase"`
	At    time.Time `json:"at"`
	// Busy and Total are the load balancer's connections in an exchange,
	// and in all, when it released; ForcedAfter is set when it released
	// without such a moment, after the drain wait.
	Busy        int           `json:"busy"`
	Total       int           `json:"total"`
	ForcedAfter time.Duration `json:"forcedAfter,omitempty"`
	// Format: as Request's.
	Format int `json:"format,omitempty"`
}

// State is what the records say now.
type State struct {
	Request *Request
	Holds   map[string]Hold
	// Ignored are the records that were not taken, by key, with why: a
	// value that does not decode, or a hold whose node differs from its
	// key's (it could never be released). They change nothing.
	Ignored map[string]string
}

// Standbys returns, sorted, the nodes that could take the VIP once node is
// held: those in live (the vigils known to run), neither held now nor node
// nor holder. A hold that leaves none for the holder (node is not the
// holder), or none besides the node that takes the VIP over (node is the
// holder), leaves the VIP without a standby.
func (s State) Standbys(live []string, holder, node string, now time.Time) []string {
	var out []string
	for _, n := range live {
		if n == holder || n == node || s.Eligible(n, now) != nil || slices.Contains(out, n) {
			continue
		}
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// Yield says whether self, holding the VIP or a candidate, should leave
// the lock alone because of the request: From steps down and stands by;
// with To set, every node but To stands by, so To takes the lock first.
// Standing by is bounded (election.Config.YieldFor): if the chosen node
// never takes the lock, another does, and the cluster is never left
// without a holder.
func (s State) Yield(self string) (reason string, yield bool) {
	r := s.Request
	switch {
	case r == nil:
		return "", false
	case r.From == self:
		to := "a peer"
		if r.To != "" {
			to = r.To
		}
		return fmt.Sprintf("vigil handoff %s moves the VIP from this node to %s", r.ID, to), true
	case r.To != "" && r.To != self:
		return fmt.Sprintf("vigil handoff %s moves the VIP to %s", r.ID, r.To), true
	}
	return "", false
}

// Eligible is an error while a hold keeps self out of the election.
func (s State) Eligible(self string, now time.Time) error {
	if h, ok := s.Holds[self]; ok && now.Before(h.Until) {
		return fmt.Errorf("held out of the election by vigil handoff --hold (from %s) until %s, or vigil handoff --release", h.By, h.Until.Format(time.RFC3339))
	}
	return nil
}

// Store reads and writes the records through the process's etcd
// connection.
type Store struct {
	cl     *etcdcluster.Cluster
	prefix string
	reads  etcdcluster.Path // Read's
}

// NewStore keeps the records under prefix (DefaultPrefix when empty).
func NewStore(cl *etcdcluster.Cluster, prefix string) *Store {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	return &Store{cl: cl, prefix: prefix}
}

func (s *Store) requestKey() string         { return s.prefix + "request" }
func (s *Store) holdKey(node string) string { return s.prefix + "hold/" + node }
func (s *Store) statusKey(id string) string { return s.prefix + "status/" + id }
func (s *Store) isHold(key string) bool     { return strings.HasPrefix(key, s.prefix+"hold/") }

// leaseFor is an etcd lease TTL (whole seconds, at least 1) covering d.
func leaseFor(d time.Duration) int64 { return max(int64((d+time.Second-1)/time.Second), 1) }

// Read returns the request and the holds. Every vigil reads them a few
// times a second, so the read goes through one member while it answers
// (etcdcluster.Path).
func (s *Store) Read(ctx context.Context) (State, error) {
	resp, err := etcdcluster.Via(ctx, s.cl, &s.reads, func(ctx context.Context, m *etcdcluster.Member) (*clientv3.GetResponse, error) {
		return m.Client.Get(ctx, s.prefix, clientv3.WithPrefix())
	})
	if err != nil {
		return State{}, fmt.Errorf("read %s: %w", s.prefix, err)
	}
	st := State{Holds: map[string]Hold{}, Ignored: map[string]string{}}
	for _, kv := range resp.Kvs {
		key := string(kv.Key)
		switch {
		case key == s.requestKey():
			var r Request
			if err := json.Unmarshal(kv.Value, &r); err != nil || r.ID == "" || r.From == "" {
				st.Ignored[key] = fmt.Sprintf("not a handoff request (%s)", orWhy(err, "no id or from"))
				continue
			}
			st.Request = &r
		case s.isHold(key):
			var h Hold
			node := strings.TrimPrefix(key, s.prefix+"hold/")
			switch err := json.Unmarshal(kv.Value, &h); {
			case err != nil || h.Until.IsZero():
				st.Ignored[key] = fmt.Sprintf("not a hold (%s)", orWhy(err, "no until"))
			case h.Node != node:
				st.Ignored[key] = fmt.Sprintf("a hold of %q under the key of %q: it could not be released", h.Node, node)
			default:
				st.Holds[h.Node] = h
			}
		}
	}
	return st, nil
}

func orWhy(err error, why string) string {
	if err != nil {
		return err.Error()
	}
	return why
}

// put writes v at key on a fresh lease of ttl, through one member: the
// lease and the key must be made once.
func (s *Store) put(ctx context.Context, key string, v any, ttl time.Duration) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = etcdcluster.OnLeader(ctx, s.cl, func(ctx context.Context, cli *clientv3.Client) (struct{}, error) {
		l, err := cli.Grant(ctx, leaseFor(ttl))
		if err != nil {
			return struct{}{}, err
		}
		_, err = cli.Put(ctx, key, string(b), clientv3.WithLease(l.ID))
		return struct{}{}, err
	})
	if err != nil {
		return fmt.Errorf("write %s: %w", key, err)
	}
	return nil
}

// ErrBusy: another handoff is under way.
var ErrBusy = errors.New("another handoff is under way")

// Begin writes r, for ttl, unless another request exists.
func (s *Store) Begin(ctx context.Context, r Request, ttl time.Duration) error {
	r.Format = vigil.RecordFormat
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	var other []byte
	_, err = etcdcluster.OnLeader(ctx, s.cl, func(ctx context.Context, cli *clientv3.Client) (struct{}, error) {
		l, err := cli.Grant(ctx, leaseFor(ttl))
		if err != nil {
			return struct{}{}, err
		}
		key := s.requestKey()
		resp, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
			Then(clientv3.OpPut(key, string(b), clientv3.WithLease(l.ID))).
			Else(clientv3.OpGet(key)).Commit()
		if err != nil {
			return struct{}{}, err
		}
		if !resp.Succeeded {
			_, _ = cli.Revoke(ctx, l.ID)
			if kvs := resp.Responses[0].GetResponseRange().GetKvs(); len(kvs) > 0 {
				other = kvs[0].Value
			}
		}
		return struct{}{}, nil
	})
	if err != nil {
		return fmt.Errorf("write %s: %w", s.requestKey(), err)
	}
	if other != nil {
		var o Request
		_ = json.Unmarshal(other, &o)
		return fmt.Errorf("%w: %s (from %s to %q, by %s at %s)", ErrBusy, o.ID, o.From, o.To, o.By, o.At.Format(time.RFC3339))
	}
	return nil
}

// End deletes request id (and its status), if it is still the current one.
func (s *Store) End(ctx context.Context, id string) error {
	_, err := etcdcluster.OnLeader(ctx, s.cl, func(ctx context.Context, cli *clientv3.Client) (struct{}, error) {
		resp, err := cli.Get(ctx, s.requestKey())
		if err != nil {
			return struct{}{}, err
		}
		if len(resp.Kvs) == 1 {
			var r Request
			if json.Unmarshal(resp.Kvs[0].Value, &r) == nil && r.ID == id {
				if _, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(s.requestKey()), "=", resp.Kvs[0].ModRevision)).
					Then(clientv3.OpDelete(s.requestKey())).Commit(); err != nil {
					return struct{}{}, err
				}
			}
		}
		_, err = cli.Delete(ctx, s.statusKey(id))
		return struct{}{}, err
	})
	return err
}

// Report writes From's status for request st.ID; it expires with ttl.
func (s *Store) Report(ctx context.Context, st Status, ttl time.Duration) error {
	st.Format = vigil.RecordFormat
	return s.put(ctx, s.statusKey(st.ID), st, ttl)
}

// StatusOf reads the status of request id (nil when none yet).
func (s *Store) StatusOf(ctx context.Context, id string) (*Status, error) {
	resp, err := etcdcluster.Do(ctx, s.cl, func(ctx context.Context, m *etcdcluster.Member) (*clientv3.GetResponse, error) {
		return m.Client.Get(ctx, s.statusKey(id))
	})
	if err != nil || len(resp.Kvs) == 0 {
		return nil, err
	}
	var st Status
	if err := json.Unmarshal(resp.Kvs[0].Value, &st); err != nil {
		return nil, err
	}
	return &st, nil
}

// PutHold keeps h.Node out of the election until h.Until.
func (s *Store) PutHold(ctx context.Context, h Hold) error {
	h.Format = vigil.RecordFormat
	return s.put(ctx, s.holdKey(h.Node), h, time.Until(h.Until))
}

// Release deletes node's hold; it reports whether there was one.
func (s *Store) Release(ctx context.Context, node string) (bool, error) {
	resp, err := etcdcluster.OnLeader(ctx, s.cl, func(ctx context.Context, cli *clientv3.Client) (*clientv3.DeleteResponse, error) {
		return cli.Delete(ctx, s.holdKey(node))
	})
	if err != nil {
		return false, fmt.Errorf("delete %s: %w", s.holdKey(node), err)
	}
	return resp.Deleted > 0, nil
}
