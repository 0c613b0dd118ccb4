package lab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/vigil-ha/vigil/internal/clock"
	"github.com/vigil-ha/vigil/internal/netns"
)

// kubeadmEtcdClient is a client of the kubeadm cluster's etcd with
// kubeadm's apiserver-etcd-client certificate, from the client namespace.
func (l *Lab) kubeadmEtcdClient() (*clientv3.Client, error) {
	return l.kubeadmEtcdClientOf(l.st.Nodes)
}

// kubeadmEtcdClientOf is kubeadmEtcdClient with the members of nodes only.
func (l *Lab) kubeadmEtcdClientOf(nodes []*Node) (*clientv3.Client, error) {
	var pki string
	var eps []string
	for _, n := range nodes {
		p := filepath.Join(l.machineDir(n), "etc-kubernetes", "pki")
		if _, err := os.Stat(filepath.Join(p, "apiserver-etcd-client.crt")); err != nil {
			continue
		}
		if pki == "" {
			pki = p
		}
		eps = append(eps, fmt.Sprintf("https://%s:2379", n.IP))
	}
	if pki == "" {
		return nil, errors.New("lab: no control-plane node has kubeadm's etcd client certificate")
	}
	tlsInfo := transport.TLSInfo{
		CertFile:      filepath.Join(pki, "apiserver-etcd-client.crt"),
		KeyFile:       filepath.Join(pki, "apiserver-etcd-client.key"),
		TrustedCAFile: filepath.Join(pki, "etcd", "ca.crt"),
	}
	tc, err := tlsInfo.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("lab: etcd TLS: %w", err)
	}
	return clientv3.New(clientv3.Config{
		Endpoints:   eps,
		DialTimeout: 2 * time.Second,
		TLS:         tc,
		DialOptions: []grpc.DialOption{grpc.WithContextDialer(netns.Dialer(clientNS))},
		Logger:      zap.NewNop(),
	})
}

// withKubeadmEtcd runs f with a client of the kubeadm cluster's etcd and a
// 10 s context (a member removal waits for the quorum's answer).
func (l *Lab) withKubeadmEtcd(ctx context.Context, f func(context.Context, *clientv3.Client) error) error {
	cli, err := l.kubeadmEtcdClient()
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return f(ctx, cli)
}

// kubeadmMembers lists the etcd member names.
func (l *Lab) kubeadmMembers(ctx context.Context) (map[string]uint64, error) {
	var resp *clientv3.MemberListResponse
	err := l.withKubeadmEtcd(ctx, func(ctx context.Context, cli *clientv3.Client) (err error) {
		resp, err = cli.MemberList(ctx)
		return err
	})
	if err != nil {
		return nil, err
	}
	out := map[string]uint64{}
	for _, m := range resp.Members {
		out[m.Name] = m.ID
	}
	return out, nil
}

// waitMemberGone waits until etcd no longer lists member name.
func (l *Lab) waitMemberGone(ctx context.Context, name string, d time.Duration) error {
	deadline := time.Now().Add(d)
	var last error
	for time.Now().Before(deadline) {
		ms, err := l.kubeadmMembers(ctx)
		if err == nil {
			if _, ok := ms[name]; !ok {
				return nil
			}
			err = fmt.Errorf("member %s still listed", name)
		}
		last = err
		if !clock.Sleep(ctx, 500*time.Millisecond) {
			return ctx.Err()
		}
	}
	return fmt.Errorf("lab: vigil did not prune %s within %v: %w", name, d, last)
}

// removeMemberByHand removes member name from etcd, as the seed's user had
// to.
func (l *Lab) removeMemberByHand(ctx context.Context, name string) error {
	ms, err := l.kubeadmMembers(ctx)
	if err != nil {
		return err
	}
	id, ok := ms[name]
	if !ok {
		return nil
	}
	return l.withKubeadmEtcd(ctx, func(ctx context.Context, cli *clientv3.Client) error {
		if _, err := cli.MemberRemove(ctx, id); err != nil {
			return fmt.Errorf("lab: remove member %s by hand: %w", name, err)
		}
		return nil
	})
}

// preflightLine sums a preflight up for the drill's phases.
func preflightLine(p Preflight) string {
	if p.Join {
		return "yes"
	}
	line := "no: " + strings.Join(p.Failed, "; ")
	if len(p.Fixes) > 0 {
		line += "; fix: " + p.Fixes[0]
	}
	return line
}

// Preflight is one run of vigil members preflight during a drill.
type Preflight struct {
	When string `json:"when"`
	Join bool   `json:"join"` // it said yes (exit 0)
	// Failed are the checks it failed, each with its detail.
	Failed []string `json:"failed,omitempty"`
	// Fixes are the commands it printed for them.
	Fixes []string `json:"fixes,omitempty"`
}

// preflight runs vigil members preflight from the client namespace, as an
// operator about to run kubeadm join would, with kubeadm's etcd client
// certificate and admin.conf of a surviving control-plane node.
func (l *Lab) preflight(ctx context.Context, when, joining string) (Preflight, error) {
	var pki, admin string
	var eps []string
	for _, n := range l.st.Nodes {
		dir := filepath.Join(l.machineDir(n), "etc-kubernetes")
		if _, err := os.Stat(filepath.Join(dir, "pki", "apiserver-etcd-client.crt")); err != nil {
			continue
		}
		if pki == "" {
			pki, admin = filepath.Join(dir, "pki"), filepath.Join(dir, filepath.Base(kubeadmAdmin))
		}
		eps = append(eps, fmt.Sprintf("https://%s:2379", n.IP))
	}
	if pki == "" {
		return Preflight{}, errors.New("lab: no control-plane node has kubeadm's etcd client certificate")
	}
	args := []string{"netns", "exec", clientNS, l.vigilBin, "members", "preflight", "-o", "json",
		"--etcd-endpoints", strings.Join(eps, ","), "--etcd-cacert", filepath.Join(pki, "etcd", "ca.crt"),
		"--etcd-cert", filepath.Join(pki, "apiserver-etcd-client.crt"), "--etcd-key", filepath.Join(pki, "apiserver-etcd-client.key"),
		"--kubeconfig", admin}
	if joining != "" {
		args = append(args, "--for-join", joining)
	}
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(cctx, "ip", args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var ee *exec.ExitError
	if err != nil && !(errors.As(err, &ee) && ee.ExitCode() == 1) {
		return Preflight{}, fmt.Errorf("lab: vigil members preflight: %w: %s", err, stderr.String())
	}
	var res struct {
		Join     bool
		Findings []struct {
			Check, Detail string
			OK, Skipped   bool
			Fix           []string
		}
	}
	if jerr := json.Unmarshal(out, &res); jerr != nil {
		return Preflight{}, fmt.Errorf("lab: vigil members preflight printed no JSON (%v): %s%s", jerr, out, stderr.String())
	}
	p := Preflight{When: when, Join: res.Join}
	for _, f := range res.Findings {
		if !f.OK && !f.Skipped {
			p.Failed = append(p.Failed, f.Check+": "+f.Detail)
			p.Fixes = append(p.Fixes, f.Fix...)
		}
	}
	if p.Join != (err == nil) {
		return p, fmt.Errorf("lab: vigil members preflight said join=%v but exited with %v", p.Join, err)
	}
	return p, nil
}
