package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/vigil-ha/vigil/internal/bgp"
	"github.com/vigil-ha/vigil/internal/discovery"
	"github.com/vigil-ha/vigil/internal/dnat"
	"github.com/vigil-ha/vigil/internal/election"
	"github.com/vigil-ha/vigil/internal/etcdcluster"
	"github.com/vigil-ha/vigil/internal/health"
	"github.com/vigil-ha/vigil/internal/lb"
	"github.com/vigil-ha/vigil/internal/observe"
	"github.com/vigil-ha/vigil/internal/validate"
)

// nodeMetrics are the daemon's own metrics; the balancer and the checker
// register theirs on the same registry.
type nodeMetrics struct {
	reg        *prometheus.Registry
	leader     prometheus.Gauge
	vipHeld    prometheus.Gauge
	leaderRuns prometheus.Counter
	yielding   prometheus.Gauge
	prunes     prometheus.Counter
	// transitions counts holder changes this node observed, its own
	// included; renew is the leader's lock renewal latency.
	transitions  prometheus.Counter
	renew        *prometheus.HistogramVec
	nodesDeleted prometheus.Counter
	// VIP fencing and conflicts.
	strays    prometheus.Counter
	restored  prometheus.Counter
	conflicts prometheus.Counter
	conflict  prometheus.Gauge
	// conflictUntracked counts conflicting hardware addresses past the cap.
	conflictUntracked prometheus.Counter
	// foreign counts etcd endpoints found answering for another cluster.
	foreign prometheus.Counter
	// lockOps is every operation on the election lock by op (get,
	// acquire, renew, release): vigil_etcd_request_duration_seconds with
	// the etcd election, vigil_lease_request_duration_seconds with the
	// Lease. atRisk shows that renewals run close to the deadline
	// (vigil_lock_renew_margin_seconds, registered with the elector, how
	// close).
	etcdOps  *prometheus.HistogramVec
	leaseOps *prometheus.HistogramVec
	atRisk   prometheus.Gauge
	// memberDown is how long this node has seen each etcd member
	// unreachable without a break.
	memberDown *prometheus.GaugeVec
}

func newNodeMetrics() *nodeMetrics {
	m := &nodeMetrics{
		reg: prometheus.NewRegistry(),
		leader: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "vigil_leader", Help: "1 while this node holds the election lock.",
		}),
		vipHeld: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "vigil_vip_held", Help: "1 while the VIP is configured on this node (with --bgp-mode ecmp: while this node advertises it).",
		}),
		leaderRuns: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vigil_leader_acquired_total", Help: "Times this node became leader.",
		}),
		yielding: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "vigil_placement_yielding", Help: "1 while this node leaves the VIP to a peer because its own API server fails its checks.",
		}),
		prunes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vigil_members_pruned_total", Help: "Dead etcd members removed by this node (--prune-after).",
		}),
		transitions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vigil_leader_transitions_total", Help: "Changes of the lock holder this node observed (its own included).",
		}),
		renew: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "vigil_lock_renew_duration_seconds",
			Help: "Time each lock renewal of the leader took, by result (ok or error).",
			// From a local etcd commit (~1 ms) to the renew deadline.
			Buckets: lockBuckets,
		}, []string{"result"}),
		nodesDeleted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vigil_nodes_deleted_total", Help: "Node objects of pruned members deleted by this node (--prune-delete-node).",
		}),
		strays: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vigil_vip_strays_removed_total", Help: "Times the VIP was found on this node while it did not hold the lock, and removed.",
		}),
		restored: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vigil_vip_restored_total", Help: "Times the VIP disappeared from this node while it held the lock, and was re-added.",
		}),
		conflicts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vigil_vip_conflicts_total", Help: "Hardware addresses seen answering for the VIP besides the holder's (one per conflict episode and address).",
		}),
		conflict: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "vigil_vip_conflict", Help: "1 while the last probe saw another hardware address answer for the VIP besides the holder's.",
		}),
		foreign: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vigil_etcd_foreign_endpoints_total", Help: "Times an etcd endpoint was found answering for another etcd cluster than the one vigil follows (an impostor at a member's address); its answers are refused.",
		}),
		conflictUntracked: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vigil_vip_conflict_macs_untracked_total", Help: "Hardware addresses answering for the VIP that were counted but not tracked: a probe keeps at most 64, an episode at most 64 (a flood of replies with random addresses).",
		}),
		etcdOps: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "vigil_etcd_request_duration_seconds",
			Help:    "Time each operation on the etcd election lock took, from start to answer, by op (get, acquire, renew, release) and result (ok, conflict, error).",
			Buckets: lockBuckets,
		}, []string{"op", "result"}),
		leaseOps: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "vigil_lease_request_duration_seconds",
			Help:    "Time each operation on the Kubernetes Lease took, from start to answer, by op (get, acquire, renew, release) and result (ok, conflict, error).",
			Buckets: lockBuckets,
		}, []string{"op", "result"}),
		atRisk: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "vigil_lease_at_risk",
			Help: "1 while the lock store answers renewals so late that less than a retry period of the lease is left: a little more latency and the VIP moves.",
		}),
		memberDown: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "vigil_member_unreachable_seconds",
			Help: "How long this node has seen each etcd member unreachable without a break (0 while it answers); the evidence this node publishes for pruning.",
		}, []string{"member"}),
	}
	m.renew.WithLabelValues("ok")
	m.renew.WithLabelValues("error")
	m.reg.MustRegister(m.leader, m.vipHeld, m.leaderRuns, m.yielding, m.prunes, m.transitions, m.renew, m.nodesDeleted,
		m.strays, m.restored, m.conflicts, m.conflict, m.conflictUntracked, m.foreign, m.memberDown, m.etcdOps, m.leaseOps, m.atRisk,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	observe.RegisterBuildInfo(m.reg)
	return m
}

// registerBGP adds the BGP speaker's gauges, read at each scrape.
func (m *nodeMetrics) registerBGP(sp *bgp.Speaker) {
	m.reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "vigil_bgp_sessions_established",
			Help: "BGP sessions established now (--announce bgp), with their BFD session up under --bgp-bfd; at 0 this node does not campaign, and a holder steps down.",
		}, func() float64 {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			n := 0
			for _, p := range sp.Peers(ctx) {
				if p.Established {
					n++
				}
			}
			return float64(n)
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "vigil_bgp_vip_advertised",
			Help: "1 while this node advertises the VIP's host route over BGP.",
		}, func() float64 { return boolGauge(sp.Advertised()) }),
	)
	if sp.Settings().BFD != "" {
		m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "vigil_bgp_bfd_sessions_up",
			Help: "BFD sessions to the BGP peers that are up now (--bgp-bfd); a peer whose BFD session is down counts as down.",
		}, func() float64 {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			n := 0
			for _, p := range sp.Peers(ctx) {
				if p.BFD == "up" {
					n++
				}
			}
			return float64(n)
		}))
	}
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// foreignWindow is how recently an endpoint must have answered for another
// cluster to count as one now (metric, /status).
const foreignWindow = time.Minute

// registerEtcd adds the gauges read from the etcd connection at each scrape.
func (m *nodeMetrics) registerEtcd(c *etcdcluster.Cluster) {
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "vigil_etcd_foreign_endpoints", Help: "etcd endpoints that answered for another etcd cluster than the one vigil follows within the last minute (their answers are refused).",
	}, func() float64 { return float64(len(c.Foreign(foreignWindow))) }))
}

// registerGuard adds vigil_guard_up, read from the guard at each scrape
// (the metric is absent without a guard).
func (m *nodeMetrics) registerGuard(g *guardProc) {
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "vigil_guard_up",
		Help: "1 while the VIP guard answers within its bound, 0 while it does not (stopped, starved or wedged: the node does not campaign, and a holder steps down).",
	}, func() float64 { return boolFloat(g.Eligible() == nil) }))
}

// registerElector adds the gauges read from the elector at each scrape.
func (m *nodeMetrics) registerElector(el *election.Elector) {
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "vigil_lock_renew_margin_seconds",
		Help: "How much of the lease was left when the leader's last renewal was answered (0 when not leading). Under a retry period the lease is at risk.",
	}, func() float64 {
		if st := el.Status(); st.Leader {
			return st.RenewMargin.Seconds()
		}
		return 0
	}))
}

// lockBuckets run from a local etcd commit (~1 ms) past the lease, with
// detail where a slow store meets the default renew deadline (500 ms).
var lockBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .15, .2, .3, .4, .45, .5, .75, 1, 2.5}

// lockOpObserver returns the elector's OnOp for the histogram of the
// election's backend.
func (m *nodeMetrics) lockOpObserver(lease bool) func(op string, took time.Duration, err error) {
	h := m.etcdOps
	if lease {
		h = m.leaseOps
	}
	return func(op string, took time.Duration, err error) {
		result := "ok"
		switch {
		case errors.Is(err, election.ErrConflict):
			result = "conflict"
		case err != nil:
			result = "error"
		}
		h.WithLabelValues(op, result).Observe(took.Seconds())
	}
}

func (m *nodeMetrics) observeRenew(took time.Duration, err error) {
	result := "ok"
	if err != nil {
		result = "error"
	}
	m.renew.WithLabelValues(result).Observe(took.Seconds())
}

// Report is what /status serves.
type Report struct {
	Node        string     `json:"node"`
	VIP         string     `json:"vip"`
	Leader      bool       `json:"leader"`
	Holder      string     `json:"holder"`
	LeaderSince *time.Time `json:"leaderSince,omitempty"`
	Yielding    bool       `json:"yielding"`
	// Backends are the API servers, and the first --lb-port's backends.
	Backends []BackendReport `json:"backends"`
	// Ports are the load-balanced ports after the first --lb-port.
	Ports []PortReport `json:"ports,omitempty"`
	// Discovery is what each backend source said last.
	Discovery []discovery.SourceState `json:"discovery,omitempty"`
	// HolderMAC is the hardware address the holder announces the VIP with.
	HolderMAC string `json:"holderMAC,omitempty"`
	// Ineligible says why this node does not campaign ("" when it does).
	Ineligible string `json:"ineligible,omitempty"`
	// Conflict is what the VIP conflict probes saw (--announce arp).
	Conflict ConflictReport `json:"conflict"`
	// BGP is each BGP session's state (--announce bgp), and Advertised
	// whether this node advertises the VIP's route now.
	BGP        []bgp.PeerState `json:"bgp,omitempty"`
	Advertised bool            `json:"advertised,omitempty"`
	// BGPSettings are the sessions' timers and the route's policy.
	BGPSettings *bgp.Settings `json:"bgpSettings,omitempty"`
	// ECMP, with --bgp-mode ecmp, says why this node advertises the VIP
	// or does not (Advertised says whether it does).
	ECMP string `json:"ecmp,omitempty"`
	// DNAT are the nftables rules in place on this node that send
	// VIP:--lb-port to --lb-listen-port (the holder's, with that flag).
	DNAT []string `json:"dnat,omitempty"`
	// Renewal is how the leader's renewals fare (nil when not leading).
	Renewal *RenewalReport `json:"renewal,omitempty"`
	// Etcd is the etcd cluster followed (nil without etcd).
	Etcd *EtcdReport `json:"etcd,omitempty"`
}

// EtcdReport names the etcd cluster vigil follows, and the endpoints that
// answered for another within the last minute.
type EtcdReport struct {
	ClusterID string          `json:"clusterID,omitempty"` // hex; empty until learned
	Foreign   []ForeignReport `json:"foreign,omitempty"`
}

// ForeignReport is an endpoint that answers for another etcd cluster.
type ForeignReport struct {
	Endpoint  string    `json:"endpoint"`
	ClusterID string    `json:"clusterID"`
	Answers   int64     `json:"answers"`
	Last      time.Time `json:"last"`
}

// RenewalReport says how close the leader's renewals run to its deadline.
type RenewalReport struct {
	// LatencyMillis is the last successful renewal's round trip.
	LatencyMillis float64 `json:"latencyMillis"`
	// MarginMillis is how much of the lease was left when it was
	// answered; MinMarginMillis the least of the last 10 s.
	MarginMillis    float64 `json:"marginMillis"`
	MinMarginMillis float64 `json:"minMarginMillis"`
	// RenewDeadlineMillis is the budget both are out of.
	RenewDeadlineMillis float64 `json:"renewDeadlineMillis"`
	// AtRisk says why the lease is at risk ("" when it is not).
	AtRisk string `json:"atRisk,omitempty"`
}

// PortReport is a load-balanced port after the first --lb-port: VIP:Port
// to BackendPort on each backend host, checked by Check (tcp, or an HTTPS
// path).
type PortReport struct {
	Port        int             `json:"port"`
	BackendPort int             `json:"backendPort"`
	Check       string          `json:"check"`
	Backends    []BackendReport `json:"backends"`
}

// BackendReport is one API server as this node sees it.
type BackendReport struct {
	Address     string `json:"address"`
	State       string `json:"state"`
	Cause       string `json:"cause,omitempty"`
	LastError   string `json:"lastError,omitempty"`
	Connections int    `json:"connections"`
}

// report is what /status serves now.
func (n *node) report() Report {
	cfg, etcd, sp, disc, pl := n.cfg, n.etcd, n.speaker, n.disc, n.pl
	st := n.el.Status()
	r := Report{Node: cfg.NodeName, VIP: cfg.VIPString(), Leader: st.Leader, Holder: st.Holder,
		HolderMAC: st.HolderMAC, Ineligible: st.Ineligible, Conflict: n.conflicts.Report()}
	if etcd != nil {
		r.Etcd = &EtcdReport{}
		if id := etcd.ClusterID(); id != 0 {
			r.Etcd.ClusterID = fmt.Sprintf("%x", id)
		}
		for _, f := range etcd.Foreign(foreignWindow) {
			r.Etcd.Foreign = append(r.Etcd.Foreign, ForeignReport{Endpoint: f.Endpoint, ClusterID: fmt.Sprintf("%x", f.ClusterID), Answers: f.Answers, Last: f.Last})
		}
	}
	if sp != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		r.BGP, r.Advertised = sp.Peers(ctx), sp.Advertised()
		cancel()
		set := sp.Settings()
		r.BGPSettings = &set
	}
	if n.ecmp != nil {
		r.ECMP = n.ecmp.Status()
	}
	if disc != nil {
		r.Discovery = disc.Sources()
	}
	if cfg.LBListenPort != 0 {
		rules, err := dnat.Installed()
		if err != nil {
			r.DNAT = []string{"cannot read: " + err.Error()}
		}
		for _, x := range rules {
			r.DNAT = append(r.DNAT, x.String())
		}
	}
	if st.Leader {
		r.LeaderSince = &st.LeaderSince
		r.Renewal = &RenewalReport{
			LatencyMillis: ms(st.RenewLatency), MarginMillis: ms(st.RenewMargin), MinMarginMillis: ms(st.RenewMarginMin),
			RenewDeadlineMillis: ms(cfg.RenewDeadline), AtRisk: st.AtRisk,
		}
	}
	if pl != nil {
		r.Yielding = pl.isYielding()
	}
	r.Backends = backendReports(n.checker, n.bal)
	for _, p := range n.more {
		r.Ports = append(r.Ports, PortReport{Port: p.spec.Port, BackendPort: p.spec.BackendPort, Check: p.spec.Check, Backends: backendReports(p.checker, p.bal)})
	}
	return r
}

// backendReports are checker's backends, with bal's connections to each
// (bal may be nil).
func backendReports(checker *health.Checker, bal *lb.Balancer) []BackendReport {
	conns := map[string]int{}
	if bal != nil {
		for _, b := range bal.Backends() {
			conns[b.Address] = b.Connections
		}
	}
	var out []BackendReport
	for _, s := range checker.Statuses() {
		b := BackendReport{Address: s.Backend, State: s.State.String(), Connections: conns[s.Backend]}
		if s.State == health.Down {
			b.Cause, b.LastError = s.Cause.String(), s.LastError
		}
		out = append(out, b)
	}
	return out
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// listenMetrics opens the metrics address at start.
func listenMetrics(addr string) (net.Listener, error) {
	ln, err := observe.Listen(addr, "`metricsAddress`")
	if err != nil {
		return nil, validate.Invalid(err)
	}
	return ln, nil
}
