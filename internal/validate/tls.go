package validate

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
)

// DefaultHealthCA is the CA used to verify API server certificates when
// none is given: kubeadm's cluster CA.
const DefaultHealthCA = "/etc/kubernetes/pki/ca.crt"

// EtcdClientTLS loads the files of --etcd-cacert, --etcd-cert and
// --etcd-key (any may be empty); nil when none is given. Errors name
// the flag. The certificate and key are read again when
// they change (tlsreload.go): a renewed pair is used from the next
// connection.
func EtcdClientTLS(caFile, certFile, keyFile string) (*tls.Config, error) {
	if caFile == "" && certFile == "" && keyFile == "" {
		return nil, nil
	}
	if (certFile == "") != (keyFile == "") {
		return nil, fmt.Errorf("`etcdCert` and `etcdKey` go together")
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pool, err := loadCA("`etcdCacert`", caFile)
		if err != nil {
			return nil, err
		}
		tc.RootCAs = pool
	}
	if certFile != "" {
		get, err := ClientCertificate(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("load `etcdCert`/`etcdKey`: %w", err)
		}
		tc.GetClientCertificate = get
	}
	return tc, nil
}

// HealthTLS is how API server certificates are verified in health checks:
// with the CA in file ca, else kubeadm's CA when present, else the system
// roots; or not at all (insecure). Errors name --health-ca.
func HealthTLS(ca string, insecure bool) (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if insecure {
		tc.InsecureSkipVerify = true
		return tc, nil
	}
	if ca == "" {
		if _, err := os.Stat(DefaultHealthCA); err != nil {
			return tc, nil // system roots
		}
		ca = DefaultHealthCA
	}
	pool, err := loadCA("`healthCa`", ca)
	if err != nil {
		return nil, err
	}
	tc.RootCAs = pool
	return tc, nil
}

// loadCA reads a CA bundle given with flag.
func loadCA(flag, path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", flag, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s %s holds no PEM certificate", flag, path)
	}
	return pool, nil
}

// ListenAddress checks the value of a listen flag: HOST:PORT with a port
// in 0-65535 (HOST may be empty: every address). Empty is accepted only
// when optional (the listener is then off).
func ListenAddress(flag, s string, optional bool) error {
	if s == "" {
		if optional {
			return nil
		}
		return fmt.Errorf("%s is required: HOST:PORT, such as 127.0.0.1:9558", flag)
	}
	_, port, err := net.SplitHostPort(s)
	if err == nil {
		var n int
		if n, err = strconv.Atoi(port); err == nil && (n < 0 || n > 65535) {
			err = errors.New("port out of range")
		}
	}
	if err != nil {
		if optional {
			return fmt.Errorf("%s %q must be HOST:PORT, such as 127.0.0.1:9558, or empty to disable (%w)", flag, s, err)
		}
		return fmt.Errorf("%s %q must be HOST:PORT, such as 127.0.0.1:9558 (%w)", flag, s, err)
	}
	return nil
}

// LocalEndpoint checks the address of a listener that local clients are
// configured to dial (the agent's 127.0.0.1:6443): IP:PORT with both
// parts, since "every address" is no address a client can be given.
func LocalEndpoint(flag, s string) error {
	if host, port, err := net.SplitHostPort(s); err != nil || host == "" || port == "" {
		return fmt.Errorf("%s %q must be IP:PORT, such as 127.0.0.1:6443", flag, s)
	}
	return ListenAddress(flag, s, false)
}

// ClientCertificate loads a client certificate and key from two files
// (a kubeconfig's client-certificate and client-key) and returns the
// tls.Config.GetClientCertificate that reads them again whenever they
// change (tlsreload.go): the kubelet's rotated client certificate, or a
// renewed one, is used from the next connection.
func ClientCertificate(certFile, keyFile string) (func(*tls.CertificateRequestInfo) (*tls.Certificate, error), error) {
	pair, err := newReloadingPair(certFile, keyFile)
	if err != nil {
		return nil, err
	}
	return func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return pair.get() }, nil
}
