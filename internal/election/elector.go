package election

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vigil-ha/vigil/internal/validate"
)

// MinSafetyMargin is the smallest LeaseDuration - RenewDeadline accepted. The
// margin must cover stepping down (removing an address takes well under 1 ms
// through netlink), a late timer on a busy machine, and the rate difference of
// two clocks over one lease; 100 ms is generous for all three on a sub-second
// lease and still allows ~0.3 s failover.
const MinSafetyMargin = 100 * time.Millisecond

// Defaults chosen for sub-second failover with a 300 ms safety margin. A
// candidate takes over about LeaseDuration after the holder's last renewal; the
// holder renews every RetryPeriod and steps down after RenewDeadline without
// one, so four consecutive renewals may fail before it gives up.
const (
	DefaultLeaseDuration = 800 * time.Millisecond
	DefaultRenewDeadline = 500 * time.Millisecond
	DefaultRetryPeriod   = 100 * time.Millisecond
)

// Defaults of the Lease backend (--election kubernetes). A renewal there is
// a patch through an API server, which writes it to etcd and sends it to
// every watcher: slower, and much spikier under load, than an etcd
// transaction (Kubernetes' own objective for mutating calls is 1 s at the
// 99th percentile). At the etcd defaults a Lease holder rides out answers
// up to 300 ms late (docs/election.md), and the kubeadm lab's API servers,
// on two cores while kubelet restarted pods, answered a renewal in 503 ms:
// the VIP blinked. These ride out 700 ms, and a hard kill still fails over
// in under two seconds.
const (
	DefaultAPILeaseDuration = 1600 * time.Millisecond
	DefaultAPIRenewDeadline = 1200 * time.Millisecond
	DefaultAPIRetryPeriod   = 200 * time.Millisecond
)

// maxReadBackoff caps the pause between failed reads of a candidate that
// cannot reach the store (during kubeadm init etcd starts after vigil).
const maxReadBackoff = time.Second

// Cause says why a leader stepped down.
type Cause int

// Causes of a step-down.
const (
	// CauseShutdown: Run's context was cancelled (SIGTERM).
	CauseShutdown Cause = iota
	// CauseExpired: no renewal succeeded within the renew deadline.
	CauseExpired
	// CauseLost: somebody else wrote the lock.
	CauseLost
	// CauseYield: Config.Yield asked for it (health-aware placement).
	CauseYield
	// CauseIneligible: Config.Eligible failed (the VIP cannot be held here).
	CauseIneligible
)

// StepDown describes the end of a tenure.
type StepDown struct {
	Cause  Cause
	Detail string // for humans
}

func (s StepDown) String() string { return s.Detail }

// Released tells whether the elector releases the lock after this step-down
// (a peer may take it at once instead of after a lease).
func (s StepDown) released() bool { return s.Cause == CauseYield || s.Cause == CauseIneligible }

// Callbacks are run by the elector's own goroutine, one at a time.
type Callbacks struct {
	// OnStartedLeading runs when this node takes the lock. ctx is cancelled
	// when leadership ends. It must not block for long: renewals wait for it.
	OnStartedLeading func(ctx context.Context)
	// OnLease runs whenever the leader's lease deadline moves: at the start
	// of a tenure, after every successful renewal, and when a store outage
	// extends it. Past deadline (a monotonic time of this process) nothing
	// the leader holds may remain, whatever the elector's goroutine is doing:
	// this is what fences a paused or starved process. It runs before
	// OnStartedLeading on a new tenure and must not block.
	OnLease func(deadline time.Time)
	// OnStoppedLeading runs when leadership ends, before the elector reads
	// or writes the lock again, and before anything is logged. When it
	// returns, nothing the leader held may remain (the VIP must be gone).
	OnStoppedLeading func(StepDown)
	// OnNewLeader runs when the observed holder changes ("" when none).
	OnNewLeader func(identity string)
	// OnRenew runs after every renewal attempt of the leader, with how long
	// the write took and its error (nil on success). For metrics.
	OnRenew func(took time.Duration, err error)
	// OnOp runs after every operation on the lock (OpGet, OpAcquire,
	// OpRenew, OpRelease) with how long it took and its error. For the
	// latency histogram.
	OnOp func(op string, took time.Duration, err error)
	// OnAtRisk runs when renewals start to be answered with less than a
	// retry period of the lease left (why), and again with "" once the
	// margin has been back for a while (Status.AtRisk).
	OnAtRisk func(why string)
}

// Config configures an Elector.
type Config struct {
	// Identity names this candidate; it must be unique among candidates.
	Identity string
	// Instance names this process (NewInstance when empty). A record with
	// this Identity but another Instance belongs to another process: an
	// earlier run of this node, taken over after a lease, or a live twin
	// with the same node name, which makes Run fail with
	// ErrDuplicateIdentity.
	Instance string
	// MAC gives the MAC of the VIP's interface, written into the record
	// for peers' conflict checks. It is read at every write, so a changed
	// MAC (a replaced NIC, a bond's failover) reaches the peers with the
	// next renewal. Optional.
	MAC  MACSource
	Lock Lock
	// Eligible, when set, is asked before every attempt to take the lock
	// and after every successful renewal. While it returns an error this
	// node cannot serve the VIP (its interface is down or gone, adding the
	// address fails): a candidate does not take the lock, and a leader steps
	// down and releases it so a peer takes over at once.
	Eligible func() error
	// Prober is optional; without it the leader steps down on every store
	// outage longer than RenewDeadline.
	Prober        Prober
	LeaseDuration time.Duration
	RenewDeadline time.Duration
	RetryPeriod   time.Duration
	// ReleaseOnCancel releases the lock after OnStoppedLeading when Run's
	// context is cancelled, so a peer takes over at once.
	ReleaseOnCancel bool
	Callbacks       Callbacks
	// Yield, when set, is asked after every successful renewal and before
	// every attempt to take the lock. While it says yes (health-aware
	// placement: the local API server is failing and a peer's is not):
	//   - a leader steps down and releases the lock, so a peer takes it at
	//     once;
	//   - a candidate leaves a free or expired lock alone for YieldFor, so a
	//     peer that does not yield takes it first. If none does, it takes the
	//     lock anyway and keeps it for that whole tenure: a VIP on an
	//     imperfect node beats no VIP, and flapping helps nobody.
	Yield    func() (reason string, yield bool)
	YieldFor time.Duration
	// HandOff, when set, is asked where Yield is, for a planned handoff
	// (vigil handoff). While it says yes, a candidate stands by as for
	// Yield, and a leader steps down and releases the lock even in a
	// tenure taken while yielding: an operator asked for it. Needs
	// YieldFor.
	HandOff func() (reason string, yield bool)
}

// yieldNow asks HandOff, then Yield.
func (c Config) yieldNow() (reason string, yield bool) {
	if c.HandOff != nil {
		if reason, yield := c.HandOff(); yield {
			return reason, true
		}
	}
	if c.Yield != nil {
		return c.Yield()
	}
	return "", false
}

// Validate checks the timing rules; see MinSafetyMargin.
func (c Config) Validate() error {
	switch {
	case c.Identity == "":
		return fmt.Errorf("%w: identity (node name) is empty", validate.ErrInvalid)
	case c.Lock == nil:
		return fmt.Errorf("%w: no lock", validate.ErrInvalid)
	case (c.Yield != nil || c.HandOff != nil) && c.YieldFor <= 0:
		return fmt.Errorf("%w: yield needs a positive stand-by time", validate.ErrInvalid)
	}
	return ValidateTimings(c.LeaseDuration, c.RenewDeadline, c.RetryPeriod)
}

// ValidateTimings checks lease, renew deadline and retry period.
func ValidateTimings(lease, renew, retry time.Duration) error {
	switch {
	case retry <= 0:
		return fmt.Errorf("%w: retry period %v must be positive", validate.ErrInvalid, retry)
	case renew <= retry:
		return fmt.Errorf("%w: renew deadline %v must be longer than the retry period %v, or one slow renewal makes the leader step down", validate.ErrInvalid, renew, retry)
	case renew >= lease:
		return fmt.Errorf("%w: renew deadline %v must be shorter than the lease duration %v, or two nodes could hold the VIP at once", validate.ErrInvalid, renew, lease)
	case lease-renew < MinSafetyMargin:
		return fmt.Errorf("%w: lease duration %v minus renew deadline %v leaves %v; at least %v is needed to step down safely", validate.ErrInvalid, lease, renew, lease-renew, MinSafetyMargin)
	}
	return nil
}

// Status is a snapshot of the elector's state.
type Status struct {
	Leader      bool
	Holder      string
	LeaderSince time.Time
	// HolderMAC is the MAC the holder's record announces ("" if unknown).
	HolderMAC string
	// Ineligible is why this node does not campaign now ("" when it does).
	Ineligible string
	// Seen is when the lock was last read or renewed: how fresh Holder is.
	Seen time.Time
	// Transitions is the record's count of holder changes at the start of
	// this node's tenure (while Leader): every later holder's is higher.
	Transitions int
	// RenewLatency is how long the leader's last successful renewal took,
	// from its start to its answer.
	RenewLatency time.Duration
	// RenewMargin is how much of the lease was left when that answer came:
	// how close the renewals run to the deadline. RenewMarginMin is the
	// smallest margin of the last 10 s.
	RenewMargin    time.Duration
	RenewMarginMin time.Duration
	// AtRisk says, while renewals are answered with less than a retry
	// period of the lease left, that the store is too slow for the lease
	// ("" otherwise).
	AtRisk string
}

// Elector runs the election for one candidate.
type Elector struct {
	cfg Config
	log *slog.Logger

	mu     sync.Mutex // guards status and checkWhy
	status Status
	// checkWhy is the error of the last failed Eligible check while it is
	// what status.Ineligible says ("" otherwise).
	checkWhy string

	beat atomic.Int64 // unix nanoseconds of the last turn of a campaign or renewal loop
}

// New returns an Elector, or an error wrapping validate.ErrInvalid.
func New(cfg Config, log *slog.Logger) (*Elector, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Instance == "" {
		cfg.Instance = NewInstance()
	}
	return &Elector{cfg: cfg, log: log.With("lock", cfg.Lock.Describe())}, nil
}

// NewInstance returns an identifier for this process: host, pid and a random
// part, so an error about a twin names where it runs.
func NewInstance() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("%s/pid-%d/%s", host, os.Getpid(), nonce()[:8])
}

// Instance returns this process's instance identifier.
func (e *Elector) Instance() string { return e.cfg.Instance }

// Status returns a snapshot of the elector's state.
func (e *Elector) Status() Status {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.status
}

// Ready reports whether this node has a consistent view of the election:
// the lock was read or renewed within readyWindow. A follower reads it at
// least once per lease duration, a leader renews it every retry period, so
// a view older than two lease durations means the store cannot be read.
func (e *Elector) Ready(now time.Time) error {
	seen := e.Status().Seen
	switch {
	case seen.IsZero():
		return errors.New("the holder is unknown: the lock has not been read since start, or since this node stepped down")
	case now.Sub(seen) > e.readyWindow():
		return fmt.Errorf("the lock was last read %v ago (the store is unreachable?)", now.Sub(seen).Round(time.Millisecond))
	}
	return nil
}

func (e *Elector) readyWindow() time.Duration {
	return 2 * (e.cfg.LeaseDuration + e.readBudget())
}

// Live reports whether the election loop still turns: every read, renewal
// or wait ends within a lease duration plus a backoff, so a loop that has
// not turned for liveWindow is stuck, and restarting the process is the
// cure. It says nothing about the store, which a restart cannot fix. Before
// Run it is live.
func (e *Elector) Live(now time.Time) error {
	b := e.beat.Load()
	if b == 0 {
		return nil
	}
	if d := now.Sub(time.Unix(0, b)); d > e.liveWindow() {
		return fmt.Errorf("the election loop has not turned for %v", d.Round(time.Millisecond))
	}
	return nil
}

func (e *Elector) liveWindow() time.Duration {
	return max(minLiveWindow, 4*(e.cfg.LeaseDuration+maxReadBackoff+e.readBudget()))
}

// minLiveWindow keeps liveness generous: a false "stuck" restarts the
// VIP holder, which costs a failover.
const minLiveWindow = 30 * time.Second

func (e *Elector) tick() { e.beat.Store(time.Now().UnixNano()) }

// Run campaigns, leads and campaigns again until ctx is cancelled. Losing the
// lock never ends Run. It returns nil after a clean shutdown, and an error
// wrapping ErrDuplicateIdentity when another process renews the lock under
// this node's name.
func (e *Elector) Run(ctx context.Context) error {
	e.tick()
	expired := false
	for {
		l, obs, err := e.campaign(ctx, expired)
		if errors.Is(err, ErrDuplicateIdentity) {
			return err
		}
		if err != nil {
			return nil // ctx cancelled while campaigning
		}
		expired = e.lead(ctx, l, obs).Cause == CauseExpired
		if ctx.Err() != nil {
			return nil
		}
	}
}

// watchLock streams changes of the record, when the lock supports it. stop
// ends the stream and waits for it.
func watchLock(ctx context.Context, lock Lock) (<-chan Observation, func()) {
	wl, ok := lock.(Watcher)
	if !ok {
		return nil, func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	ch := make(chan Observation, 16)
	done := make(chan struct{})
	go func() {
		defer close(done)
		wl.Watch(ctx, ch)
	}()
	return ch, func() { cancel(); <-done }
}

// waitForChange waits up to d before the next read. A watched change that is
// newer than last starts the lease window at its arrival (it was committed
// before); a release or deletion ends the wait at once. It reports whether
// ctx is still live, whether a change showed somebody holding the lock, and
// a change that shows a twin renewing under the name self (process
// instance).
func waitForChange(ctx context.Context, d time.Duration, changes <-chan Observation, w *window, last Observation, self, instance string) (alive, held bool, twin *Observation) {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return false, held, nil
		case <-t.C:
			return true, held, nil
		case o := <-changes:
			if o.Revision <= last.Revision {
				continue // an older or repeated event (one watch per member)
			}
			if twinRenewed(last, o, self, instance) {
				return true, held, &o
			}
			last = o
			w.observe(o, time.Now())
			if o.Holder() == "" {
				return true, held, nil // released: read and take it now
			}
			held = true
		}
	}
}

// duplicate builds the error for a twin seen renewing the lock.
func (e *Elector) duplicate(o Observation) error {
	return fmt.Errorf("%w: the lock %s is being renewed by another process with node name %q (instance %s; this process is %s). Give every node a unique `nodeName`",
		ErrDuplicateIdentity, e.cfg.Lock.Describe(), e.cfg.Identity, o.Record.Instance, e.cfg.Instance)
}

// lead holds the lock until it is lost or ctx is done, then steps down, and
// says why.
func (e *Elector) lead(ctx context.Context, l lease, obs Observation) StepDown {
	if cb := e.cfg.Callbacks.OnLease; cb != nil {
		cb(l.deadline)
	}
	e.mu.Lock()
	e.status = Status{Leader: true, Holder: e.cfg.Identity, LeaderSince: time.Now(), HolderMAC: e.mac(), Seen: time.Now()}
	if obs.Record != nil {
		e.status.Transitions = obs.Record.Transitions
	}
	e.mu.Unlock()
	e.log.Info("became leader", "revision", l.rev)
	if cb := e.cfg.Callbacks.OnNewLeader; cb != nil {
		cb(e.cfg.Identity)
	}
	lctx, cancel := context.WithCancel(ctx)
	if cb := e.cfg.Callbacks.OnStartedLeading; cb != nil {
		cb(lctx)
	}
	rec := *obs.Record
	sd := e.renewLoop(ctx, &l, &rec)
	cancel()
	// The VIP goes before anything is logged: a log write can block (a full
	// pipe on stderr), and the lease does not wait for it.
	if cb := e.cfg.Callbacks.OnStoppedLeading; cb != nil {
		cb(sd)
	}
	e.log.Info("stepped down", "reason", sd.Detail)
	e.mu.Lock()
	e.status = Status{Holder: "", Ineligible: e.status.Ineligible}
	e.mu.Unlock()
	if (ctx.Err() != nil && e.cfg.ReleaseOnCancel) || sd.released() {
		e.release(l, rec)
	}
	return sd
}

// probeResult is what one store probe found.
type probeResult struct {
	start      time.Time
	leaderless bool
}

// maxProbes bounds the store probes under way at once (renewLoop).
const maxProbes = 3

// probe asks the store whether it can commit at all (see the package
// documentation); a probe that found it cannot extends the deadline. It
// takes until the deadline it was started under at most, and no longer than
// half the renew deadline: an answer after the deadline is of no use, and
// the result is anchored at start however long the answers took, so later
// probes are worth more than a long one.
func (e *Elector) probe(ctx context.Context, start, deadline time.Time) probeResult {
	pctx, cancel := context.WithDeadline(ctx, minTime(deadline, start.Add(e.cfg.RenewDeadline/2)))
	defer cancel()
	leaderless, err := e.cfg.Prober.StoreLeaderless(pctx)
	if err != nil {
		e.log.Debug("store probe failed", "err", err)
		return probeResult{start: start}
	}
	return probeResult{start: start, leaderless: leaderless}
}

// release marks the lock free so a candidate takes it without waiting. A
// renewal cut short by the shutdown may still have landed; release then
// retries against the revision that renewal produced, as long as the record
// is still ours.
func (e *Elector) release(l lease, rec Record) {
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.RenewDeadline)
	defer cancel()
	rec.Holder = ""
	rec.Tenure = "" // renewals of the tenure still under way must not land after this
	rec.LeaseDurationMillis = 1
	rev := l.rev
	for {
		rec.RenewTime = time.Now().UTC()
		rec.Nonce = nonce()
		began := time.Now()
		got, err := e.cfg.Lock.Write(ctx, rec, rev)
		e.op(OpRelease, time.Since(began), err)
		switch {
		case err == nil:
			e.log.Info("released the lock")
			return
		case errors.Is(err, ErrConflict) && got.Holder() == e.cfg.Identity && got.Record.Instance == e.cfg.Instance:
			rev = got.Revision
			continue
		case errors.Is(err, ErrConflict):
			return // somebody else holds it already; nothing to release
		default:
			e.log.Warn("could not release the lock; peers take over when the lease expires", "err", err)
			return
		}
	}
}

// MACSource gives the MAC of the interface the VIP is on ("" when
// unknown).
type MACSource interface{ MAC() string }

// mac is the MAC to write now.
func (e *Elector) mac() string {
	if e.cfg.MAC == nil {
		return ""
	}
	return e.cfg.MAC.MAC()
}

// record builds the record a candidate writes to take the lock.
func (e *Elector) record(obs Observation, now time.Time) Record {
	r := Record{
		Tenure:              nonce(),
		Holder:              e.cfg.Identity,
		LeaseDurationMillis: e.cfg.LeaseDuration.Milliseconds(),
		AcquireTime:         now.UTC(),
		RenewTime:           now.UTC(),
		Nonce:               nonce(),
		Instance:            e.cfg.Instance,
		MAC:                 e.mac(),
	}
	if obs.Record != nil {
		r.Transitions = obs.Record.Transitions
		if obs.Record.Holder != e.cfg.Identity {
			r.Transitions++
		}
	}
	return r
}

func (e *Elector) setHolder(o Observation) {
	h := o.Holder()
	e.mu.Lock()
	changed := e.status.Holder != h
	e.status.Holder = h
	e.status.Seen = time.Now()
	e.status.HolderMAC = ""
	if o.Record != nil && h != "" {
		e.status.HolderMAC = o.Record.MAC
	}
	e.mu.Unlock()
	if changed {
		e.log.Info("observed leader", "leader", h)
		if cb := e.cfg.Callbacks.OnNewLeader; cb != nil {
			cb(h)
		}
	}
}

// noteMoved logs, once per change, that the lock was retired (Retire) or
// is in use again, and keeps the status saying why this node does not
// campaign. It returns the MovedTo now in force.
func (e *Elector) noteMoved(o Observation, was string) string {
	to := ""
	if o.Record != nil {
		to = o.Record.MovedTo
	}
	switch {
	case to == was:
	case to != "":
		why := "the election has moved to " + to + " for good; this node will never take " + e.cfg.Lock.Describe() + " (run it with the new election)"
		e.log.Warn("not campaigning: "+why, "moved_to", to)
		e.setIneligible(why)
	default:
		e.log.Info("the lock is in use again: campaigning", "was_moved_to", was)
		e.setIneligible("")
	}
	return to
}

// setIneligibleCheck is setIneligible for a failed Eligible check, which
// clearFailedCheck may clear.
func (e *Elector) setIneligibleCheck(why string) {
	e.mu.Lock()
	e.status.Ineligible, e.checkWhy = why, why
	e.mu.Unlock()
}

// failedCheck tells whether the status's Ineligible is a failed Eligible
// check (not, say, a retired election).
func (e *Elector) failedCheck() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.checkWhy != "" && e.status.Ineligible == e.checkWhy
}

// clearFailedCheck clears the status's Ineligible if it is still the
// failed check's.
func (e *Elector) clearFailedCheck() {
	e.mu.Lock()
	if e.status.Ineligible == e.checkWhy {
		e.status.Ineligible = ""
	}
	e.checkWhy = ""
	e.mu.Unlock()
}

func (e *Elector) setIneligible(why string) {
	e.mu.Lock()
	e.status.Ineligible = why
	e.mu.Unlock()
}

// readBackoff doubles the pause after each failed read, from retry up to
// maxReadBackoff.
func readBackoff(retry time.Duration, failures int) time.Duration {
	d := retry
	for i := 1; i < failures && d < maxReadBackoff; i++ {
		d *= 2
	}
	return min(d, maxReadBackoff)
}

func nonce() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on Linux
	return hex.EncodeToString(b[:])
}

// sleep waits d or until ctx is done; it reports whether ctx is still live.

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
