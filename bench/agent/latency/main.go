// Command latency measures what vigil agent adds to an API request: the
// same HTTPS GET against a stand-in API server on loopback, directly and
// through an agent (in-process, real listener and health checks), with a
// new TCP and TLS connection per request (a client starting up) and over a
// kept-alive connection (kubelet, kube-proxy). It prints p50 and p99 of
// each, and what the agent adds.
//
//	go run ./bench/agent/latency -n 3000
package main

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"time"

	"github.com/vigil-ha/vigil/internal/agent"
)

func main() {
	n := flag.Int("n", 3000, "requests per case")
	flag.Parse()
	if err := run(*n); err != nil {
		fmt.Fprintln(os.Stderr, "latency:", err)
		os.Exit(1)
	}
}

func run(n int) error {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, `{"major":"1","minor":"37"}`)
	}))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.StartTLS()
	defer srv.Close()
	backend := srv.Listener.Addr().String()

	a, err := agent.New(agent.Config{
		Server:          "https://" + backend,
		APIServerListen: "127.0.0.1:0",
		APITLS:          &tls.Config{InsecureSkipVerify: true},
		HealthPath:      "/version",
	}, slog.New(slog.DiscardHandler))
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() { cancel(); <-done }()
	via := a.APIServerAddr().String()
	// The first request waits for the first check; not part of the
	// measurement.
	if _, err := get(newClient(true), via); err != nil {
		return err
	}

	fmt.Printf("%-46s %10s %10s\n", "case", "p50 µs", "p99 µs")
	for _, c := range []struct {
		name      string
		keepAlive bool
	}{{"new connection per request", false}, {"kept-alive connection", true}} {
		var p [2][2]float64
		for i, target := range []string{backend, via} {
			lat, err := measure(newClient(c.keepAlive), target, n)
			if err != nil {
				return err
			}
			p[i][0], p[i][1] = percentile(lat, 0.50), percentile(lat, 0.99)
			who := "direct"
			if i == 1 {
				who = "through the agent"
			}
			fmt.Printf("%-46s %10.0f %10.0f\n", c.name+", "+who, p[i][0], p[i][1])
		}
		fmt.Printf("%-46s %10.0f %10.0f\n", c.name+", added", p[1][0]-p[0][0], p[1][1]-p[0][1])
	}
	return nil
}

func newClient(keepAlive bool) *http.Client {
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: true},
		DisableKeepAlives: !keepAlive,
		DialContext:       (&net.Dialer{}).DialContext,
	}}
}

func get(c *http.Client, addr string) (time.Duration, error) {
	start := time.Now()
	resp, err := c.Get("https://" + addr + "/version")
	if err != nil {
		return 0, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return time.Since(start), err
}

func measure(c *http.Client, addr string, n int) ([]time.Duration, error) {
	for range 50 { // warm up
		if _, err := get(c, addr); err != nil {
			return nil, err
		}
	}
	lat := make([]time.Duration, 0, n)
	for range n {
		d, err := get(c, addr)
		if err != nil {
			return nil, err
		}
		lat = append(lat, d)
	}
	return lat, nil
}

func percentile(lat []time.Duration, q float64) float64 {
	s := slices.Clone(lat)
	slices.Sort(s)
	return float64(s[int(q*float64(len(s)-1))].Microseconds())
}
