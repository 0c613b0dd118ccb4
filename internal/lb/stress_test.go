package lb

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vigil-ha/vigil/internal/health"
	"github.com/vigil-ha/vigil/internal/testkit"
)

// TestStress runs many clients at once through the balancer, each a
// random mix of what API clients and broken clients do: short exchanges,
// half-closes, bulk transfers both ways, readers that fall behind, resets
// in mid-stream. First with nothing else going on: every exchange must
// succeed with every byte intact. Then with faults at random times:
// backends marked dead and up again, and the balancer told it no longer
// serves the VIP and serves it again. Exchanges may fail then, but a client
// may never read a byte it did not send. At the end the balancer must hold
// nothing: no client, no connection, no backend slot. It runs on both data
// paths (see TestMain). VIGIL_LB_STRESS_SEED repeats a run.
func TestStress(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("VIGIL_LB_STRESS_SEED"); v != "" {
		var err error
		if seed, err = strconv.ParseUint(v, 10, 64); err != nil {
			t.Fatalf("VIGIL_LB_STRESS_SEED=%q", v)
		}
	}
	t.Logf("seed %d (VIGIL_LB_STRESS_SEED)", seed)
	bes := []*tcpBackend{newBackend(t, "a", false), newBackend(t, "b", false), newBackend(t, "c", false)}
	b, _ := startLB(t, Config{MaxConns: -1, MaxConnsPerSource: -1, HalfCloseTimeout: 5 * time.Second}, bes...)

	run := func(name string, chaos bool, workers, each int) {
		t.Run(name, func(t *testing.T) {
			var wg sync.WaitGroup
			var failed, corrupt atomic.Int64
			var firstErr atomic.Value
			stop := make(chan struct{})
			var chaosWG sync.WaitGroup
			if chaos {
				chaosWG.Go(func() { faults(b, bes, rand.New(rand.NewPCG(seed, 999)), stop) })
			}
			for w := range workers {
				wg.Go(func() {
					rng := rand.New(rand.NewPCG(seed, uint64(w)))
					for range each {
						err := exchange(b.Addr().String(), rng)
						if err == nil {
							continue
						}
						if errors.Is(err, errCorrupt) {
							corrupt.Add(1)
						}
						failed.Add(1)
						firstErr.CompareAndSwap(nil, err.Error())
					}
				})
			}
			wg.Wait()
			close(stop)
			chaosWG.Wait()
			if corrupt.Load() > 0 {
				t.Fatalf("%d exchanges read bytes that were not sent (first error: %v)", corrupt.Load(), firstErr.Load())
			}
			if !chaos && failed.Load() > 0 {
				t.Fatalf("%d of %d exchanges failed without any fault (first: %v)", failed.Load(), workers*each, firstErr.Load())
			}
			t.Logf("%d of %d exchanges failed", failed.Load(), workers*each)
			// Everything must be released.
			testkit.WaitNil(t, 10*time.Second, "every client closed and nothing held", func() error {
				b.mu.Lock()
				clients, sources := len(b.clients), len(b.sources)
				active, conns := 0, 0
				for _, be := range b.pool.m {
					active += be.active
					conns += len(be.conns)
				}
				b.mu.Unlock()
				if clients != 0 || sources != 0 || active != 0 || conns != 0 {
					return fmt.Errorf("%d clients, %d sources, %d backend slots, %d connections still held", clients, sources, active, conns)
				}
				return nil
			})
		})
	}
	run("clean", false, 48, 20)
	run("faults", true, 48, 20)
	run("clean after faults", false, 16, 10)
}

var errCorrupt = errors.New("read bytes that were not sent")

// exchange is one client's connection: greeted by a backend, then one of
// the behaviours at random; the backend echoes.
func exchange(addr string, rng *rand.Rand) error {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.WriteString(c, "hi\n"); err != nil {
		return err
	}
	var greet [2]byte
	if _, err := io.ReadFull(c, greet[:]); err != nil {
		return err
	}
	if greet[1] != '\n' || greet[0] < 'a' || greet[0] > 'c' {
		return errCorrupt
	}
	payload := make([]byte, 1+rng.IntN(4<<10))
	switch rng.IntN(6) {
	case 0: // a few small exchanges, then close
		for range 1 + rng.IntN(5) {
			if err := echo(c, payload); err != nil {
				return err
			}
		}
		return nil
	case 1: // send, half-close, read the echo to the end
		payload = make([]byte, rng.IntN(64<<10))
		fill(payload, rng)
		go func() {
			_, _ = c.Write(payload)
			_ = c.(*net.TCPConn).CloseWrite()
		}()
		got, err := io.ReadAll(c)
		if !bytes.HasPrefix(payload, got) {
			return errCorrupt
		}
		if err != nil {
			return err
		}
		if len(got) != len(payload) {
			return io.ErrUnexpectedEOF
		}
		return nil
	case 2: // bulk both ways
		payload = make([]byte, 256<<10+rng.IntN(768<<10))
		fill(payload, rng)
		go func() { _, _ = c.Write(payload) }()
		return readBack(c, payload)
	case 3: // a reader that falls behind
		payload = make([]byte, 128<<10+rng.IntN(256<<10))
		fill(payload, rng)
		go func() {
			for off := 0; off < len(payload); off += 700 {
				if _, err := c.Write(payload[off:min(off+700, len(payload))]); err != nil {
					return
				}
			}
		}()
		time.Sleep(time.Duration(rng.IntN(50)) * time.Millisecond)
		return readBack(c, payload)
	case 4: // reset in mid-stream
		fill(payload, rng)
		_, _ = c.Write(payload)
		_ = c.(*net.TCPConn).SetLinger(0)
		return nil
	default: // close without a word after the greeting
		return nil
	}
}

func fill(b []byte, rng *rand.Rand) {
	for i := 0; i < len(b); i += 8 {
		v := rng.Uint64()
		for j := i; j < min(i+8, len(b)); j++ {
			b[j] = byte(v)
			v >>= 8
		}
	}
}

func echo(c net.Conn, payload []byte) error {
	if _, err := c.Write(payload); err != nil {
		return err
	}
	return readBack(c, payload)
}

// readBack reads len(want) bytes and checks them against want.
func readBack(c net.Conn, want []byte) error {
	got := make([]byte, len(want))
	n, err := io.ReadFull(c, got)
	if !bytes.Equal(got[:n], want[:n]) {
		return errCorrupt
	}
	return err
}

// faults marks backends dead and up again, and turns serving off and on,
// at random moments until stop.
func faults(b *Balancer, bes []*tcpBackend, rng *rand.Rand, stop chan struct{}) {
	for {
		select {
		case <-stop:
			for _, be := range bes {
				b.Update(health.Status{Backend: be.addr(), State: health.Up})
			}
			b.SetServing(true)
			return
		case <-time.After(time.Duration(5+rng.IntN(40)) * time.Millisecond):
		}
		be := bes[rng.IntN(len(bes))].addr()
		switch rng.IntN(4) {
		case 0:
			b.Update(health.Status{Backend: be, State: health.Down, Cause: health.Dead})
		case 1:
			b.Update(health.Status{Backend: be, State: health.Down, Cause: health.Unreachable, FailingSince: time.Now()})
		case 2:
			b.SetServing(false)
			time.Sleep(time.Duration(rng.IntN(10)) * time.Millisecond)
			b.SetServing(true)
		}
		time.Sleep(time.Duration(rng.IntN(20)) * time.Millisecond)
		b.Update(health.Status{Backend: be, State: health.Up})
	}
}
