package lab

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/vigil-ha/vigil/internal/sakey"
)

// API servers the lab can run on its nodes.
const (
	APIServerStandIn = "standin" // the lab's own HTTPS stand-in (drillable modes)
	APIServerKube    = "kube"    // the real kube-apiserver from bin/ (hack/build-kube-apiserver.sh)
)

// Election backends the lab can give vigil.
const (
	ElectionEtcd       = "etcd"
	ElectionKubernetes = "kubernetes"
)

// labToken is the bearer token of the lab's administrator (system:masters)
// on its kube-apiservers.
const labToken = "vigil-lab-admin-token"

func (l *Lab) kubeAPIServerBin() string {
	return filepath.Join(filepath.Dir(l.selfBin), "kube-apiserver")
}

func (l *Lab) tokenFile() string         { return filepath.Join(l.dir, "tokens.csv") }
func (l *Lab) saKey() string             { return filepath.Join(l.dir, "sa.key") }
func (l *Lab) saPub() string             { return filepath.Join(l.dir, "sa.pub") }
func (l *Lab) kubeconfig(n *Node) string { return filepath.Join(l.nodeDir(n), "kubeconfig") }

// prepareKube writes what every kube-apiserver of the lab shares: the token
// file and the service-account signing key.
func (l *Lab) prepareKube() error {
	if _, err := os.Stat(l.kubeAPIServerBin()); err != nil {
		return fmt.Errorf("lab: --apiserver kube needs %s: run hack/build-kube-apiserver.sh", l.kubeAPIServerBin())
	}
	if err := os.WriteFile(l.tokenFile(), []byte(labToken+",admin,admin-uid,system:masters\n"), 0o600); err != nil {
		return fmt.Errorf("lab: %w", err)
	}
	if err := sakey.Write(l.saKey(), l.saPub()); err != nil {
		return fmt.Errorf("lab: service-account key: %w", err)
	}
	return nil
}

// startKubeAPIServer runs the real kube-apiserver on n, bound to the node's
// address, against the node's own etcd member, serving the lab-CA
// certificate the stand-in would, and writes n's kubeconfig for it.
func (l *Lab) startKubeAPIServer(n *Node) error {
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: lab
  cluster:
    server: https://%s
    certificate-authority: %s
users:
- name: admin
  user:
    token: %s
contexts:
- name: lab
  context: {cluster: lab, user: admin}
current-context: lab
`, netip.AddrPortFrom(n.IP, APIServerPort), l.caPath(), labToken)
	if err := os.WriteFile(l.kubeconfig(n), []byte(kc), 0o600); err != nil {
		return fmt.Errorf("lab: %w", err)
	}
	return l.start(n, roleAPIServer, l.kubeAPIServerBin(),
		"--etcd-servers=http://127.0.0.1:2379",
		"--bind-address="+n.IP.String(),
		"--advertise-address="+n.IP.String(),
		fmt.Sprintf("--secure-port=%d", APIServerPort),
		"--tls-cert-file="+l.apiCert(n),
		"--tls-private-key-file="+l.apiKey(n),
		"--client-ca-file="+l.caPath(),
		"--token-auth-file="+l.tokenFile(),
		"--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file="+l.saPub(),
		"--service-account-signing-key-file="+l.saKey(),
		"--service-cluster-ip-range=10.96.0.0/12",
		"--enable-priority-and-fairness=false",
		"--v=0",
	)
}
