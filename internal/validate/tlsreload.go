package validate

import (
	"crypto/tls"
	"os"
	"sync"
	"syscall"
	"time"
)

// The etcd client certificate and key are read again whenever they change:
// `kubeadm certs renew` rewrites them in place, and vigil must keep working
// across it without a restart. The files are checked at each TLS handshake,
// which happens once per connection; unchanged files cost two stats. A file
// caught half-written fails to parse, and the previous pair stays in use
// until a complete one appears.
//
// CA bundles are read once, at start: Go verifies a server against
// tls.Config.RootCAs, fixed for the life of the etcd client, and a check of
// our own in VerifyConnection cannot see which IP address was dialled (the
// connection state carries no server name for an IP), so it would be weaker
// than Go's. kubeadm certs renew keeps the CAs; a CA rotation needs vigil
// restarted (docs/kubeadm.md).

// fileStamp identifies one version of a file.
type fileStamp struct {
	ino   uint64
	size  int64
	mtime time.Time
}

func stampOf(path string) (fileStamp, error) {
	st, err := os.Stat(path)
	if err != nil {
		return fileStamp{}, err
	}
	s := fileStamp{size: st.Size(), mtime: st.ModTime()}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		s.ino = sys.Ino
	}
	return s, nil
}

// reloadingPair is a client certificate and key read from two files.
type reloadingPair struct {
	certFile, keyFile string

	mu      sync.Mutex
	stamps  [2]fileStamp
	current *tls.Certificate
}

func newReloadingPair(certFile, keyFile string) (*reloadingPair, error) {
	p := &reloadingPair{certFile: certFile, keyFile: keyFile}
	if _, err := p.get(); err != nil {
		return nil, err
	}
	return p, nil
}

// get returns the pair, read again if either file changed.
func (p *reloadingPair) get() (*tls.Certificate, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	cs, cerr := stampOf(p.certFile)
	ks, kerr := stampOf(p.keyFile)
	if p.current != nil && (cerr != nil || kerr != nil || p.stamps == [2]fileStamp{cs, ks}) {
		return p.current, nil // unchanged, or a file being replaced: keep the last good pair
	}
	cert, err := tls.LoadX509KeyPair(p.certFile, p.keyFile)
	if err != nil {
		if p.current != nil {
			return p.current, nil // half-written, or the key not yet renewed
		}
		return nil, err
	}
	p.current, p.stamps = &cert, [2]fileStamp{cs, ks}
	return p.current, nil
}
