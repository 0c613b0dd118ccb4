// Package lb is vigil's layer-4 load balancer: it accepts TCP on VIP:port
// and forwards each connection to a usable API server.
//
// Data path: a userspace proxy. io.Copy between two *net.TCPConn uses
// splice(2) on Linux, so payload never enters user space; what user space
// adds is one accept and one connect per connection. The alternative, an
// nftables DNAT map kept by vigil, would skip even that, but it cannot retry
// a refused connection on another backend, cannot count connections for
// least-conn, and cannot close established connections to a dead backend
// without reaching into conntrack. See docs/lb.md for the numbers.
//
// The listener binds VIP:port with IP_FREEBIND on every node, leader or not,
// so a port conflict is found at start and the listener is ready the moment
// the VIP arrives; packets for the VIP reach only the node that holds it.
// kube-apiserver on the same node must therefore not bind 0.0.0.0 on that
// port: give it --bind-address=<node IP>, or use another --lb-port.
//
// Connections are tracked per backend, which is what lets the balancer close
// them when the backend dies, is removed from the cluster, or when this node
// loses the VIP.
//
// Which backend a new connection goes to is a Picker's choice (picker.go):
// LeastConn or RoundRobin for vigil run (--lb-policy), and the worker
// agent's own picker, with its preference tiers and its last resort when no
// check passes. The balancer owns the backends, their health and their
// connections; a picker sees a snapshot of them and owns only its choice.
package lb
