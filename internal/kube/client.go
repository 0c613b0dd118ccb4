package kube

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// ErrConfig wraps every configuration error of this package.
var ErrConfig = errors.New("kube: invalid configuration")

// ServiceAccountDir is where a pod's service-account token and CA are
// mounted.
const ServiceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// NewClient builds a clientset from a kubeconfig file. The client-side rate
// limit is raised well above vigil's needs (a Lease read or write every
// retry period, plus rare lists): client-go's default of 5 requests per
// second would delay renewals.
func NewClient(kubeconfig string) (kubernetes.Interface, error) {
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("%w: --kubeconfig %s: %w", ErrConfig, kubeconfig, err)
	}
	return newClient(rc, "--kubeconfig "+kubeconfig)
}

// Server returns the API server URL a kubeconfig points at.
func Server(kubeconfig string) (string, error) {
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return "", fmt.Errorf("%w: --kubeconfig %s: %w", ErrConfig, kubeconfig, err)
	}
	return rc.Host, nil
}

// NewServiceAccountClient builds a clientset that authenticates with the
// pod's service-account token from dir (ServiceAccountDir) and talks to
// server, verifying its certificate against the CA in dir for serverName
// ("" for the server's own host). Unlike rest.InClusterConfig it does not
// use the Service's cluster IP: the agent must reach the API server before
// kube-proxy runs.
func NewServiceAccountClient(dir, server, serverName string) (kubernetes.Interface, error) {
	tokenFile, caFile := filepath.Join(dir, "token"), filepath.Join(dir, "ca.crt")
	for _, f := range []string{tokenFile, caFile} {
		if _, err := os.Stat(f); err != nil {
			return nil, fmt.Errorf("%w: service-account credentials: %w (is the pod's service-account token mounted?)", ErrConfig, err)
		}
	}
	rc := &rest.Config{
		Host:            server,
		BearerTokenFile: tokenFile, // re-read when the kubelet rotates it
		TLSClientConfig: rest.TLSClientConfig{CAFile: caFile, ServerName: serverName},
	}
	return newClient(rc, "service account")
}

func newClient(rc *rest.Config, what string) (kubernetes.Interface, error) {
	rc.QPS, rc.Burst = 100, 200
	rc.UserAgent = "vigil"
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrConfig, what, err)
	}
	return cs, nil
}
