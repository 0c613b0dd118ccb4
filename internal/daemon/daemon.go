package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/vigil-ha/vigil/internal/announce"
	"github.com/vigil-ha/vigil/internal/election"
	"github.com/vigil-ha/vigil/internal/vip"
)

// shedInterval is how often the VIP holder checks whether its own etcd member
// leads raft. Raft leadership only lands on it after an etcd election, which
// is rare; checking every 2 s keeps the window in which one crash costs both
// a VIP failover and an etcd election short, at a cost of one Status call per
// member.
const shedInterval = 2 * time.Second

// Run validates cfg, prepares the node and runs until ctx is cancelled. Errors
// it returns are configuration or environment errors; an unreachable etcd is
// not one of them (it is retried).
func Run(ctx context.Context, cfg Config, log *slog.Logger) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	tc, err := cfg.tlsConfig()
	if err != nil {
		return err
	}
	log = log.With("node", cfg.NodeName)
	vm, err := vip.New(vip.Config{Address: cfg.VIP, Interface: cfg.Interface, Lifetime: cfg.VIPLifetime}, log)
	if err != nil {
		return err
	}
	ann, err := announce.New(announce.Config{Interface: cfg.Interface, Address: cfg.VIP.Addr(), Interval: cfg.AnnounceInterval}, log)
	if err != nil {
		return err
	}
	defer ann.Close()
	if err := ann.Prepare(); err != nil {
		log.Warn("cannot prepare announcements; will retry when leading", "err", err)
	}
	// A VIP left behind by a crash of this node must go before anything
	// else: this process does not lead yet.
	if err := vm.Remove("stale address from an earlier run; this node does not lead"); err != nil {
		return err
	}
	if cfg.GuardBinary != "" {
		// Its own context: the guard must outlive the VIP's removal at
		// shutdown, and is stopped only after it.
		gctx, stopGuard := context.WithCancel(context.Background())
		g, err := startGuard(gctx, cfg.GuardBinary, cfg, log)
		if err != nil {
			stopGuard()
			return err
		}
		defer func() { stopGuard(); g.Close() }()
	}
	lock, err := election.NewEtcdLock(election.EtcdConfig{Endpoints: cfg.EtcdEndpoints, TLS: tc, Key: cfg.LockKey}, log)
	if err != nil {
		return err
	}
	defer lock.Close()

	h := &holder{vip: vm, ann: ann, lock: lock, cfg: cfg, log: log}
	el, err := election.New(election.Config{
		Identity:        cfg.NodeName,
		Lock:            lock,
		Prober:          lock,
		LeaseDuration:   cfg.LeaseDuration,
		RenewDeadline:   cfg.RenewDeadline,
		RetryPeriod:     cfg.RetryPeriod,
		ReleaseOnCancel: true,
		Callbacks: election.Callbacks{
			OnStartedLeading: h.start,
			OnStoppedLeading: h.stop,
		},
	}, log)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	log.Info("vigil starting", "vip", cfg.VIP.String(), "interface", cfg.Interface, "election", cfg.Election,
		"lease_duration", cfg.LeaseDuration, "renew_deadline", cfg.RenewDeadline, "retry_period", cfg.RetryPeriod)
	err = el.Run(ctx)
	h.stop("shutting down") // idempotent; covers a Run that returned while leading
	log.Info("vigil stopped")
	return err
}

// holder is what a leader holds: the VIP (with its lifetime refresher), its
// announcer and the raft leadership shedder.
type holder struct {
	vip  *vip.Manager
	ann  *announce.Announcer
	lock *election.EtcdLock
	cfg  Config
	log  *slog.Logger

	mu     sync.Mutex // guards group and cancel
	group  *announce.Group
	cancel context.CancelFunc
	wg     sync.WaitGroup // the refresher and the shedder
}

// start runs on becoming leader: VIP first, announcement at once.
func (h *holder) start(ctx context.Context) {
	if err := h.vip.Add(); err != nil {
		h.log.Error("cannot add the VIP; retrying every second", "err", err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	ctx, h.cancel = context.WithCancel(ctx)
	h.group = announce.Start(ctx, h.ann)
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		h.keep(ctx)
	}()
	if h.cfg.ShedRaftLeadership {
		h.wg.Add(1)
		go func() {
			defer h.wg.Done()
			h.shed(ctx)
		}()
	}
}

// stop runs on losing leadership; it returns only once the VIP is gone.
func (h *holder) stop(reason string) {
	h.mu.Lock()
	if h.cancel != nil {
		h.cancel()
		h.cancel = nil
	}
	h.group.Stop()
	h.group = nil
	h.mu.Unlock()
	h.wg.Wait()
	if err := h.vip.Remove(reason); err != nil {
		// Nothing else can be done; say it loudly. The kernel drops the
		// address when its lifetime runs out.
		h.log.Error("cannot remove the VIP", "err", err)
	}
}

// keep re-adds the VIP every vip.RefreshInterval, which also renews its
// kernel lifetime, and puts it back if something removed it.
func (h *holder) keep(ctx context.Context) {
	t := time.NewTicker(vip.RefreshInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := h.vip.Add(); err != nil && ctx.Err() == nil {
			h.log.Error("cannot refresh the VIP", "err", err)
		}
	}
}

// shed keeps etcd raft leadership off this node while it holds the VIP.
func (h *holder) shed(ctx context.Context) {
	t := time.NewTicker(shedInterval)
	defer t.Stop()
	for {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		to, err := h.lock.ShedRaftLeadership(cctx, h.cfg.EtcdMemberName)
		cancel()
		switch {
		case err != nil && ctx.Err() == nil:
			h.log.Warn("cannot move etcd leadership off the VIP holder", "err", err)
		case to != "":
			h.log.Info("moved etcd raft leadership off the VIP holder", "member", h.cfg.EtcdMemberName, "to", to)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
