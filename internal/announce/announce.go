// Package announce tells the local network segment where the VIP lives now:
// gratuitous ARP for IPv4 and unsolicited neighbour advertisements (NDP) for
// IPv6. Hosts and switches update their caches from these at once instead of
// waiting for a stale entry to time out, which is what makes a failover
// visible to clients in milliseconds.
package announce

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"
)

// DefaultInterval is how often the holder re-announces. A switch or host that
// missed the burst (a flapping link, a late-joining host) learns the VIP's
// new location within this time; 3 s is well under every common ARP cache
// timeout while costing nothing.
const DefaultInterval = 3 * time.Second

// burst is the spacing of the first announcements after taking the VIP: one at
// once, then two more in case the first was lost while links renegotiate.
var burst = []time.Duration{0, 50 * time.Millisecond, 250 * time.Millisecond}

// Config configures an Announcer.
type Config struct {
	Interface string
	Address   netip.Addr
	// Also are further addresses announced with Address each time: the
	// other family's VIP of a dual-stack cluster (ARP for IPv4, NA for
	// IPv6).
	Also []netip.Addr
	// Interval between periodic announcements; DefaultInterval when zero.
	Interval time.Duration
	// Links looks the interface up before each announcement (its index
	// and MAC may change): netmon.Monitor. When nil the announcer asks
	// the kernel (net.InterfaceByName).
	Links Links
}

// Links finds a network interface by name.
type Links interface {
	InterfaceByName(name string) (*net.Interface, error)
}

// kernelLinks is Links without a monitor.
type kernelLinks struct{}

func (kernelLinks) InterfaceByName(name string) (*net.Interface, error) {
	return net.InterfaceByName(name)
}

// sender sends one announcement; the Linux implementation uses raw sockets.
type sender interface {
	send(ifi *net.Interface, ip netip.Addr) error
	prepare(ifi *net.Interface, ip netip.Addr) error
	close()
}

// Announcer sends announcements while its Run context lives.
type Announcer struct {
	cfg  Config
	send sender
	log  *slog.Logger
}

// New returns an Announcer.
func New(cfg Config, log *slog.Logger) (*Announcer, error) {
	if !cfg.Address.IsValid() {
		return nil, fmt.Errorf("announce: no address")
	}
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.Links == nil {
		cfg.Links = kernelLinks{}
	}
	for _, a := range cfg.Also {
		if !a.IsValid() {
			return nil, fmt.Errorf("announce: invalid address")
		}
	}
	return &Announcer{cfg: cfg, send: newSender(), log: log.With("vip", cfg.Address.String(), "interface", cfg.Interface)}, nil
}

func (a *Announcer) addrs() []netip.Addr { return append([]netip.Addr{a.cfg.Address}, a.cfg.Also...) }

// Prepare opens the sockets announcements need, so that the first one after
// a failover does not pay for it. Errors are reported again by Once.
func (a *Announcer) Prepare() error {
	ifi, err := a.cfg.Links.InterfaceByName(a.cfg.Interface)
	if err != nil {
		return fmt.Errorf("announce %s: %w", a.cfg.Address, err)
	}
	var errs []error
	for _, ip := range a.addrs() {
		errs = append(errs, a.send.prepare(ifi, ip))
	}
	return errors.Join(errs...)
}

// Close releases the sockets. Call it after the last Run has returned.
func (a *Announcer) Close() { a.send.close() }

// Once sends one announcement now, for every address.
func (a *Announcer) Once() error {
	ifi, err := a.cfg.Links.InterfaceByName(a.cfg.Interface)
	if err != nil {
		return fmt.Errorf("announce %s: %w", a.cfg.Address, err)
	}
	var errs []error
	for _, ip := range a.addrs() {
		if err := a.send.send(ifi, ip); err != nil {
			errs = append(errs, fmt.Errorf("announce %s on %s: %w", ip, a.cfg.Interface, err))
		}
	}
	return errors.Join(errs...)
}

// Run sends the initial burst, then one announcement per interval, until ctx
// is done. Before each one it asks valid (when not nil) and stays silent
// while it says no: a holder whose lease has passed must not announce.
func (a *Announcer) Run(ctx context.Context, valid func() bool) {
	ok := func() bool { return valid == nil || valid() }
	start := time.Now()
	for i, d := range burst {
		if !waitUntil(ctx, start.Add(d)) {
			return
		}
		if !ok() {
			continue
		}
		if err := a.Once(); err != nil {
			a.log.Warn("announcement failed", "err", err)
		} else if i == 0 {
			a.log.Info("VIP announced", "took", time.Since(start).Round(time.Microsecond))
		}
	}
	t := time.NewTicker(a.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !ok() {
			continue
		}
		if err := a.Once(); err != nil {
			a.log.Warn("announcement failed", "err", err)
		}
	}
}

// Group runs an Announcer in the background and waits for it on Stop.
type Group struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// Start runs a.Run(ctx, valid) in a goroutine.
func Start(ctx context.Context, a *Announcer, valid func() bool) *Group {
	ctx, cancel := context.WithCancel(ctx)
	g := &Group{cancel: cancel}
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		a.Run(ctx, valid)
	}()
	return g
}

// Stop ends the announcer and waits for it. Safe to call twice and on nil.
func (g *Group) Stop() {
	if g == nil {
		return
	}
	g.cancel()
	g.wg.Wait()
}

func waitUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-timer.C:
		return true
	}
}
