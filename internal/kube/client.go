package kube

import (
	"fmt"
	"strings"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/vigil-ha/vigil/internal/kubelite"
	"github.com/vigil-ha/vigil/internal/validate"
)

// validate.ErrInvalid wraps every configuration error of this package.

// load reads a kubeconfig file; errors name the flag.
func load(kubeconfig string) (*rest.Config, error) {
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("%w: `kubeconfig` %s: %w", validate.ErrInvalid, kubeconfig, err)
	}
	return rc, nil
}

// NewClient builds a clientset from a kubeconfig file. The client-side rate
// limit is raised well above vigil's needs (a Lease read or write every
// retry period, plus rare lists): client-go's default of 5 requests per
// second would delay renewals.
func NewClient(kubeconfig string) (kubernetes.Interface, error) {
	rc, err := load(kubeconfig)
	if err != nil {
		return nil, err
	}
	return newClient(rc, "`kubeconfig` "+kubeconfig)
}

// Server returns the API server URL a kubeconfig points at.
func Server(kubeconfig string) (string, error) {
	rc, err := load(kubeconfig)
	if err != nil {
		return "", err
	}
	return rc.Host, nil
}

// HTTPClient is a kubeconfig's API server URL with an HTTP client that
// authenticates as the kubeconfig says (client-go's: exec plugins and all),
// for kubelite.APIServers.
func HTTPClient(kubeconfig string) (*kubelite.Client, error) {
	rc, err := load(kubeconfig)
	if err != nil {
		return nil, err
	}
	rc.UserAgent = "vigil"
	hc, err := rest.HTTPClientFor(rc)
	if err != nil {
		return nil, fmt.Errorf("%w: `kubeconfig` %s: %w", validate.ErrInvalid, kubeconfig, err)
	}
	return &kubelite.Client{Server: strings.TrimSuffix(rc.Host, "/"), HTTP: hc}, nil
}

func newClient(rc *rest.Config, what string) (kubernetes.Interface, error) {
	rc.QPS, rc.Burst = 100, 200
	rc.UserAgent = "vigil"
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", validate.ErrInvalid, what, err)
	}
	return cs, nil
}
