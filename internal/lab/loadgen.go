package lab

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vigil-ha/vigil/internal/clock"
)

// Load generator modes, run by `vigil-lab loadgen` inside the client
// namespace against a bench backend (serveBulk) directly or through a load
// balancer.
const (
	LoadRTT        = "rtt"        // one connection, sequential "name" round trips
	LoadConnect    = "connect"    // sequential new connections: connect, one round trip, close
	LoadConns      = "conns"      // Workers loops of LoadConnect for Duration: connections per second
	LoadThroughput = "throughput" // Workers connections each reading "get" bytes for Duration
	// LoadFlood: Workers loops open Samples connections in all from
	// Source, each sending a few bytes and then nothing; those the target
	// keeps open are held for Duration after the last attempt, those it
	// resets are counted and closed.
	LoadFlood = "flood"
)

// floodCheck is how long a flood connection waits to see whether the
// target reset it: a balancer at a limit resets at once.
const floodCheck = 20 * time.Millisecond

// LoadConfig configures one load generator run.
type LoadConfig struct {
	Mode     string
	Target   string // host:port
	Duration time.Duration
	Samples  int
	Workers  int
	// Source is the local address to connect from (flood; empty: any).
	Source string
}

// LoadResult is what a run measured.
type LoadResult struct {
	Mode   string  `json:"mode"`
	Target string  `json:"target"`
	Count  int     `json:"count"`
	Errors int     `json:"errors"`
	P50us  float64 `json:"p50us,omitempty"`
	P99us  float64 `json:"p99us,omitempty"`
	// PerSecond is connections per second (conns, flood) or MiB per
	// second (throughput).
	PerSecond float64 `json:"perSecond,omitempty"`
	// Held and Refused (flood): connections the target kept open, and
	// reset.
	Held    int `json:"held,omitempty"`
	Refused int `json:"refused,omitempty"`
}

// RunLoad runs one measurement.
func RunLoad(ctx context.Context, cfg LoadConfig) (LoadResult, error) {
	r := LoadResult{Mode: cfg.Mode, Target: cfg.Target}
	switch cfg.Mode {
	case LoadRTT:
		c, err := net.DialTimeout("tcp", cfg.Target, 2*time.Second)
		if err != nil {
			return r, err
		}
		defer c.Close()
		br := bufio.NewReader(c)
		var lat []time.Duration
		for range cfg.Samples {
			start := time.Now()
			if _, err := io.WriteString(c, "name\n"); err != nil {
				return r, err
			}
			if _, err := br.ReadString('\n'); err != nil {
				return r, err
			}
			lat = append(lat, time.Since(start))
		}
		r.Count = len(lat)
		r.P50us, r.P99us = percentiles(lat)
	case LoadConnect:
		// With a Duration, it samples for that long instead.
		var lat []time.Duration
		end := time.Now().Add(cfg.Duration)
		for i := 0; cfg.Duration > 0 && time.Now().Before(end) || cfg.Duration <= 0 && i < cfg.Samples; i++ {
			start := time.Now()
			if err := connectOnce(cfg.Target); err != nil {
				r.Errors++
				continue
			}
			lat = append(lat, time.Since(start))
		}
		r.Count = len(lat)
		r.P50us, r.P99us = percentiles(lat)
	case LoadConns:
		var mu sync.Mutex
		var wg sync.WaitGroup
		deadline := time.Now().Add(cfg.Duration)
		for range cfg.Workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				n, errs := 0, 0
				for time.Now().Before(deadline) && ctx.Err() == nil {
					if connectOnce(cfg.Target) != nil {
						errs++
						continue
					}
					n++
				}
				mu.Lock()
				r.Count += n
				r.Errors += errs
				mu.Unlock()
			}()
		}
		wg.Wait()
		r.PerSecond = float64(r.Count) / cfg.Duration.Seconds()
	case LoadThroughput:
		var mu sync.Mutex
		var wg sync.WaitGroup
		var total int64
		for range cfg.Workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				n, err := bulkRead(cfg.Target, cfg.Duration)
				mu.Lock()
				total += n
				if err != nil {
					r.Errors++
				}
				mu.Unlock()
			}()
		}
		wg.Wait()
		r.Count = cfg.Workers
		r.PerSecond = float64(total) / (1 << 20) / cfg.Duration.Seconds()
	case LoadFlood:
		return flood(ctx, cfg)
	default:
		return r, fmt.Errorf("unknown load mode %q", cfg.Mode)
	}
	return r, nil
}

// flood runs LoadFlood.
func flood(ctx context.Context, cfg LoadConfig) (LoadResult, error) {
	r := LoadResult{Mode: cfg.Mode, Target: cfg.Target}
	// One dialer per source address; attempts take them in turn.
	var dialers []*net.Dialer
	if cfg.Source == "" {
		dialers = append(dialers, &net.Dialer{Timeout: 2 * time.Second})
	}
	for _, src := range strings.Split(cfg.Source, ",") {
		if src == "" {
			continue
		}
		a, err := netip.ParseAddr(src)
		if err != nil {
			return r, fmt.Errorf("--source %q: %w", cfg.Source, err)
		}
		dialers = append(dialers, &net.Dialer{Timeout: 2 * time.Second, LocalAddr: &net.TCPAddr{IP: a.AsSlice()}})
	}
	if len(dialers) == 0 {
		return r, fmt.Errorf("--source %q: no address", cfg.Source)
	}
	var attempt atomic.Uint64
	var mu sync.Mutex
	var held []net.Conn
	var wg sync.WaitGroup
	next := make(chan struct{}, cfg.Workers)
	start := time.Now()
	go func() {
		defer close(next)
		for range cfg.Samples {
			select {
			case next <- struct{}{}:
			case <-ctx.Done():
				return
			}
		}
	}()
	for range cfg.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 1)
			for range next {
				d := dialers[attempt.Add(1)%uint64(len(dialers))]
				c, err := d.DialContext(ctx, "tcp", cfg.Target)
				if err != nil {
					mu.Lock()
					r.Errors++
					mu.Unlock()
					continue
				}
				_, err = io.WriteString(c, "n") // no newline: the backend waits
				if err == nil {
					_ = c.SetReadDeadline(time.Now().Add(floodCheck))
					_, err = c.Read(buf)
					if ne, ok := err.(net.Error); ok && ne.Timeout() {
						err = nil
					}
				}
				mu.Lock()
				if err != nil {
					r.Refused++
					c.Close()
				} else {
					held = append(held, c)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	r.Count = r.Refused + len(held) + r.Errors
	r.PerSecond = float64(r.Count) / time.Since(start).Seconds()
	clock.Sleep(ctx, cfg.Duration)
	// What is still open now was held the whole time.
	for _, c := range held {
		_ = c.SetReadDeadline(time.Now().Add(time.Millisecond))
		_, err := c.Read(make([]byte, 1))
		if ne, ok := err.(net.Error); err == nil || ok && ne.Timeout() {
			r.Held++
		} else {
			r.Refused++
		}
		c.Close()
	}
	return r, nil
}

// connectOnce opens a connection, does one round trip and closes it.
func connectOnce(target string) error {
	c, err := net.DialTimeout("tcp", target, 2*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.WriteString(c, "name\n"); err != nil {
		return err
	}
	_, err = bufio.NewReader(c).ReadString('\n')
	return err
}

// bulkRead asks for an endless stream and counts what arrives in d. The
// bytes are spliced to /dev/null (io.Copy to an *os.File splices from a
// TCP connection), never copied into the process: the load generator shares
// the machine's cores with the balancer it measures, so it should cost as
// little as it can.
func bulkRead(target string, d time.Duration) (int64, error) {
	c, err := net.DialTimeout("tcp", target, 2*time.Second)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	if _, err := io.WriteString(c, "get "+strconv.FormatInt(1<<50, 10)+"\n"); err != nil {
		return 0, err
	}
	_ = c.SetReadDeadline(time.Now().Add(d))
	null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		return 0, err
	}
	defer null.Close()
	n, err := io.Copy(null, c)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		err = nil
	}
	return n, err
}

func percentiles(lat []time.Duration) (p50, p99 float64) {
	if len(lat) == 0 {
		return 0, 0
	}
	slices.Sort(lat)
	at := func(q float64) float64 {
		return float64(lat[min(len(lat)-1, int(q*float64(len(lat))))].Nanoseconds()) / 1000
	}
	return at(0.50), at(0.99)
}
