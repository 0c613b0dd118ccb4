package lab

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Stand-in API server modes, switched by drills through the control socket.
const (
	ModeOK      = "ok"      // /readyz 200, everything served
	ModeUnready = "unready" // /readyz 503, other paths served (a draining kube-apiserver)
	ModeSlow    = "slow"    // every answer delayed by SlowDelay
	ModeDown    = "down"    // listener closed: connections refused
)

// SlowDelay is how long a slow stand-in takes to answer: far above vigil's
// health check timeout, far below a client's patience.
const SlowDelay = 3 * time.Second

// APIServerConfig configures the stand-in.
type APIServerConfig struct {
	Name     string
	Listen   string // NODEIP:6443
	CertFile string
	KeyFile  string
	// Control is the unix socket drills use: POST /mode?m=down.
	Control string
	// BulkListen, when set, serves the raw TCP protocol of the load
	// balancer benchmark (see serveBulk).
	BulkListen string
}

// ServeAPIServer runs the stand-in kube-apiserver of one lab node: HTTPS
// /readyz, /livez, /version (which names the node, so a client through
// the VIP sees which backend answered) and /watch (a stream of events
// naming the node) until ctx is cancelled.
func ServeAPIServer(ctx context.Context, cfg APIServerConfig, log *slog.Logger) error {
	cert, err := tls.LoadX509KeyPair(cfg.CertFile, cfg.KeyFile)
	if err != nil {
		return fmt.Errorf("apiserver: %w", err)
	}
	s := &standIn{cfg: cfg, log: log, mode: ModeOK, tls: &tls.Config{Certificates: []tls.Certificate{cert}}}
	if err := s.open(); err != nil {
		return err
	}
	_ = os.Remove(cfg.Control)
	ctl, err := net.Listen("unix", cfg.Control)
	if err != nil {
		return fmt.Errorf("apiserver: control socket: %w", err)
	}
	go func() { _ = http.Serve(ctl, http.HandlerFunc(s.control)) }()
	if cfg.BulkListen != "" {
		bl, err := net.Listen("tcp", cfg.BulkListen)
		if err != nil {
			return fmt.Errorf("apiserver: bulk listener: %w", err)
		}
		go serveBulk(bl, cfg.Name)
	}
	<-ctx.Done()
	ctl.Close()
	s.close()
	return nil
}

type standIn struct {
	cfg APIServerConfig
	log *slog.Logger
	tls *tls.Config

	mu   sync.Mutex // guards mode and srv
	mode string
	srv  *http.Server
}

func (s *standIn) currentMode() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mode
}

// open starts the HTTPS listener (mode ok, unready, slow).
func (s *standIn) open() error {
	ln, err := net.Listen("tcp", s.cfg.Listen)
	if err != nil {
		return fmt.Errorf("apiserver: %w", err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(s.serve), ReadHeaderTimeout: 10 * time.Second, TLSConfig: s.tls,
		ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelDebug)}
	s.srv = srv
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	return nil
}

// close stops the listener and resets every connection, like a killed
// process.
func (s *standIn) close() {
	if s.srv != nil {
		s.srv.Close()
		s.srv = nil
	}
}

func (s *standIn) serve(w http.ResponseWriter, r *http.Request) {
	mode := s.currentMode()
	if mode == ModeSlow {
		select {
		case <-time.After(SlowDelay):
		case <-r.Context().Done():
			return
		}
	}
	switch r.URL.Path {
	case "/readyz":
		if mode == ModeUnready {
			http.Error(w, "[-]shutdown failed: process is shutting down", http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ok")
	case "/livez":
		_, _ = io.WriteString(w, "ok")
	case "/version":
		w.Header().Set("Content-Type", "application/json")
		// via: who connected, the balancer's node behind a VIP.
		via, _, _ := net.SplitHostPort(r.RemoteAddr)
		fmt.Fprintf(w, "{\"gitVersion\":\"v0.0.0-vigil-lab\",\"node\":%q,\"via\":%q}\n", s.cfg.Name, via)
	case "/watch":
		s.watch(w, r)
	default:
		http.NotFound(w, r)
	}
}

// WatchTick is how often the stand-in's /watch stream sends an event.
const WatchTick = 100 * time.Millisecond

// watch streams one JSON line every WatchTick (or ?every=DURATION, at
// least WatchTick), naming this node, until the client goes: a long-lived
// response like a kube-apiserver watch, whose connection through the VIP
// the watch drills follow. The first line is sent at once.
func (s *standIn) watch(w http.ResponseWriter, r *http.Request) {
	fl, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	every := WatchTick
	if v := r.URL.Query().Get("every"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < WatchTick {
			http.Error(w, fmt.Sprintf("every=%q: want a duration of at least %v", v, WatchTick), http.StatusBadRequest)
			return
		}
		every = d
	}
	w.Header().Set("Content-Type", "application/json")
	t := time.NewTicker(every)
	defer t.Stop()
	for seq := 0; ; seq++ {
		if _, err := fmt.Fprintf(w, "{\"node\":%q,\"seq\":%d}\n", s.cfg.Name, seq); err != nil {
			return
		}
		fl.Flush()
		select {
		case <-r.Context().Done():
			return
		case <-t.C:
		}
	}
}

// control switches the mode: POST /mode?m=MODE.
func (s *standIn) control(w http.ResponseWriter, r *http.Request) {
	m := r.URL.Query().Get("m")
	switch m {
	case ModeOK, ModeUnready, ModeSlow, ModeDown:
	default:
		http.Error(w, "unknown mode "+strconv.Quote(m), http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	prev := s.mode
	s.mode = m
	var err error
	switch {
	case m == ModeDown && prev != ModeDown:
		s.close()
	case m != ModeDown && prev == ModeDown:
		err = s.open()
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	s.log.Info("mode", "from", prev, "to", m)
	_, _ = io.WriteString(w, m+"\n")
}

// SetAPIServerMode switches a node's stand-in API server.
func (l *Lab) SetAPIServerMode(ctx context.Context, node, mode string) error {
	n, err := l.node(node)
	if err != nil {
		return err
	}
	c := unixClient(l.apiControl(n))
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://apiserver/mode?m="+mode, nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return fmt.Errorf("lab: set %s's API server to %s: %w", node, mode, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("lab: set %s's API server to %s: %s", node, mode, strings.TrimSpace(string(body)))
	}
	return nil
}

// serveBulk is the benchmark's backend: each connection sends lines,
// "name" (answered with the node name), "get N" (answered with N bytes) or
// "echo" (from then on everything is echoed).
func serveBulk(ln net.Listener, name string) {
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		go func() {
			defer c.Close()
			r := bufio.NewReader(c)
			for {
				line, err := r.ReadString('\n')
				if err != nil {
					return
				}
				cmd, arg, _ := strings.Cut(strings.TrimSpace(line), " ")
				switch cmd {
				case "name":
					if _, err := io.WriteString(c, name+"\n"); err != nil {
						return
					}
				case "get":
					n, _ := strconv.ParseInt(arg, 10, 64)
					if err := sendZeros(c, n); err != nil {
						return
					}
				case "echo":
					_, _ = io.Copy(c, r)
					return
				default:
					return
				}
			}
		}()
	}
}

// zeroFile is a file of zeroBytes zero bytes in memory, which sendZeros
// sends from with sendfile(2): a benchmark's bulk source should cost as
// little as it can, so that what it measures is the balancer between.
var zeroFile = sync.OnceValues(func() (*os.File, error) {
	fd, err := unix.MemfdCreate("vigil-lab-zeros", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, os.NewSyscallError("memfd_create", err)
	}
	f := os.NewFile(uintptr(fd), "vigil-lab-zeros")
	if err := f.Truncate(zeroBytes); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
})

const zeroBytes = 4 << 20

// sendZeros writes n zero bytes to c: with sendfile(2) from zeroFile, at
// an explicit offset so that every connection shares the file, or through
// a buffer where there is no such file.
func sendZeros(c net.Conn, n int64) error {
	f, ferr := zeroFile()
	tc, ok := c.(*net.TCPConn)
	if ferr != nil || !ok {
		_, err := io.CopyN(c, zeros{}, n)
		return err
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	for n > 0 && serr == nil {
		err := raw.Write(func(fd uintptr) bool {
			off := int64(0)
			w, e := unix.Sendfile(int(fd), int(f.Fd()), &off, int(min(n, zeroBytes)))
			switch {
			case e == unix.EAGAIN:
				return false // wait until writable
			case e == unix.EINTR:
				return true
			case e != nil:
				serr = os.NewSyscallError("sendfile", e)
			case w == 0:
				serr = io.ErrShortWrite
			}
			n -= int64(max(w, 0))
			return true
		})
		if err != nil {
			return err
		}
	}
	return serr
}

// zeros reads as endless zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}
