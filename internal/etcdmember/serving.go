// Package etcdmember is what vigil knows of an etcd member as a backend,
// in one place for every caller: which members serve clients, on which
// URLs, and which API server runs beside each (Serving). It also reads the
// member list over etcd's JSON gateway (Lister), for the worker agent,
// whose binary links no gRPC: the daemon and the CLI read it through
// etcdcluster.
//
// It imports neither the etcd client nor its protobuf types: a member is
// anything with the two getters both etcd's pb.Member and the gateway's
// JSON have.
package etcdmember

import (
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
)

// Member is an etcd member as both etcd's pb.Member and the JSON
// gateway's answer describe it.
type Member interface {
	GetClientURLs() []string
	GetIsLearner() bool
}

// Serving is what the started voters of a member list serve clients on:
// the one place where members become backends.
//
// Learners are left out. A learner serves no client requests (etcd refuses
// them), so it is no etcd backend; and its node is being added: its
// kube-apiserver talks to that learner, is not ready before the promotion,
// and the health checks would only keep it out anyway. A member not started
// yet (no client URLs) serves nothing.
type Serving struct {
	// URLs are the client URLs (see ClientURLs).
	URLs []string
	// HostPorts are their host:port, for an etcd proxy.
	HostPorts []string
	// Hosts are their host names or addresses alone: a node that runs an
	// etcd member runs its kube-apiserver too.
	Hosts []string
}

// ServingOf sorts and deduplicates what members serve on.
func ServingOf[M Member](members []M) Serving {
	var s Serving
	for _, m := range members {
		if m.GetIsLearner() {
			continue
		}
		for _, u := range ClientURLs(m) {
			s.URLs = append(s.URLs, u.String())
			s.HostPorts = append(s.HostPorts, u.Host)
			s.Hosts = append(s.Hosts, u.Hostname())
		}
	}
	for _, l := range []*[]string{&s.URLs, &s.HostPorts, &s.Hosts} {
		slices.Sort(*l)
		*l = slices.Compact(*l)
	}
	return s
}

// WithPort joins each host with port, sorted: API server backends from
// Hosts.
func WithPort(hosts []string, port int) []string {
	out := make([]string, len(hosts))
	for i, h := range hosts {
		out[i] = net.JoinHostPort(h, strconv.Itoa(port))
	}
	slices.Sort(out)
	return out
}

// ClientURLs are the client URLs a member advertises that others can
// reach: a loopback URL next to a routable one is left out; a member not
// started yet (no client URLs) has none.
func ClientURLs(m Member) []*url.URL {
	var out, loop []*url.URL
	for _, cu := range m.GetClientURLs() {
		u, err := url.Parse(cu)
		if err != nil || u.Hostname() == "" {
			continue
		}
		h := u.Hostname()
		if a, err := netip.ParseAddr(h); (err == nil && a.IsLoopback()) || h == "localhost" {
			loop = append(loop, u)
			continue
		}
		out = append(out, u)
	}
	if len(out) == 0 {
		return loop
	}
	return out
}
