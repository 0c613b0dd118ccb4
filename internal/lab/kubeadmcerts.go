package lab

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/vigil-ha/vigil/internal/clock"
)

// renewCerts renews every kubeadm certificate on every control-plane node
// and restarts etcd and kube-apiserver node by node; vigil runs on.
func (l *Lab) renewCerts(ctx context.Context, phase func(string, string)) error {
	vigils := map[string]int{}
	for _, n := range l.st.Nodes {
		pid, err := vigilProcess(ctx, n, "run")
		if err != nil {
			return err
		}
		vigils[n.Name] = pid
	}
	kubeadm := filepath.Join(filepath.Dir(l.selfBin), "kubeadm")
	for _, n := range l.st.Nodes {
		cert := filepath.Join(l.machineDir(n), "etc-kubernetes", "pki", "apiserver-etcd-client.crt")
		before, err := os.ReadFile(cert)
		if err != nil {
			return err
		}
		if _, err := l.machineRun(ctx, n, kubeadm, "certs", "renew", "all"); err != nil {
			return err
		}
		after, err := os.ReadFile(cert)
		if err != nil {
			return err
		}
		if string(before) == string(after) {
			return fmt.Errorf("kubeadm certs renew all left %s unchanged on %s", filepath.Base(cert), n.Name)
		}
	}
	phase("kubeadm certs renew all", fmt.Sprintf("on %d nodes", len(l.st.Nodes)))
	for _, n := range l.st.Nodes {
		// kubelet restarts a static pod's container whose process died.
		// One node at a time, each back in full before the next: etcd
		// keeps its quorum.
		for _, comm := range []string{"etcd", "kube-apiserver"} {
			old, err := commPID(ctx, n, comm)
			if err != nil {
				return err
			}
			if err := l.killComm(ctx, n, comm); err != nil {
				return err
			}
			deadline := time.Now().Add(2 * time.Minute)
			for {
				if p, err := commPID(ctx, n, comm); err == nil && p != old {
					break
				}
				if time.Now().After(deadline) {
					return fmt.Errorf("kubelet did not restart %s on %s within 2 minutes", comm, n.Name)
				}
				if !clock.Sleep(ctx, 100*time.Millisecond) {
					return ctx.Err()
				}
			}
		}
		if err := l.waitEtcdMembersHealthy(ctx, 2*time.Minute); err != nil {
			return err
		}
		if err := l.waitBackendUp(ctx, n, 3*time.Minute); err != nil {
			return err
		}
		phase("etcd and kube-apiserver restarted on "+n.Name, "")
	}
	for _, n := range l.st.Nodes {
		pid, err := vigilProcess(ctx, n, "run")
		if err != nil {
			return err
		}
		if pid != vigils[n.Name] {
			return fmt.Errorf("vigil on %s was restarted (pid %d, was %d)", n.Name, pid, vigils[n.Name])
		}
	}
	// Every etcd member restarted, so every vigil's connections to etcd
	// are new ones, made with the renewed pair; the holder still renews.
	holder, err := l.waitStable(ctx, recoverTimeout)
	if err != nil {
		return err
	}
	rep, err := l.vigilStatus(ctx, holder)
	if err != nil {
		return err
	}
	if !rep.Leader {
		return fmt.Errorf("vigil on %s holds the VIP but does not report leading", holder)
	}
	phase("same vigils, one holder", holder)
	return nil
}

// waitEtcdMembersHealthy waits until every etcd member answers a status
// request and all name the same leader.
func (l *Lab) waitEtcdMembersHealthy(ctx context.Context, d time.Duration) error {
	deadline := time.Now().Add(d)
	var last error
	for time.Now().Before(deadline) {
		last = l.etcdMembersHealthy(ctx)
		if last == nil {
			return nil
		}
		if !clock.Sleep(ctx, 250*time.Millisecond) {
			return ctx.Err()
		}
	}
	return fmt.Errorf("lab: etcd not healthy after %v: %w", d, last)
}

func (l *Lab) etcdMembersHealthy(ctx context.Context) error {
	cli, err := l.kubeadmEtcdClient()
	if err != nil {
		return err
	}
	defer cli.Close()
	var leader uint64
	for _, ep := range cli.Endpoints() {
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		st, err := cli.Status(sctx, ep)
		cancel()
		if err != nil {
			return fmt.Errorf("%s: %w", ep, err)
		}
		if leader != 0 && st.Leader != leader {
			return fmt.Errorf("%s follows %x, another member %x", ep, st.Leader, leader)
		}
		leader = st.Leader
	}
	if leader == 0 {
		return errors.New("no etcd leader")
	}
	return nil
}

// kubeadmCA is the cluster CA's certificate pool, for HTTPS to the VIP.
func (l *Lab) kubeadmCA() (*x509.CertPool, error) {
	for _, n := range l.st.Nodes {
		pem, err := os.ReadFile(filepath.Join(l.machineDir(n), "etc-kubernetes", "pki", "ca.crt"))
		if err == nil {
			pool := x509.NewCertPool()
			pool.AppendCertsFromPEM(pem)
			return pool, nil
		}
	}
	return nil, errors.New("lab: no control-plane node has the cluster CA")
}
