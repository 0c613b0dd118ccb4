package agent

import (
	"context"
	"net"
	"time"
)

// Preference tiers: new connections go to the lowest tier with a usable
// backend, least connections within it.
const (
	tierLocal = 0 // on this host
	tierNear  = 1 // latency within twice the best remote backend's, plus slack
	tierFar   = 2 // slower, or not measured yet
	tierSeed  = 3 // a seed (--server, --etcd-endpoints) not learned from the cluster
)

// nearSlack keeps backends in one tier when their latencies differ by
// noise: on one L2 segment they all answer in well under a millisecond.
const nearSlack = time.Millisecond

// rankLoop re-ranks the backends every second by what the health checks
// measure.
func (a *Agent) rankLoop(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		a.rank()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (a *Agent) rank() {
	local := map[string]bool{}
	addrs, err := a.localAddrs()
	if err == nil {
		for _, ip := range addrs {
			local[ip.String()] = true
		}
	}
	for _, u := range a.upstreams() {
		u.bal.SetTiers(tiers(u, local))
	}
}

func tiers(u *upstream, local map[string]bool) map[string]int {
	backends := u.backends()
	out := make(map[string]int, len(backends))
	lat := map[string]time.Duration{}
	var best time.Duration
	for _, b := range backends {
		host, _, _ := net.SplitHostPort(b)
		switch {
		case !u.isLearned(b):
			out[b] = tierSeed
		case local[host]:
			out[b] = tierLocal
		default:
			if d, ok := u.checker.Latency(b); ok {
				lat[b] = d
				if best == 0 || d < best {
					best = d
				}
			}
		}
	}
	for _, b := range backends {
		if _, done := out[b]; done {
			continue
		}
		if d, ok := lat[b]; ok && d <= 2*best+nearSlack {
			out[b] = tierNear
		} else {
			out[b] = tierFar
		}
	}
	return out
}

func (a *Agent) localAddrs() ([]net.IP, error) {
	if a.cfg.LocalAddrs != nil {
		return a.cfg.LocalAddrs()
	}
	ifas, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	var out []net.IP
	for _, ifa := range ifas {
		if n, ok := ifa.(*net.IPNet); ok {
			out = append(out, n.IP)
		}
	}
	return out, nil
}
