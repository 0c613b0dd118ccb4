// Command pause is the pod sandbox's process for the kubeadm lab's pause
// image: it holds the pod's namespaces, reaps orphans (it is PID 1 when a
// pod shares its process namespace), and exits on SIGTERM or SIGINT, as the
// upstream pause does. hack/build-kube-images.sh builds it.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 8)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for s := range sig {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
