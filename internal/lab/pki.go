package lab

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"time"
)

// pki is the lab's certificate authority: it signs each stand-in API
// server's serving certificate, as kubeadm's cluster CA does.
type pki struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

func (l *Lab) caPath() string { return filepath.Join(l.dir, "ca.crt") }

// newPKI creates the CA and writes its certificate to caPath.
func (l *Lab) newPKI() (*pki, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("lab: ca key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "vigil-lab-ca"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(30 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("lab: ca certificate: %w", err)
	}
	cert, _ := x509.ParseCertificate(der)
	if err := writePEM(l.caPath(), "CERTIFICATE", der); err != nil {
		return nil, err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("lab: ca key: %w", err)
	}
	if err := writePEM(l.caKeyPath(), "EC PRIVATE KEY", kder); err != nil {
		return nil, err
	}
	return &pki{cert: cert, key: key}, nil
}

func (l *Lab) caKeyPath() string { return filepath.Join(l.dir, "ca.key") }

// loadPKI reads the CA that Up created, to issue certificates for nodes
// added later.
func (l *Lab) loadPKI() (*pki, error) {
	cb, err := os.ReadFile(l.caPath())
	if err != nil {
		return nil, fmt.Errorf("lab: %w", err)
	}
	kb, err := os.ReadFile(l.caKeyPath())
	if err != nil {
		return nil, fmt.Errorf("lab: %w", err)
	}
	cp, _ := pem.Decode(cb)
	kp, _ := pem.Decode(kb)
	if cp == nil || kp == nil {
		return nil, fmt.Errorf("lab: %s or %s is not PEM", l.caPath(), l.caKeyPath())
	}
	cert, err := x509.ParseCertificate(cp.Bytes)
	if err != nil {
		return nil, fmt.Errorf("lab: %w", err)
	}
	key, err := x509.ParseECPrivateKey(kp.Bytes)
	if err != nil {
		return nil, fmt.Errorf("lab: %w", err)
	}
	return &pki{cert: cert, key: key}, nil
}

// issue writes a serving certificate for ips (the node, the VIP, loopback)
// to certFile and keyFile.
func (p *pki) issue(name string, ips []netip.Addr, certFile, keyFile string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("lab: key for %s: %w", name, err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(30 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, ip := range ips {
		tmpl.IPAddresses = append(tmpl.IPAddresses, net.IP(ip.AsSlice()))
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.cert, &key.PublicKey, p.key)
	if err != nil {
		return fmt.Errorf("lab: certificate for %s: %w", name, err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return fmt.Errorf("lab: key for %s: %w", name, err)
	}
	if err := writePEM(certFile, "CERTIFICATE", der); err != nil {
		return err
	}
	return writePEM(keyFile, "EC PRIVATE KEY", kder)
}

func writePEM(path, typ string, der []byte) error {
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		return fmt.Errorf("lab: %w", err)
	}
	return nil
}
