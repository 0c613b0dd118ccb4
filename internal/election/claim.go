package election

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/vigil-ha/vigil"
	"github.com/vigil-ha/vigil/internal/etcdcluster"
)

// Name claims. The lock record catches a twin (two processes with one node
// name) only once one of them leads. A claim catches it at start: every
// process puts its instance under <lock key>/names/<node name>, attached to
// an etcd lease, and rewrites it every claimKeepAlive. A second process that
// sees the key rewritten refuses to run; a key that nobody rewrites for
// claimDeadAfter was left by a process that died, and is taken over by a
// compare-and-swap on its revision. The rewrite, not the lease, is the proof
// of life: etcd extends every lease when its raft leader changes, so a dead
// owner's lease can live on for many seconds.
const (
	// claimOpTimeout bounds one etcd call of a claim; an unreachable
	// member must not hold the start of vigil forever.
	claimOpTimeout = 2 * time.Second
	// claimTTL is the claim's lease: how long a restarted node waits at
	// most for the claim of its predecessor that died without revoking it.
	// etcd grants no less than about 2 s anyway.
	claimTTL = 5 // seconds
	// claimKeepAlive refreshes the lease and rewrites the key three times
	// per TTL.
	claimKeepAlive = claimTTL * time.Second / 3
	// claimPoll is how often a newcomer reads a held claim.
	claimPoll = 300 * time.Millisecond
	// claimDeadAfter is how long a claim must go without a rewrite before
	// its owner counts as dead: two rewrite periods and a bit, so one late
	// rewrite of a live owner is not mistaken for death.
	claimDeadAfter = 2*claimKeepAlive + 500*time.Millisecond
)

// claimRecord is a claim key's value: {"format":1,"instance":"..."}.
// vigil 0.3.0 and before stored the bare instance (format 0), which
// claimInstance still reads. Either way a process compares the instance
// with its own, so the two formats never mistake one process for another.
type claimRecord struct {
	Format   int    `json:"format"`
	Instance string `json:"instance"`
}

// claimValue is the value this version stores for instance; one instance
// always gives the same bytes (the keep-alive compares them).
func claimValue(instance string) string {
	b, _ := json.Marshal(claimRecord{Format: vigil.RecordFormat, Instance: instance})
	return string(b)
}

// claimInstance reads the instance from a claim of any format.
func claimInstance(v []byte) string {
	var r claimRecord
	if len(v) > 0 && v[0] == '{' && json.Unmarshal(v, &r) == nil && r.Instance != "" {
		return r.Instance
	}
	return string(v)
}

// Claim is a held name claim; Close revokes it.
type Claim struct {
	l        *EtcdLock
	key      string
	instance string
	lease    clientv3.LeaseID
	cancel   context.CancelFunc
	wg       sync.WaitGroup
}

// ClaimName claims name for instance, waiting out the claim of a dead
// predecessor. It returns an error wrapping ErrDuplicateIdentity when a live
// process holds the name, and keeps retrying while etcd is unreachable, until
// ctx is done (then it returns ctx's error).
func (l *EtcdLock) ClaimName(ctx context.Context, name, instance string, log *slog.Logger) (*Claim, error) {
	key := l.key + "/names/" + name
	failures := 0
	for {
		c, other, err := l.tryClaim(ctx, key, instance)
		switch {
		case err == nil && c != nil:
			if failures > 0 {
				log.Info("claimed the node name", "key", key)
			}
			c.start(log)
			return c, nil
		case err == nil:
			// Held by another instance: alive, or dead and never rewritten.
			alive, werr := l.watchClaim(ctx, key, other)
			if werr == nil && alive {
				return nil, fmt.Errorf("%w: node name %q is claimed by another running process (instance %s; this process is %s). Give every node a unique `nodeName`",
					ErrDuplicateIdentity, name, other.instance, instance)
			}
			if werr == nil {
				if c, terr := l.takeOver(ctx, key, instance, other); terr == nil && c != nil {
					log.Info("took over the node name's claim from a process that stopped renewing it", "key", key, "instance", other.instance)
					c.start(log)
					return c, nil
				}
				continue // changed meanwhile: look again
			}
			err = werr
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		failures++
		if failures == 1 {
			log.Warn("cannot claim the node name in etcd yet; retrying", "err", err)
		}
		t := time.NewTimer(min(time.Duration(failures)*200*time.Millisecond, time.Second))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
	}
}

// claimHolder is who holds a claim key, and the key's revision.
type claimHolder struct {
	instance string
	rev      int64
}

// tryClaim grants a lease and creates the key on it if absent. It returns
// the claim, or the current holder when the key exists.
func (l *EtcdLock) tryClaim(ctx context.Context, key, instance string) (*Claim, claimHolder, error) {
	ctx, cancel := context.WithTimeout(ctx, claimOpTimeout)
	defer cancel()
	grant, err := etcdcluster.Via(ctx, l.cl, &l.claims, func(ctx context.Context, m *etcdcluster.Member) (*clientv3.LeaseGrantResponse, error) {
		return m.Client.Grant(ctx, claimTTL)
	})
	if err != nil {
		return nil, claimHolder{}, fmt.Errorf("grant a lease for %s: %w", key, err)
	}
	resp, err := etcdcluster.Do(ctx, l.cl, func(ctx context.Context, m *etcdcluster.Member) (*clientv3.TxnResponse, error) {
		return m.Client.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
			Then(clientv3.OpPut(key, claimValue(instance), clientv3.WithLease(grant.ID))).
			Else(clientv3.OpGet(key)).Commit()
	})
	if err == nil && resp.Succeeded {
		return &Claim{l: l, key: key, instance: instance, lease: grant.ID}, claimHolder{}, nil
	}
	l.revoke(grant.ID)
	if err != nil {
		return nil, claimHolder{}, fmt.Errorf("claim %s: %w", key, err)
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 {
		return nil, claimHolder{}, errors.New("claim key vanished during the claim")
	}
	if claimInstance(kvs[0].Value) == instance {
		// Our own create landed through one member while another member's
		// answer came first.
		return &Claim{l: l, key: key, instance: instance, lease: clientv3.LeaseID(kvs[0].Lease)}, claimHolder{}, nil
	}
	return nil, claimHolder{instance: claimInstance(kvs[0].Value), rev: kvs[0].ModRevision}, nil
}

// watchClaim follows a claim held by another instance until it is rewritten
// (a live owner: true), or claimDeadAfter passes without a rewrite (a dead
// owner: false), or it goes or changes hands (false; the caller looks again).
func (l *EtcdLock) watchClaim(ctx context.Context, key string, h claimHolder) (bool, error) {
	deadline := time.Now().Add(claimDeadAfter)
	for time.Now().Before(deadline) {
		t := time.NewTimer(claimPoll)
		select {
		case <-ctx.Done():
			t.Stop()
			return false, ctx.Err()
		case <-t.C:
		}
		gctx, cancel := context.WithTimeout(ctx, claimOpTimeout)
		resp, err := etcdcluster.Do(gctx, l.cl, func(ctx context.Context, m *etcdcluster.Member) (*clientv3.GetResponse, error) {
			return m.Client.Get(ctx, key)
		})
		cancel()
		if err != nil {
			return false, fmt.Errorf("read %s: %w", key, err)
		}
		switch {
		case len(resp.Kvs) == 0 || claimInstance(resp.Kvs[0].Value) != h.instance:
			return false, nil // gone, or claimed by somebody else
		case resp.Kvs[0].ModRevision != h.rev:
			return true, nil // its owner rewrote it: alive
		}
	}
	return false, nil
}

// takeOver replaces a dead owner's claim, if it is still the one seen.
func (l *EtcdLock) takeOver(ctx context.Context, key, instance string, h claimHolder) (*Claim, error) {
	ctx, cancel := context.WithTimeout(ctx, claimOpTimeout)
	defer cancel()
	grant, err := etcdcluster.Via(ctx, l.cl, &l.claims, func(ctx context.Context, m *etcdcluster.Member) (*clientv3.LeaseGrantResponse, error) {
		return m.Client.Grant(ctx, claimTTL)
	})
	if err != nil {
		return nil, err
	}
	resp, err := etcdcluster.Do(ctx, l.cl, func(ctx context.Context, m *etcdcluster.Member) (*clientv3.TxnResponse, error) {
		return m.Client.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", h.rev)).
			Then(clientv3.OpPut(key, claimValue(instance), clientv3.WithLease(grant.ID))).Commit()
	})
	if err != nil || !resp.Succeeded {
		l.revoke(grant.ID)
		return nil, err
	}
	return &Claim{l: l, key: key, instance: instance, lease: grant.ID}, nil
}

// start keeps the claim's lease alive until Close. A lease lost during an
// etcd outage longer than the TTL is claimed again; if another instance
// claimed the name meanwhile, that is logged (the lock record still keeps
// the twins from both leading).
func (c *Claim) start(log *slog.Logger) {
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		t := time.NewTicker(claimKeepAlive)
		defer t.Stop()
		warned := false
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			kctx, cancelOnce := context.WithTimeout(ctx, claimKeepAlive)
			// Both through one member while it answers (etcdcluster.Path):
			// every few seconds, for as long as vigil runs.
			_, err := etcdcluster.Via(kctx, c.l.cl, &c.l.claims, func(ctx context.Context, m *etcdcluster.Member) (*clientv3.LeaseKeepAliveResponse, error) {
				return m.Client.KeepAliveOnce(ctx, c.lease)
			})
			if err == nil {
				// The proof of life a newcomer looks for; only while the
				// key is still ours.
				_, err = etcdcluster.Via(kctx, c.l.cl, &c.l.claims, func(ctx context.Context, m *etcdcluster.Member) (*clientv3.TxnResponse, error) {
					return m.Client.Txn(ctx).If(clientv3.Compare(clientv3.Value(c.key), "=", claimValue(c.instance))).
						Then(clientv3.OpPut(c.key, claimValue(c.instance), clientv3.WithLease(c.lease))).Commit()
				})
			}
			cancelOnce()
			if !errors.Is(err, rpctypes.ErrLeaseNotFound) {
				continue // renewed, or etcd unreachable: try again next tick
			}
			again, other, err := c.l.tryClaim(ctx, c.key, c.instance)
			switch {
			case err == nil && again != nil:
				c.lease = again.lease
				warned = false
			case err == nil && !warned:
				log.Error("the node name's claim expired during an etcd outage and another process claimed it", "key", c.key, "instance", other.instance)
				warned = true
			}
		}
	}()
}

// Close stops the keep-alive and revokes the lease, which deletes the key:
// a restarted process claims the name at once. Safe to call twice.
func (c *Claim) Close() {
	if c.cancel != nil {
		c.cancel()
		c.wg.Wait()
		c.cancel = nil
		c.l.revoke(c.lease)
	}
}

func (l *EtcdLock) revoke(id clientv3.LeaseID) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, _ = etcdcluster.Do(ctx, l.cl, func(ctx context.Context, m *etcdcluster.Member) (*clientv3.LeaseRevokeResponse, error) {
		return m.Client.Revoke(ctx, id) // a lease that expires by itself needs nothing
	})
}
