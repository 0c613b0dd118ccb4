package daemon

import (
	"fmt"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// kubeClient builds a clientset from a kubeconfig file. The client-side
// rate limit is raised well above the election's needs (a read or write
// every retry period): client-go's default of 5 requests per second would
// delay renewals.
func kubeClient(path string) (kubernetes.Interface, error) {
	rc, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil, fmt.Errorf("%w: --kubeconfig %s: %w", ErrConfig, path, err)
	}
	rc.QPS, rc.Burst = 100, 200
	rc.UserAgent = "vigil"
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("%w: --kubeconfig %s: %w", ErrConfig, path, err)
	}
	return cs, nil
}
