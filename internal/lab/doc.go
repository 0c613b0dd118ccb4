// Package lab builds a control plane in network namespaces on one machine and
// breaks it on purpose.
//
// Topology (every name starts with "vlab-", so `vigil-lab down` can find all
// of it even after a crash; a second instance's with "vlab<instance>-",
// SetInstance):
//
//	vlab-sw      a namespace holding the bridge br0; one veth port per host
//	vlab-cl      the client, 10.250.0.2, which probes the VIP every 10 ms
//	vlab-n1..nN  control-plane nodes, 10.250.0.11.., each running a real etcd
//	             member, `vigil run` and a small UDP responder that answers
//	             with the node's name
//
// Nothing is added to the root namespace: the lab process reaches etcd and the
// VIP through sockets it opens inside vlab-cl. Cutting a node's veth port on
// the bridge is a power cut as seen from the network; killing its processes
// completes it.
package lab
