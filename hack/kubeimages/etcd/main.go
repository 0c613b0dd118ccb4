// Command etcd is the real etcd server (go.etcd.io/etcd/server/v3), built
// from the version vigil's go.mod pins, for the kubeadm lab's etcd image:
// kubeadm's static pod runs "etcd --name ... --data-dir ...", and this is
// that etcd. hack/build-kube-images.sh builds it.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
