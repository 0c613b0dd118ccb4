package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/vigil-ha/vigil/internal/election"
	"github.com/vigil-ha/vigil/internal/etcdcluster"
	"github.com/vigil-ha/vigil/internal/handoff"
	"github.com/vigil-ha/vigil/internal/membership"
)

// errHandoff marks a handoff that was refused or did not complete.
var errHandoff = errors.New("handoff")

func newHandoffCmd() *cobra.Command {
	var (
		ef                   etcdFlags
		to, node, lockKey    string
		timeout, holdFor     time.Duration
		hold, release, force bool
	)
	cmd := &cobra.Command{
		Use:   "handoff [--to NODE] [--timeout D] [--hold|--release]",
		Short: "Move the VIP off its holder for planned maintenance, and keep a node from taking it back",
		Long: `Move the VIP, and etcd raft leadership, off the node that holds it, to a
healthy peer (--to names one), and wait until the new holder has it.

Steps, each printed with its time:
  1. the holder and the peers: a peer is a node whose vigil run publishes its
     view of the members (vigil members list shows them). With no peer, or a
     --to that is not one, nothing is changed: a handoff never leaves the
     cluster without a holder.
  2. etcd raft leadership leaves the holder's member, if it has it.
  3. a handoff request in etcd. The holder's vigil waits for a moment when
     no connection through its load balancer is in an exchange (3 s at most),
     then gives the VIP up; the peers other than --to stand by, so --to takes
     it. Connections idle at that moment are closed cleanly, and their
     clients reconnect through the new holder.
  4. the new holder renews the lock, and the request is removed.

--hold also keeps this node (--node-name) out of the election for --hold-for,
so a reboot or an upgrade does not pull the VIP back; run it on the holder
to hand off and hold in one step. --release ends the hold. A hold that would
leave the VIP without a standby is refused, and nothing is written: holding
a non-holder must leave another live, unheld vigil besides the holder, and
holding the holder must leave one besides the peer that takes the VIP over.
It prints who would be left. --force holds anyway; a holder held that way
gives the VIP up even when no peer can take it (without --force, a holder
keeps the VIP while no peer may take it, hold or not).

Runs anywhere with etcd access: the connection flags are those of vigil run.
The request lives on an etcd lease of --timeout: if this command dies, the
cluster goes back to normal by itself.`,
		Example: `  # before rebooting cp1, which holds the VIP:
  vigil handoff --hold --node-name cp1 --etcd-endpoints https://10.0.0.11:2379 \
    --etcd-cacert /etc/kubernetes/pki/etcd/ca.crt \
    --etcd-cert /etc/kubernetes/pki/apiserver-etcd-client.crt \
    --etcd-key /etc/kubernetes/pki/apiserver-etcd-client.key
  # once cp1 is back:
  vigil handoff --release --node-name cp1 ...`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch {
			case hold && release:
				return fmt.Errorf("%w: --hold and --release exclude each other", errHandoff)
			case release && to != "":
				return fmt.Errorf("%w: --release takes no --to", errHandoff)
			case timeout <= 0:
				return fmt.Errorf("%w: --timeout %v must be positive", errHandoff, timeout)
			case holdFor <= 0:
				return fmt.Errorf("%w: --hold-for %v must be positive", errHandoff, holdFor)
			case (hold || release) && node == "":
				return fmt.Errorf("%w: --node-name is required with --hold and --release (the host name is unknown)", errHandoff)
			case hold && to == node:
				return fmt.Errorf("%w: --to %s is the node --hold keeps out", errHandoff, to)
			case force && !hold:
				return fmt.Errorf("%w: --force goes with --hold", errHandoff)
			}
			cl, err := ef.cluster()
			if err != nil {
				return err
			}
			defer cl.Close()
			h := &handoffRun{cl: cl, etcd: cl.Etcd(), store: handoff.NewStore(cl.Etcd(), ""),
				lock: election.NewEtcdLockOn(cl.Etcd(), lockKey, slog.New(slog.DiscardHandler)), say: sayTo{cmd.OutOrStdout()}}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			if release {
				had, err := h.store.Release(ctx, node)
				if err != nil {
					return err
				}
				if had {
					h.say.line("released the hold on %s: it campaigns again", node)
				} else {
					h.say.line("%s was not held", node)
				}
				return nil
			}
			h.force = force
			return h.run(ctx, to, node, hold, holdFor, timeout)
		},
	}
	ef.add(cmd)
	host, _ := os.Hostname()
	f := cmd.Flags()
	f.StringVar(&to, "to", "", "the peer to hand the VIP to (default: whichever healthy peer takes it first)")
	f.DurationVar(&timeout, "timeout", time.Minute, "give up, and leave the VIP where it is, after this long")
	f.BoolVar(&hold, "hold", false, "also keep --node-name out of the election for --hold-for (handing the VIP off first if it holds it)")
	f.BoolVar(&release, "release", false, "end the hold on --node-name")
	f.DurationVar(&holdFor, "hold-for", 30*time.Minute, "how long --hold lasts unless released")
	f.BoolVar(&force, "force", false, "with --hold: hold even when that leaves the VIP without a standby (and let a held holder give the VIP up with no peer to take it)")
	f.StringVar(&node, "node-name", host, "this node's name in the election (vigil run --node-name), for --hold and --release")
	f.StringVar(&lockKey, "lock-key", election.DefaultEtcdKey, "etcd key of vigil's lock record (vigil run --lock-key)")
	return cmd
}

type handoffRun struct {
	cl    *membership.Cluster
	etcd  *etcdcluster.Cluster
	store *handoff.Store
	lock  *election.EtcdLock
	say   sayTo
	force bool // --force: hold even without a standby
}

func (h *handoffRun) run(ctx context.Context, to, node string, hold bool, holdFor, timeout time.Duration) error {
	start := time.Now()
	obs, err := h.lock.Get(ctx)
	switch {
	case err != nil:
		return fmt.Errorf("%w: read the lock: %w", errHandoff, err)
	case obs.Record != nil && obs.Record.MovedTo != "":
		return fmt.Errorf("%w: the election moved to %s; vigil handoff works with the etcd election only", errHandoff, obs.Record.MovedTo)
	case obs.Holder() == "":
		return fmt.Errorf("%w: nobody holds the VIP now; nothing to hand off (vigil members preflight checks the holder)", errHandoff)
	}
	holder := obs.Holder()
	h.say.line("the VIP is on %s", holder)
	if to == holder {
		return fmt.Errorf("%w: %s holds the VIP already", errHandoff, to)
	}

	// 1. The peers: live vigils, other than the holder and held nodes. A
	// vigil is live when its report changed within membership.ReportStale,
	// as vigil run and vigil members count it (slow rounds on a loaded
	// node included: a 3 s window here once took a loaded peer for dead).
	// The wait ends as soon as every report has changed.
	fresh, err := h.cl.FreshReports(ctx, membership.ReportStale)
	if err != nil {
		return fmt.Errorf("%w: read the vigils' reports: %w", errHandoff, err)
	}
	reports, err := h.cl.Reports(ctx)
	if err != nil {
		return fmt.Errorf("%w: %w", errHandoff, err)
	}
	st, err := h.store.Read(ctx)
	if err != nil {
		return fmt.Errorf("%w: %w", errHandoff, err)
	}
	var live []string
	for _, r := range reports {
		if fresh(r.Observer) {
			live = append(live, r.Observer)
		}
	}
	now := time.Now()
	peers := st.Standbys(live, holder, "", now)
	if hold {
		if err := h.checkStandby(st, live, peers, holder, node, now); err != nil {
			return err
		}
	}
	if hold && node != holder {
		if err := h.hold(ctx, node, holdFor); err != nil {
			return err
		}
		h.say.line("%s does not hold the VIP: nothing to hand off", node)
		return nil
	}
	switch {
	case len(peers) == 0:
		return fmt.Errorf("%w: no healthy peer runs vigil (no other node published a fresh view, or all are held); the VIP stays on %s", errHandoff, holder)
	case to != "" && !slices.Contains(peers, to):
		return fmt.Errorf("%w: --to %s is not a healthy peer (peers: %s); the VIP stays on %s", errHandoff, to, strings.Join(peers, ", "), holder)
	}
	h.say.line("peers that can take it: %s", strings.Join(peers, ", "))

	// 2. Raft leadership off the holder's member.
	moved, err := h.etcd.ShedLeadership(ctx, holder)
	switch {
	case err != nil:
		h.say.line("etcd raft leadership not moved (%v); going on: vigil run moves it off the holder too", err)
	case moved != "":
		h.say.line("etcd raft leadership moved from %s to %s", holder, moved)
	default:
		h.say.line("etcd raft leadership is not on %s", holder)
	}

	// 3. The request.
	id := newID()
	req := handoff.Request{ID: id, From: holder, To: to, By: hostName(), At: time.Now()}
	if err := h.store.Begin(ctx, req, timeout+10*time.Second); err != nil {
		return fmt.Errorf("%w: %w", errHandoff, err)
	}
	// Whatever happens, the request goes: the cluster returns to normal.
	defer func() {
		ectx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = h.store.End(ectx, id)
	}()
	h.say.line("handoff %s requested: %s gives the VIP up%s", id, holder, map[bool]string{true: " to " + to, false: ""}[to != ""])

	// 4. Follow it.
	var (
		phase    handoff.Phase
		newOwner string
		firstRev int64
	)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			where := "the VIP is still on " + holder
			if newOwner != "" {
				where = newOwner + " took the VIP but was not seen renewing"
			}
			return fmt.Errorf("%w: not done within --timeout %v: %s", errHandoff, timeout, where)
		case <-tick.C:
		}
		phase = h.sayStatus(ctx, id, holder, phase)
		o, err := h.lock.Get(ctx)
		if err != nil {
			continue
		}
		switch cur := o.Holder(); {
		case newOwner == "" && cur != "" && cur != holder:
			newOwner, firstRev = cur, o.Revision
			if to != "" && cur != to {
				h.say.line("the VIP is on %s (not %s: it did not take it first)", cur, to)
			} else {
				h.say.line("the VIP is on %s", cur)
			}
		case newOwner != "" && cur == newOwner && o.Revision > firstRev:
			took := time.Since(start)
			// The old holder reports how it let go on its next poll of
			// the records (every 250 ms): wait for that line a moment.
			for end := time.Now().Add(time.Second); phase != handoff.Released && time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
				phase = h.sayStatus(ctx, id, holder, phase)
			}
			h.say.line("%s renews the lock: done in %v", newOwner, took.Round(time.Millisecond))
			if hold {
				return h.hold(ctx, node, holdFor)
			}
			return nil
		case newOwner != "" && cur != newOwner:
			newOwner, firstRev = "", 0 // moved again; follow it
		}
	}
}

// sayStatus prints the old holder's report on request id when its phase
// differs from the last printed, and returns the phase.
func (h *handoffRun) sayStatus(ctx context.Context, id, holder string, last handoff.Phase) handoff.Phase {
	s, err := h.store.StatusOf(ctx, id)
	if err != nil || s == nil || s.Phase == last {
		return last
	}
	switch {
	case s.Phase == handoff.Draining:
		h.say.line("%s waits for a quiet moment: %d of its %d proxied connections are in an exchange", holder, s.Busy, s.Total)
	case s.ForcedAfter > 0:
		h.say.line("%s gave the VIP up after %v without a quiet moment (%d of %d connections busy) at %s", holder, s.ForcedAfter.Round(time.Millisecond), s.Busy, s.Total, s.At.Format("15:04:05.000000"))
	case s.Total == 0:
		h.say.line("%s gave the VIP up at %s (no connection through its load balancer)", holder, s.At.Format("15:04:05.000000"))
	default:
		h.say.line("%s gave the VIP up at %s, with none of its %d proxied connections in an exchange; it closes them, and their clients reconnect", holder, s.At.Format("15:04:05.000000"), s.Total)
	}
	return s.Phase
}

// checkStandby refuses a hold of node that would leave the VIP without a
// standby (unless --force), and says who would be left.
func (h *handoffRun) checkStandby(st handoff.State, live, peers []string, holder, node string, now time.Time) error {
	left := st.Standbys(live, holder, node, now)
	var held []string
	for n := range st.Holds {
		if st.Eligible(n, now) != nil {
			held = append(held, n)
		}
	}
	slices.Sort(held)
	var problem string
	switch {
	case node == holder && len(peers) == 0:
		return nil // no peer at all: the handoff refuses below
	case node != holder && len(left) == 0:
		problem = fmt.Sprintf("holding %s leaves no standby for the holder %s: if it fails, no node takes the VIP", node, holder)
	case node == holder && len(peers) == 1:
		problem = fmt.Sprintf("holding the holder %s hands the VIP to %s and leaves no standby for it", holder, peers[0])
	default:
		if node == holder {
			left = peers
		}
		h.say.line("after the hold, these can take the VIP: %s", strings.Join(left, ", "))
		return nil
	}
	detail := fmt.Sprintf("live vigils: %s; held: %s", orNone(strings.Join(live, ", ")), orNone(strings.Join(held, ", ")))
	if h.force {
		h.say.line("%s (%s); holding anyway (--force)", problem, detail)
		return nil
	}
	return fmt.Errorf("%w: %s (%s); nothing written (--force holds anyway)", errHandoff, problem, detail)
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

func (h *handoffRun) hold(ctx context.Context, node string, d time.Duration) error {
	until := time.Now().Add(d).Truncate(time.Second)
	if err := h.store.PutHold(ctx, handoff.Hold{Node: node, By: hostName(), Until: until, Force: h.force}); err != nil {
		return fmt.Errorf("%w: %w", errHandoff, err)
	}
	h.say.line("%s is held out of the election until %s (vigil handoff --release --node-name %s ends it)", node, until.Format(time.RFC3339), node)
	return nil
}

func newID() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func hostName() string {
	h, err := os.Hostname()
	if err != nil {
		return "unknown"
	}
	return h
}
