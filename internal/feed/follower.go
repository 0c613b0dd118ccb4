package feed

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"time"
)

// FollowerConfig configures a Follower.
type FollowerConfig struct {
	// Endpoints returns the feeds to try, host:port each, the preferred
	// first (the agent: the VIP, then every control-plane node it knows).
	// It is called before each round of attempts, so it follows
	// membership.
	Endpoints func() []string
	// Stale is how long a feed may say nothing before the follower gives up
	// on it (DefaultStale when 0).
	Stale time.Duration
	// MaxBackoff bounds the wait after a round in which no feed answered
	// (30 s when 0). The wait starts at one Stale, doubles, and is jittered,
	// so that a fleet whose feeds all went away does not come back in step.
	MaxBackoff time.Duration
	// OnView gets each view read, from the goroutine of Run.
	OnView func(View)
	// OnFresh gets each change of Fresh, true first once a view was read.
	// It may be called from a timer's goroutine; calls do not overlap.
	OnFresh func(fresh bool)
	// Dial, when set, replaces the TCP dialer (tests).
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

// Follower reads one feed at a time, and moves on when it goes quiet.
type Follower struct {
	cfg    FollowerConfig
	log    *slog.Logger
	client *http.Client

	mu     sync.Mutex // guards the fields below; freshMu orders OnFresh calls
	fresh  bool
	source string    // host:port of the feed read last
	last   time.Time // when its last line arrived
	view   View
	read   bool        // a view was read
	timer  *time.Timer // fires Stale after the last line

	freshMu sync.Mutex
}

// NewFollower returns a follower; Run follows.
func NewFollower(cfg FollowerConfig, log *slog.Logger) *Follower {
	if cfg.Stale == 0 {
		cfg.Stale = DefaultStale
	}
	if cfg.MaxBackoff == 0 {
		cfg.MaxBackoff = 30 * time.Second
	}
	dial := cfg.Dial
	if dial == nil {
		dial = (&net.Dialer{Timeout: cfg.Stale, KeepAlive: -1}).DialContext
	}
	f := &Follower{cfg: cfg, log: log}
	f.client = &http.Client{Transport: &http.Transport{
		DialContext:           dial,
		Proxy:                 nil, // never through a proxy from the environment
		ResponseHeaderTimeout: cfg.Stale,
		DisableKeepAlives:     true, // a stream ends with its connection
		DisableCompression:    true,
	}}
	return f
}

// State reports whether the feed is fresh, the last view read, and where it
// came from.
func (f *Follower) State() (fresh bool, v View, source string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.fresh, f.view, f.source
}

// LastView is the last view read, fresh or not; ok is false before the
// first.
func (f *Follower) LastView() (v View, ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.view, f.read
}

// Run follows the feeds until ctx ends.
func (f *Follower) Run(ctx context.Context) error {
	defer f.setFresh(false, "")
	backoff := f.cfg.Stale
	next := 0 // where the next round starts: after the feed that failed
	for ctx.Err() == nil {
		eps := f.cfg.Endpoints()
		served := false
		for i := range eps {
			ep := eps[(next+i)%len(eps)]
			err := f.follow(ctx, ep)
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, errServed) {
				served = true
				next = (next + i + 1) % len(eps)
				break // the next round tries the feed that ended last
			}
			f.log.Debug("cannot read an agent feed", "feed", ep, "err", err)
		}
		if served {
			backoff = f.cfg.Stale
			continue
		}
		// No feed answered: wait, jittered (a fleet must not retry in step).
		wait := backoff/2 + rand.N(backoff/2+1)
		backoff = min(2*backoff, f.cfg.MaxBackoff)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
	return nil
}

// errServed: the feed gave at least one view before it ended.
var errServed = errors.New("feed ended after serving")

// follow reads one feed until it ends or goes quiet.
func (f *Follower) follow(ctx context.Context, ep string) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+ep+Path, nil)
	if err != nil {
		return err
	}
	req.Header.Set("User-Agent", "vigil-agent")
	resp, err := f.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	// A line must come within Stale, or the stream is dropped.
	quiet := time.AfterFunc(f.cfg.Stale, cancel)
	defer quiet.Stop()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	served := false
	var seq uint64
	for sc.Scan() {
		quiet.Reset(f.cfg.Stale)
		var l line
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			return fmt.Errorf("bad line: %w", err)
		}
		switch {
		case l.View != nil:
			served, seq = true, l.Seq
			f.gotView(ep, *l.View)
		case !served:
			return errors.New("a heartbeat before any view")
		case l.Seq != seq:
			// A heartbeat of a view this stream never sent: it was lost.
			return fmt.Errorf("heartbeat of view %d, last view read %d", l.Seq, seq)
		default:
			f.gotBeat(ep)
		}
	}
	if served {
		f.log.Debug("agent feed ended", "feed", ep, "err", sc.Err())
		return errServed
	}
	if err := sc.Err(); err != nil {
		return err
	}
	return errors.New("the feed ended before its first view")
}

func (f *Follower) gotView(ep string, v View) {
	f.mu.Lock()
	f.view, f.read = v, true
	f.mu.Unlock()
	if f.cfg.OnView != nil {
		f.cfg.OnView(v)
	}
	f.gotBeat(ep)
}

// gotBeat notes a line: the feed is fresh until Stale from now.
func (f *Follower) gotBeat(ep string) {
	f.mu.Lock()
	f.last = time.Now()
	if f.timer == nil {
		f.timer = time.AfterFunc(f.cfg.Stale, f.expire)
	} else {
		f.timer.Reset(f.cfg.Stale)
	}
	was := f.fresh && f.source == ep
	f.mu.Unlock()
	if !was {
		f.setFresh(true, ep)
	}
}

// expire runs when no line came for Stale.
func (f *Follower) expire() {
	f.mu.Lock()
	quiet := time.Since(f.last) >= f.cfg.Stale
	f.mu.Unlock()
	if quiet {
		f.setFresh(false, "")
	}
}

func (f *Follower) setFresh(fresh bool, ep string) {
	f.freshMu.Lock()
	defer f.freshMu.Unlock()
	f.mu.Lock()
	if !fresh && f.timer != nil {
		f.timer.Stop()
	}
	changed := f.fresh != fresh
	moved := fresh && f.source != ep
	f.fresh = fresh
	if fresh {
		f.source = ep
	}
	f.mu.Unlock()
	if moved {
		f.log.Info("reading the agent feed", "feed", ep)
	}
	if changed {
		if !fresh {
			f.log.Warn("no agent feed is fresh: checking every backend from this host until one is")
		}
		if f.cfg.OnFresh != nil {
			f.cfg.OnFresh(fresh)
		}
	}
}
