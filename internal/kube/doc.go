// Package kube is vigil's use of the Kubernetes API, apart from the Lease
// election (election.LeaseLock):
//
//   - NewClient: a clientset from a kubeconfig, or from a pod's
//     service-account token (the agent's DaemonSet);
//   - APIServers: the API servers the cluster itself publishes, followed
//     live from the "kubernetes" Service's EndpointSlices in "default"
//     (each kube-apiserver adds itself and is removed by its peers when its
//     lease there runs out), a backend source for the load balancer and
//     the agent;
//   - Events: Kubernetes Events on leadership changes, best effort, never
//     delaying what they report;
//   - DeleteDeadNode: removing the Node object of a control-plane node
//     whose etcd member was pruned, only while that Node is not Ready.
//
// Every request is bounded by a timeout; an API server that is down, slow
// or refuses (403) never blocks the VIP.
package kube
