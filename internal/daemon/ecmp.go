package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vigil-ha/vigil/internal/bgp"
	"github.com/vigil-ha/vigil/internal/health"
	"github.com/vigil-ha/vigil/internal/vip"
)

// ecmpPoll bounds how long a change of the own API server's health waits
// when no health change wakes the loop (it always does; this is a floor).
const ecmpPoll = 250 * time.Millisecond

// ecmpAnnouncer is --bgp-mode ecmp. Every node carries the VIP on its
// interface and serves it with its balancers; it advertises the VIP's host
// route, with the same MED as every other node, while its own API server
// passes its checks, and withdraws it as soon as that server fails them.
// The routers then spread flows across the nodes that advertise.
//
// There is no single holder to fence: two nodes serving the VIP is the
// point. What stays safe is the route: a node advertises only while its
// process runs and keeps its BGP (and BFD) sessions, so a node that dies or
// freezes is withdrawn by the routers within the hold time or BFD's
// detection time. The VIP left on a killed node's interface attracts no
// traffic (no route points there) and is removed when vigil starts again.
//
// The election still runs, for what needs one node: pruning, Node
// deletion, handoffs of that duty.
type ecmpAnnouncer struct {
	vm      *vip.Manager
	speaker *bgp.Speaker
	bal     balancers // nil without --lb-port
	checker *health.Checker
	host    *hostAddrs
	vips    []netip.Addr
	log     *slog.Logger
	kick    chan struct{}
	held    prometheus.Gauge // vigil_vip_held: 1 while advertised

	mu     sync.Mutex // guards reason
	reason string     // why this node advertises, or does not
}

func newECMP(vm *vip.Manager, sp *bgp.Speaker, bal balancers, checker *health.Checker, vips []netip.Addr, addrs addrSource, held prometheus.Gauge, log *slog.Logger) *ecmpAnnouncer {
	return &ecmpAnnouncer{vm: vm, speaker: sp, bal: bal, checker: checker, host: newHostAddrs(vips, addrs), vips: vips,
		held: held, log: log.With("part", "ecmp"), kick: make(chan struct{}, 1)}
}

// Kick makes the loop look at the API server's health now.
func (e *ecmpAnnouncer) Kick() {
	select {
	case e.kick <- struct{}{}:
	default:
	}
}

// healthy says whether this node's own API server passes its checks, and
// why (not).
func (e *ecmpAnnouncer) healthy() (bool, string) {
	mine := e.host.mine(e.checker.Statuses())
	if len(mine) == 0 {
		return false, "no API server on this node is among the backends (yet)"
	}
	var down []string
	for _, st := range mine {
		if st.State == health.Up {
			return true, "own API server " + st.Backend + " passes its checks"
		}
		down = append(down, fmt.Sprintf("%s %s (%s)", st.Backend, st.State, st.LastError))
	}
	return false, "own API server fails its checks: " + strings.Join(down, ", ")
}

// Status is why this node advertises the VIP, or does not.
func (e *ecmpAnnouncer) Status() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.reason
}

// Run carries the VIP and serves it until ctx is done, advertising it
// while the own API server is healthy. On the way out it withdraws the
// route first, then resets the connections and removes the VIP.
func (e *ecmpAnnouncer) Run(ctx context.Context) {
	if err := e.vm.Add(); err != nil {
		// Not fatal: eligible() keeps the route withdrawn until the
		// address is there, retried on every round.
		e.log.Error("cannot add the VIP", "err", err)
	}
	e.bal.SetServing(true)
	advertised := false
	t := time.NewTicker(ecmpPoll)
	defer t.Stop()
	for {
		ok, why := e.healthy()
		if ok {
			if present, err := e.vm.Present(); err != nil || !present {
				if err := e.vm.Add(); err != nil {
					ok, why = false, "cannot add the VIP: "+err.Error()
				}
			}
		}
		e.mu.Lock()
		changed := e.reason != why
		e.reason = why
		e.mu.Unlock()
		switch {
		case ok && !advertised:
			actx, cancel := context.WithTimeout(ctx, time.Second)
			err := e.speaker.Advertise(actx, e.vips, 0)
			cancel()
			if err != nil {
				e.log.Error("cannot advertise the VIP over BGP", "err", err)
			} else {
				advertised = true
				e.held.Set(1)
				e.log.Info("advertising the VIP", "why", why)
			}
		case !ok && advertised:
			if err := e.withdraw(); err != nil {
				e.log.Error("cannot withdraw the VIP's route", "err", err)
			} else {
				advertised = false
				e.held.Set(0)
				e.log.Warn("VIP route withdrawn", "why", why)
			}
		case changed && !ok:
			e.log.Info("not advertising the VIP", "why", why)
		}
		select {
		case <-ctx.Done():
			if err := e.withdraw(); err != nil {
				e.log.Error("cannot withdraw the VIP's route", "err", err)
			}
			e.held.Set(0)
			e.bal.SetServing(false)
			if err := e.vm.Remove("vigil stopping (--bgp-mode ecmp)"); err != nil {
				e.log.Error("cannot remove the VIP", "err", err)
			}
			return
		case <-e.kick:
		case <-t.C:
		}
	}
}

func (e *ecmpAnnouncer) withdraw() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	return e.speaker.Withdraw(ctx)
}
