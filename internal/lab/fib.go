package lab

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The ECMP lab's router hashes flows across the nodes' routes. How it
// spreads them decides what a flow to a survivor sees when one node goes:
//
//   - RouterHashThreshold: the kernel's plain multipath route, as BIRD 2
//     installs it (hash-threshold: each next hop owns a range of the hash
//     space). When one goes, the ranges of the others move too, and some
//     flows to survivors land on another node, which resets them. Many
//     routers do this.
//   - RouterHashResilient (the default): a resilient next-hop group
//     (Linux 5.13, nexthop-group-resilient.rst; "resilient hashing" on data
//     centre switches). Flows hash into buckets; when a next hop goes,
//     only its buckets are given to the others, and the buckets of the
//     survivors keep their next hop. A next hop that comes back takes
//     only buckets that have been idle for a second.
//
// BIRD 2.0 installs only plain multipath routes, so with resilient hashing
// BIRD installs its route in routerBGPTable, which nothing routes by, and
// `vigil-lab router-fib` (ServeRouterFIB, in the router's namespace) copies
// the next hops of every change into a resilient group that the VIP's
// route in the main table uses. BIRD stays the BGP peer and the one that
// decides the next hops; the copy only changes how the kernel hashes.
const (
	RouterHashResilient = "resilient"
	RouterHashThreshold = "threshold"

	// routerBGPTable is where BIRD installs its routes with resilient
	// hashing.
	routerBGPTable = 100
	roleRouterFIB  = "router-fib"
	// fibGroupID is the resilient group's ID; next hops get
	// fibNextHopBase + a counter.
	fibGroupID     = 100
	fibNextHopBase = 1000
	// fibBuckets are the group's hash buckets (at least the next hops,
	// 9 nodes at most; more make the shares more even).
	fibBuckets = 128
	// fibIdle is how long a bucket must have carried no packet before it
	// may move to a next hop that came back.
	fibIdle = time.Second
)

func (s Settings) resilient() bool {
	return s.ecmp() && s.RouterHash != RouterHashThreshold
}

// RouterFIBConfig configures `vigil-lab router-fib`.
type RouterFIBConfig struct {
	// Table is where BIRD installs its routes.
	Table int
	// Prefix is the route copied: the VIP's host route.
	Prefix netip.Prefix
}

// ServeRouterFIB copies the next hops of cfg.Prefix's route in cfg.Table
// into a resilient next-hop group, and routes cfg.Prefix in the main table
// through that group, at every change of the route until ctx ends. It runs
// in the router's namespace. With no route in cfg.Table the main table has
// none either.
func ServeRouterFIB(ctx context.Context, cfg RouterFIBConfig, log *slog.Logger) error {
	if !cfg.Prefix.Addr().Is4() {
		return errors.New("router-fib: IPv4 only")
	}
	updates := make(chan netlink.RouteUpdate, 64)
	done := make(chan struct{})
	defer close(done)
	subErr := make(chan error, 1)
	if err := netlink.RouteSubscribeWithOptions(updates, done, netlink.RouteSubscribeOptions{
		ListExisting: true,
		ErrorCallback: func(err error) {
			select {
			case subErr <- err:
			default:
			}
		},
	}); err != nil {
		return fmt.Errorf("router-fib: subscribe to route changes: %w", err)
	}
	f := &fib{cfg: cfg, log: log, ids: map[netip.Addr]int{}, dev: map[netip.Addr]string{}}
	if err := f.sync(ctx); err != nil {
		return err
	}
	// A resync now and then, in case an update was lost (a full netlink
	// socket drops them).
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-subErr:
			return fmt.Errorf("router-fib: route updates: %w", err)
		case u, ok := <-updates:
			if !ok {
				return errors.New("router-fib: route updates ended")
			}
			if u.Table != cfg.Table || u.Dst == nil || u.Dst.String() != cfg.Prefix.String() {
				continue
			}
		case <-t.C:
		}
		if err := f.sync(ctx); err != nil {
			log.Warn("router-fib: sync failed; trying again at the next change or in a second", "err", err)
		}
	}
}

// fib is the copy's state: the next hops in the group now.
type fib struct {
	cfg     RouterFIBConfig
	log     *slog.Logger
	ids     map[netip.Addr]int // next-hop object by gateway
	next    int
	current []netip.Addr          // the group's gateways, sorted; nil when no route
	dev     map[netip.Addr]string // the link each next-hop object was made on
}

// sync reads BIRD's route and makes the group and the main route match it.
func (f *fib) sync(ctx context.Context) error {
	gws, devs, err := f.read()
	if err != nil {
		return err
	}
	if slices.Equal(gws, f.current) { // current is nil or holds next hops
		return nil
	}
	start := time.Now()
	if len(gws) == 0 {
		if err := ipIgnore(ctx, "no such process", "route", "del", f.cfg.Prefix.String()); err != nil {
			return err
		}
		if err := ipIgnore(ctx, "no such file", "nexthop", "del", "id", strconv.Itoa(fibGroupID)); err != nil {
			return err
		}
		f.current = nil
		f.log.Info("router-fib: no route", "prefix", f.cfg.Prefix, "took", time.Since(start).Round(time.Microsecond))
		return nil
	}
	var members []string
	for _, gw := range gws {
		id, ok := f.ids[gw]
		if !ok || f.dev[gw] != devs[gw] {
			if !ok {
				f.next++
				id = fibNextHopBase + f.next
				f.ids[gw] = id
			}
			if err := ip(ctx, "nexthop", "replace", "id", strconv.Itoa(id), "via", gw.String(), "dev", devs[gw]); err != nil {
				return err
			}
			f.dev[gw] = devs[gw]
		}
		members = append(members, strconv.Itoa(id))
	}
	if err := ip(ctx, "nexthop", "replace", "id", strconv.Itoa(fibGroupID), "group", strings.Join(members, "/"),
		"type", "resilient", "buckets", strconv.Itoa(fibBuckets), "idle_timer", strconv.Itoa(int(fibIdle/time.Second)), "unbalanced_timer", "0"); err != nil {
		return err
	}
	if f.current == nil { // the route points at the group from then on
		if err := ip(ctx, "route", "replace", f.cfg.Prefix.String(), "nhid", strconv.Itoa(fibGroupID)); err != nil {
			return err
		}
	}
	f.current = gws
	f.log.Info("router-fib: next hops", "prefix", f.cfg.Prefix, "via", gws, "took", time.Since(start).Round(time.Microsecond))
	return nil
}

// read returns the gateways of the prefix's route in the table, sorted,
// and the link of each.
func (f *fib) read() ([]netip.Addr, map[netip.Addr]string, error) {
	dst := &net.IPNet{IP: f.cfg.Prefix.Addr().AsSlice(), Mask: net.CIDRMask(f.cfg.Prefix.Bits(), 32)}
	routes, err := netlink.RouteListFiltered(unix.AF_INET, &netlink.Route{Table: f.cfg.Table, Dst: dst}, netlink.RT_FILTER_TABLE|netlink.RT_FILTER_DST)
	if err != nil {
		return nil, nil, fmt.Errorf("router-fib: list table %d: %w", f.cfg.Table, err)
	}
	devs := map[netip.Addr]string{}
	add := func(gw net.IP, link int) error {
		a, ok := netip.AddrFromSlice(gw)
		if !ok {
			return nil
		}
		l, err := netlink.LinkByIndex(link)
		if err != nil {
			return fmt.Errorf("router-fib: link %d: %w", link, err)
		}
		devs[a.Unmap()] = l.Attrs().Name
		return nil
	}
	for _, r := range routes {
		if r.Gw != nil {
			if err := add(r.Gw, r.LinkIndex); err != nil {
				return nil, nil, err
			}
		}
		for _, nh := range r.MultiPath {
			if err := add(nh.Gw, nh.LinkIndex); err != nil {
				return nil, nil, err
			}
		}
	}
	var gws []netip.Addr
	for a := range devs {
		gws = append(gws, a)
	}
	slices.SortFunc(gws, netip.Addr.Compare)
	return gws, devs, nil
}

// ipIgnore runs ip, and takes an error whose output contains benign (in
// lower case) for success: the thing is already gone.
func ipIgnore(ctx context.Context, benign string, args ...string) error {
	out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput()
	if err != nil && !strings.Contains(strings.ToLower(string(out)), benign) {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}
