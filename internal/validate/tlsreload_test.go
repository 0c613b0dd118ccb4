package validate

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// testCA issues certificates for the reload tests.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue returns a PEM certificate and key for name, a server certificate
// for 127.0.0.1 when server is set, else a client certificate.
func (ca *testCA) issue(t *testing.T, name string, server bool) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kd, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kd})
}

// TestTLSFilesReloaded: a renewed client certificate and key (kubeadm certs
// renew) are used from the next connection, without a new tls.Config; a
// file caught half-written keeps the last good pair in use; the server is
// still verified against the CA bundle.
func TestTLSFilesReloaded(t *testing.T) {
	dir := t.TempDir()
	caFile, certFile, keyFile := filepath.Join(dir, "ca.crt"), filepath.Join(dir, "client.crt"), filepath.Join(dir, "client.key")
	write := func(path string, b []byte) {
		t.Helper()
		// As kubeadm does: the same path, new contents.
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ca1, ca2 := newTestCA(t, "ca1"), newTestCA(t, "ca2")
	write(caFile, ca1.pem)
	c, k := ca1.issue(t, "client-a", false)
	write(certFile, c)
	write(keyFile, k)

	// A server that requires a client certificate and reports its name;
	// its own certificate can be swapped.
	var serverCert atomic.Pointer[tls.Certificate]
	setServer := func(ca *testCA) {
		c, k := ca.issue(t, "server", true)
		pair, err := tls.X509KeyPair(c, k)
		if err != nil {
			t.Fatal(err)
		}
		serverCert.Store(&pair)
	}
	setServer(ca1)
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{
		ClientAuth:     tls.RequireAnyClientCert,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return serverCert.Load(), nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	seen := make(chan string, 1)
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			tc := conn.(*tls.Conn)
			name := ""
			if tc.Handshake() == nil && len(tc.ConnectionState().PeerCertificates) > 0 {
				name = tc.ConnectionState().PeerCertificates[0].Subject.CommonName
			}
			seen <- name
			conn.Close()
		}
	}()

	tc, err := EtcdClientTLS(caFile, certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	dial := func() (string, error) {
		t.Helper()
		conn, err := tls.Dial("tcp", ln.Addr().String(), tc)
		name := <-seen
		if err != nil {
			return "", err
		}
		conn.Close()
		return name, nil
	}
	if name, err := dial(); err != nil || name != "client-a" {
		t.Fatalf("first connection: %q, %v; want client-a", name, err)
	}
	// Renewal: new certificate and key in place.
	c, k = ca1.issue(t, "client-b", false)
	write(certFile, c)
	write(keyFile, k)
	if name, err := dial(); err != nil || name != "client-b" {
		t.Fatalf("after renewal: %q, %v; want client-b", name, err)
	}
	// Half-written certificate: the last good pair stays in use.
	write(certFile, c[:len(c)/2])
	if name, err := dial(); err != nil || name != "client-b" {
		t.Fatalf("with a half-written certificate: %q, %v; want client-b", name, err)
	}
	write(certFile, c)
	// A server from another CA is refused.
	setServer(ca2)
	var uerr x509.UnknownAuthorityError
	if _, err := dial(); !errors.As(err, &uerr) {
		t.Fatalf("a server from an unknown CA: err = %v, want an unknown authority", err)
	}

	// Missing files are still refused at start, naming the flag.
	if _, err := EtcdClientTLS(filepath.Join(dir, "missing"), "", ""); err == nil || !strings.Contains(err.Error(), "`etcdCacert`") {
		t.Fatalf("missing CA: err = %v, want an error naming --etcd-cacert", err)
	}
	if _, err := EtcdClientTLS("", filepath.Join(dir, "missing"), keyFile); err == nil || !strings.Contains(err.Error(), "`etcdCert`") {
		t.Fatalf("missing certificate: err = %v, want an error naming --etcd-cert", err)
	}
}
