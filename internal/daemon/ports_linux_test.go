//go:build linux

package daemon

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/vigil-ha/vigil/internal/kubetest"
	"github.com/vigil-ha/vigil/internal/netns"
	"github.com/vigil-ha/vigil/internal/nstest"
	"github.com/vigil-ha/vigil/internal/testkit"
)

// Two load-balanced ports, as RKE2 needs them: 6443 (the API servers,
// HTTPS /readyz) and 9345 (a TCP service), on two backend hosts. Both are
// served on the VIP; one host's 9345 dies and only that port ejects it,
// without a client failing; the metrics are labelled by port; the holder
// is killed and both ports come back on the new holder.
func TestTwoPortsEachServedCheckedAndFailedOver(t *testing.T) {
	p := nstest.NewPair(t)
	startEtcdOn(t, p.A, "192.0.2.1")
	nstest.IP(t, "-n", p.A, "addr", "add", "192.0.2.11/24", "dev", "a0")
	hosts := []string{"192.0.2.1", "192.0.2.11"}
	ca, cert, key := kubetest.ServingCert(t, hosts...)
	pair, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		t.Fatal(err)
	}
	listen := func(addr string) net.Listener {
		t.Helper()
		var ln net.Listener
		if err := netns.Do(p.A, func() (err error) { ln, err = net.Listen("tcp", addr); return err }); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ln.Close() })
		return ln
	}
	banner := map[string]net.Listener{}
	for _, h := range hosts {
		// 6443: /readyz for the checks, /who names the host.
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, h) }),
			TLSConfig: &tls.Config{Certificates: []tls.Certificate{pair}}}
		go func() { _ = srv.ServeTLS(listen(h+":6443"), "", "") }()
		t.Cleanup(func() { srv.Close() })
		// 9345: says which host it is, and no HTTP.
		ln := listen(h + ":9345")
		banner[h] = ln
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				fmt.Fprintln(c, h)
				_ = c.Close()
			}
		}()
	}

	vigil := nstest.Binary(t, "vigil")
	args := func(iface, node string) []string {
		return []string{"run", "--vip", testVIP + "/24", "--interface", iface, "--node-name", node,
			"--etcd-endpoints", "http://192.0.2.1:2379", "--discovery", "none", "--backend", "192.0.2.1:6443,192.0.2.11:6443",
			"--lb-port", "6443", "--lb-port", "9345", "--health-ca", ca, "--health-interval", "200ms"}
	}
	n1 := startIn(t, p.A, "vigil-n1.log", vigil, args("a0", "n1")...)
	testkit.WaitFor(t, 20*time.Second, "n1 to hold the VIP", func() bool { return hasVIP(t, p.A) })
	startIn(t, p.B, "vigil-n2.log", vigil, args("b0", "n2")...)
	waitLive(t, p.A, "n2")

	// Every backend of both ports up on the holder.
	allUp := func(ns string) func() bool {
		return func() bool {
			r, err := statusIn(ns)
			if err != nil || len(r.Backends) != 2 || len(r.Ports) != 1 || len(r.Ports[0].Backends) != 2 {
				return false
			}
			for _, b := range append(r.Backends, r.Ports[0].Backends...) {
				if b.State != "up" {
					return false
				}
			}
			return true
		}
	}
	testkit.WaitFor(t, 20*time.Second, "both ports' backends up on n1", allUp(p.A))
	r, _ := statusIn(p.A)
	if pr := r.Ports[0]; pr.Port != 9345 || pr.BackendPort != 9345 || pr.Check != CheckTCP {
		t.Fatalf("status ports = %+v, want 9345 to 9345 checked by tcp", r.Ports)
	}

	api := whoThroughVIP(t, p.B, ca, "192.0.2.1")
	dial := netns.Dialer(p.B)
	supervisor := func() (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		c, err := dial(ctx, net.JoinHostPort(testVIP, "9345"))
		if err != nil {
			return "", err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(3 * time.Second))
		line, err := bufio.NewReader(c).ReadString('\n')
		return strings.TrimSpace(line), err
	}
	bothServed := func(when string) {
		t.Helper()
		seen := map[string]bool{}
		for range 8 {
			a, err := api()
			if err != nil {
				t.Fatalf("%s: VIP:6443: %v", when, err)
			}
			s, err := supervisor()
			if err != nil {
				t.Fatalf("%s: VIP:9345: %v", when, err)
			}
			seen["6443 "+a], seen["9345 "+s] = true, true
		}
		t.Logf("%s: served by %v", when, seen)
	}
	bothServed("on n1")

	// 192.0.2.11's 9345 dies, its 6443 lives: clients of 9345 never see
	// the dead one (a refused dial goes to the other host and ejects it),
	// and 6443 keeps both.
	closed := time.Now()
	_ = banner["192.0.2.11"].Close()
	var ejected time.Duration
	for deadline := time.Now().Add(10 * time.Second); ejected == 0; {
		if time.Now().After(deadline) {
			t.Fatal("192.0.2.11:9345 not ejected within 10s of dying")
		}
		if got, err := supervisor(); err != nil || got != "192.0.2.1" {
			t.Fatalf("VIP:9345 after 192.0.2.11:9345 died: %q, %v", got, err)
		}
		if r, err := statusIn(p.A); err == nil && len(r.Ports) == 1 {
			for _, b := range r.Ports[0].Backends {
				if b.Address == "192.0.2.11:9345" && b.State == "down" {
					ejected = time.Since(closed)
				}
			}
		}
	}
	t.Logf("192.0.2.11:9345 ejected %v after it died, while clients connected", ejected)
	// Generous: the first connection sent to it ejects it (a few ms); a
	// second or more meant clients waited on it.
	if ejected > time.Second {
		t.Errorf("192.0.2.11:9345 ejected only %v after it died", ejected)
	}
	r, _ = statusIn(p.A)
	for _, b := range r.Backends {
		if b.State != "up" {
			t.Fatalf("port 6443's %s is %s: one port's failure ejected it from another", b.Address, b.State)
		}
	}
	_, metrics, err := getIn(p.A, "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`vigil_lb_backends_usable{port="6443"} 2`, `vigil_lb_backends_usable{port="9345"} 1`,
		`vigil_lb_backend_up{backend="192.0.2.11:9345",port="9345"} 0`, `vigil_health_checks_total{backend="192.0.2.1:9345",port="9345",result="ok"}`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %s", want)
		}
	}

	// The holder is killed: both ports come back on n2.
	_ = n1.Process.Kill()
	testkit.WaitFor(t, 20*time.Second, "n2 to hold the VIP", func() bool { return hasVIPOn(t, p.B, "b0") })
	testkit.WaitFor(t, 20*time.Second, "both ports answering on n2", func() bool {
		_, e1 := api()
		_, e2 := supervisor()
		return e1 == nil && e2 == nil
	})
	bothServed("on n2")
}

// statusIn reads vigil's /status in ns (the default metrics address).
func statusIn(ns string) (Report, error) {
	var r Report
	code, body, err := getIn(ns, "/status")
	if err != nil {
		return r, err
	}
	if code != http.StatusOK {
		return r, fmt.Errorf("/status: HTTP %d", code)
	}
	return r, json.Unmarshal([]byte(body), &r)
}
