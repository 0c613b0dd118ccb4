package daemon

import (
	"sync/atomic"
	"time"

	"github.com/vigil-ha/vigil/internal/etcdcluster"
	"github.com/vigil-ha/vigil/internal/health"
	"github.com/vigil-ha/vigil/internal/kube"
	"github.com/vigil-ha/vigil/internal/netmon"
)

// apiWiring is how the parts that follow the API servers reach each other.
// Discovery, the health checker, every port's balancer, the ECMP announcer
// and the agents' feed are each given the wiring's methods, never each
// other:
//
//	discovery ──backendsChanged──▶ checker, every port's balancer and checker, feed
//	checker   ──healthChanged────▶ the first port's balancer, ECMP, feed
//	balancer  ──dialFailed───────▶ checker (passive health checking)
//	EndpointSlices ──publishedChanged──▶ discovery
//
// newNode gives the parts these methods as it builds them, and fills the
// wiring (connect) once all are built: nothing calls back before Run.
type apiWiring struct {
	checker backendChecker // the API servers' health checks
	bal     backendBalancer
	more    []portBackends // the --lb-ports after the first
	ecmp    interface{ Kick() }
	feed    interface{ changed() }
	disc    interface{ PublishedChanged() }
}

// backendChecker is the API servers' health checker (health.Checker).
type backendChecker interface {
	Set(backends []string)
	DialFailed(backend string, err error)
}

// backendBalancer is the first port's balancer (lb.Balancer).
type backendBalancer interface {
	Update(health.Status)
	SetBackends(backends []string)
}

// portBackends is a port after the first (servedPort): it maps the API
// servers to its own backend port.
type portBackends interface{ setBackends(apiservers []string) }

// backendsChanged takes discovery's new set of API servers.
func (w *apiWiring) backendsChanged(b []string) {
	if w.bal != nil {
		w.bal.SetBackends(b)
	}
	w.checker.Set(b)
	for _, p := range w.more {
		p.setBackends(b)
	}
	if w.feed != nil {
		w.feed.changed()
	}
}

// healthChanged takes the checker's new verdict on one API server.
func (w *apiWiring) healthChanged(st health.Status) {
	if w.bal != nil {
		w.bal.Update(st)
	}
	if w.ecmp != nil {
		w.ecmp.Kick()
	}
	if w.feed != nil {
		w.feed.changed()
	}
}

// dialFailed takes the first port's balancer's failed dial: a refused
// connection ejects the backend before its next check, a timed-out one
// counts as a failed check.
func (w *apiWiring) dialFailed(backend string, err error) { w.checker.DialFailed(backend, err) }

// publishedChanged takes a change of the kubernetes Service's
// EndpointSlices.
func (w *apiWiring) publishedChanged([]string) {
	if w.disc != nil {
		w.disc.PublishedChanged()
	}
}

// healthChanged and dialFailed wire a port's balancer and checker to each
// other.
func (p *servedPort) healthChanged(st health.Status)       { p.bal.Update(st) }
func (p *servedPort) dialFailed(backend string, err error) { p.checker.DialFailed(backend, err) }

// notices turn what the parts report into metrics and, with a Kubernetes
// client, Events. The parts are given its methods.
type notices struct {
	node   string
	vip    string // the VIP as the Events name it
	iface  string
	m      *nodeMetrics
	events *kube.Events         // nil without --kubeconfig
	etcd   *etcdcluster.Cluster // the cluster vigil follows; nil without etcd
	// reannounce announces the VIP once more (ARP/NDP); nil with BGP.
	reannounce interface{ again() }
	// holderChanged is when the observed holder last changed (UnixNano).
	holderChanged *atomic.Int64
}

func (x *notices) emit(warning bool, reason, format string, args ...any) {
	if x.events != nil {
		x.events.Emit(warning, reason, format, args...)
	}
}

// strayVIP: the keeper removed a VIP this node does not hold.
func (x *notices) strayVIP() {
	x.m.strays.Inc()
	x.emit(true, kube.ReasonStrayVIP, "%s removed the VIP %s from %s: it does not hold the lock, yet the address was there", x.node, x.vip, x.iface)
}

// restoredVIP: the keeper put back a VIP this node holds, which something
// had removed; the segment learns again where it is.
func (x *notices) restoredVIP() {
	x.m.restored.Inc()
	if x.reannounce != nil {
		x.reannounce.again()
	}
}

// foreignEtcd: an endpoint answered for another etcd cluster.
func (x *notices) foreignEtcd(f etcdcluster.Foreign) {
	x.m.foreign.Inc()
	var ours uint64
	if x.etcd != nil { // nil while etcdcluster.New runs
		ours = x.etcd.ClusterID()
	}
	x.emit(true, kube.ReasonEtcdImpostor, "%s: etcd endpoint %s answers for cluster %x, not %x, the one vigil follows; its answers are refused", x.node, f.Endpoint, f.ClusterID, ours)
}

// newLeader: the election saw another holder.
func (x *notices) newLeader(string) {
	x.m.transitions.Inc()
	x.holderChanged.Store(time.Now().UnixNano())
}

// atRisk: the lease is renewed with less than a retry period left, or no
// longer ("" ends it).
func (x *notices) atRisk(why string) {
	x.m.atRisk.Set(boolGauge(why != ""))
	if why != "" {
		x.emit(true, kube.ReasonLeaseAtRisk, "%s: %s", x.node, why)
	}
}

// linkMAC is the VIP interface's MAC as the link monitor last read it, for
// the lock record (election.MACSource).
type linkMAC struct {
	links *netmon.Monitor
	name  string
}

func (l linkMAC) MAC() string {
	lk, err := l.links.Link(l.name)
	if err != nil {
		return ""
	}
	return lk.MAC.String()
}
