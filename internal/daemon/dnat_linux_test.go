//go:build linux

package daemon

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vigil-ha/vigil/internal/dnat"
	"github.com/vigil-ha/vigil/internal/kubetest"
	"github.com/vigil-ha/vigil/internal/netns"
	"github.com/vigil-ha/vigil/internal/nstest"
	"github.com/vigil-ha/vigil/internal/testkit"
)

// The API server keeps kubeadm's default bind address, 0.0.0.0:6443, and
// vigil runs with --lb-port 6443 --lb-listen-port 16443: a client on B
// that asks VIP:6443 goes through the balancer (the API server sees the
// balancer's address, not B's), vigil status shows the rule, and when
// vigil stops the rule goes with the VIP.
func TestLBListenPortWithAPIServerOnAllAddresses(t *testing.T) {
	p := nstest.NewPair(t)
	startEtcdIn(t, p.A)
	ca, cert, key := kubetest.ServingCert(t, testVIP, "192.0.2.1", "127.0.0.1")
	// The stand-in API server: /readyz for the health checks, /who says
	// who connected.
	pair, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		t.Fatal(err)
	}
	var ln net.Listener
	if err := netns.Do(p.A, func() (err error) { ln, err = net.Listen("tcp", "0.0.0.0:6443"); return err }); err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/who" {
			host, _, _ := net.SplitHostPort(r.RemoteAddr)
			fmt.Fprintln(w, host)
			return
		}
		fmt.Fprintln(w, "ok")
	}), TLSConfig: &tls.Config{Certificates: []tls.Certificate{pair}}}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	t.Cleanup(func() { srv.Close() })

	vigil := startIn(t, p.A, "vigil.log", nstest.Binary(t, "vigil"), "run", "--vip", testVIP+"/24", "--interface", "a0",
		"--node-name", "n1", "--etcd-endpoints", "http://127.0.0.1:2379",
		"--lb-port", "6443", "--lb-listen-port", "16443", "--backend-port", "6443", "--health-ca", ca)
	testkit.WaitFor(t, 20*time.Second, "the VIP on a0", func() bool { return hasVIP(t, p.A) })
	testkit.WaitFor(t, 20*time.Second, "the API server up as a backend", func() bool {
		for _, b := range statusOK(nstest.Binary(t, "vigil"), p.A).Backends {
			if b.State == "up" {
				return true
			}
		}
		return false
	})

	who := whoThroughVIP(t, p.B, ca, "")
	got, err := who()
	if err != nil {
		t.Fatal(err)
	}
	// The balancer dials the backend the etcd member list gives,
	// 127.0.0.1:6443; straight from B it would be 192.0.2.2.
	if got != "127.0.0.1" {
		t.Fatalf("the API server saw VIP:6443's client as %s, want the balancer (127.0.0.1), not B", got)
	}
	if st := statusOK(nstest.Binary(t, "vigil"), p.A); len(st.DNAT) != 1 || st.DNAT[0] != testVIP+":6443 -> "+testVIP+":16443" {
		t.Fatalf("status DNAT = %q", st.DNAT)
	}

	// Stopped: the VIP and the rule go.
	if err := vigil.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 10*time.Second, "the VIP gone after SIGTERM", func() bool { return !hasVIP(t, p.A) })
	testkit.WaitFor(t, 10*time.Second, "the rule gone after SIGTERM", func() bool {
		var rules []dnat.Rule
		err := netns.Do(p.A, func() (err error) { rules, err = dnat.Installed(); return err })
		return err == nil && len(rules) == 0
	})
}

// whoThroughVIP returns a GET of https://VIP:6443/who from namespace ns,
// trusting ca and expecting serverName ("": the VIP) in the certificate,
// on a new connection each time; it answers with the body, trimmed.
func whoThroughVIP(t *testing.T, ns, ca, serverName string) func() (string, error) {
	t.Helper()
	pem, err := os.ReadFile(ca)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	dial := netns.Dialer(ns)
	tr := &http.Transport{
		DialContext:       func(ctx context.Context, _, addr string) (net.Conn, error) { return dial(ctx, addr) },
		TLSClientConfig:   &tls.Config{RootCAs: roots, ServerName: serverName},
		DisableKeepAlives: true,
	}
	t.Cleanup(tr.CloseIdleConnections)
	hc := &http.Client{Timeout: 5 * time.Second, Transport: tr}
	return func() (string, error) {
		resp, err := hc.Get("https://" + net.JoinHostPort(testVIP, "6443") + "/who")
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return strings.TrimSpace(string(b)), err
	}
}
