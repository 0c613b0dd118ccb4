package manifest

import (
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
)

// DefaultRunbookURL is where each alert's runbook lives: a section of
// docs/operations.md, one per alert, named after it.
const DefaultRunbookURL = "https://github.com/vigil-ha/vigil/blob/main/docs/operations.md"

// Alert is one of vigil's alerting rules, as Prometheus reads it.
type Alert struct {
	Alert       string            `json:"alert"`
	Expr        string            `json:"expr"`
	For         string            `json:"for,omitempty"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

// RuleGroup is a group of rules in a Prometheus rules file.
type RuleGroup struct {
	Name  string  `json:"name"`
	Rules []Alert `json:"rules"`
}

// RuleFile is a Prometheus rules file (promtool check rules reads it).
type RuleFile struct {
	Groups []RuleGroup `json:"groups"`
}

// alert builds a rule; its runbook is the section of runbook named after
// it (GitHub's anchor: the heading in lower case).
func alert(name, severity, forDur, expr, summary, description, runbook string) Alert {
	return Alert{
		Alert:  name,
		Expr:   expr,
		For:    forDur,
		Labels: map[string]string{"severity": severity},
		Annotations: map[string]string{
			"summary":     summary,
			"description": description,
			"runbook_url": runbook + "#" + strings.ToLower(name),
		},
	}
}

// Rules are vigil's alerts. The metrics come from vigil run (no upstream
// label) and vigil agent (upstream="apiserver" or "etcd"); the rules assume
// one Prometheus per cluster, or the cluster's series apart by their own
// labels. runbook is the runbooks' page (DefaultRunbookURL when empty).
func Rules(runbook string) RuleFile {
	if runbook == "" {
		runbook = DefaultRunbookURL
	}
	a := func(name, severity, forDur, expr, summary, description string) Alert {
		return alert(name, severity, forDur, expr, summary, description, runbook)
	}
	return RuleFile{Groups: []RuleGroup{{Name: "vigil", Rules: []Alert{
		a("VigilNoVIPHolder", "critical", "15s",
			`sum(vigil_vip_held) == 0 or absent(vigil_vip_held)`,
			"No node holds the control-plane VIP",
			"No vigil run reports the VIP (or none is scraped): clients of the VIP cannot reach the API servers. A failover takes about a second; this has lasted longer."),
		a("VigilVIPConflict", "critical", "10s",
			`max by (instance) (vigil_vip_conflict) > 0`,
			"Another machine answers for the VIP",
			"{{ $labels.instance }}'s probes see a hardware address other than the holder's answer for the VIP: clients may be sent to a machine that is not the control plane (vigil status names the MAC)."),
		a("VigilMoreThanOneHolder", "critical", "10s",
			`sum(vigil_leader) > 1`,
			"More than one node claims to hold the election lock",
			"Several vigil run processes report vigil_leader 1. The lock allows one holder: this is a fault (a partitioned holder that has not stepped down, or two clusters sharing one lock key)."),
		a("VigilRenewalsNearDeadline", "warning", "1m",
			`max by (instance) (vigil_lease_at_risk) > 0`,
			"The holder's renewals are answered near the lease's end",
			"{{ $labels.instance }} renews its lock with less than a retry period of the lease left: a little more latency in the lock store and the VIP moves."),
		a("VigilLockStoreSlow", "warning", "5m",
			`histogram_quantile(0.99, sum by (instance, le) (rate({__name__=~"vigil_(etcd|lease)_request_duration_seconds_bucket", op="renew"}[5m]))) > 0.3`,
			"The lock store answers renewals slowly",
			"On {{ $labels.instance }}, 1 % of the lock renewals took more than 300 ms over 5 minutes; vigil keeps the VIP through answers up to 400 ms at the default timings."),
		a("VigilNoHealthyBackend", "critical", "30s",
			`(max by (instance) (vigil_lb_backends_usable{upstream=""}) == 0) and on (instance) (max by (instance) (vigil_vip_held) == 1)`,
			"The VIP's load balancer has no healthy API server",
			"The node holding the VIP ({{ $labels.instance }}) finds no API server passing its health checks: it forwards to any of them as a last resort."),
		a("VigilBackendFlapping", "warning", "0s",
			`changes(vigil_lb_backend_up[15m]) > 6`,
			"An API server goes in and out of the load balancer",
			"{{ $labels.backend }} changed state more than 6 times in 15 minutes on {{ $labels.instance }}."),
		a("VigilMemberPruned", "warning", "0s",
			`increase(vigil_members_pruned_total[15m]) > 0`,
			"vigil removed an etcd member",
			"{{ $labels.instance }} pruned a member the cluster agreed was gone (--prune-after). Replace the node (docs/operations.md)."),
		a("VigilNodeDeleted", "warning", "0s",
			`increase(vigil_nodes_deleted_total[15m]) > 0`,
			"vigil deleted a pruned member's Node",
			"{{ $labels.instance }} deleted the Node of a pruned etcd member (--prune-delete-node)."),
		a("VigilBGPSessionDown", "warning", "2m",
			`vigil_bgp_sessions_established < max_over_time(vigil_bgp_sessions_established[1h])`,
			"A BGP session of vigil is down",
			"{{ $labels.instance }} has fewer BGP sessions established than in the last hour; with none it does not campaign, and as holder it steps down."),
		a("VigilGuardNotAnswering", "critical", "30s",
			`vigil_guard_up == 0`,
			"A node's VIP guard does not answer",
			"The guard beside {{ $labels.instance }} is stopped, starved or wedged: the node does not campaign, since nothing would remove its VIP if vigil stopped."),
		a("VigilAgentNoUsableBackend", "critical", "1m",
			`max by (instance, upstream) (vigil_lb_backends_usable{upstream!=""}) == 0`,
			"A worker agent has no usable control-plane backend",
			"The agent on {{ $labels.instance }} finds no {{ $labels.upstream }} backend passing its checks: the worker's kubelet (or etcd clients) may lose the control plane."),
	}}}}
}

// PrometheusRule is Rules as the Prometheus Operator's PrometheusRule in
// kube-system.
func PrometheusRule(runbook string) runtime.Object {
	rules := Rules(runbook)
	groups := make([]any, 0, len(rules.Groups))
	for _, g := range rules.Groups {
		rs := make([]any, 0, len(g.Rules))
		for _, r := range g.Rules {
			m := map[string]any{"alert": r.Alert, "expr": r.Expr, "labels": toAny(r.Labels), "annotations": toAny(r.Annotations)}
			if r.For != "" {
				m["for"] = r.For
			}
			rs = append(rs, m)
		}
		groups = append(groups, map[string]any{"name": g.Name, "rules": rs})
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "monitoring.coreos.com/v1",
		"kind":       "PrometheusRule",
		"metadata": map[string]any{
			"name":      DaemonName,
			"namespace": Namespace,
			"labels":    map[string]any{appLabel: DaemonName},
		},
		"spec": map[string]any{"groups": groups},
	}}
}

// PodMonitors are the Prometheus Operator's PodMonitors for vigil run's
// static pods and the agent's DaemonSet: the container port named
// MetricsPortName, which the manifests declare when given a
// --metrics-address Prometheus can reach. Each target's instance label is
// its node's name, which the alerts name.
func PodMonitors() []runtime.Object {
	pm := func(name string) runtime.Object {
		return &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "monitoring.coreos.com/v1",
			"kind":       "PodMonitor",
			"metadata": map[string]any{
				"name":      name,
				"namespace": Namespace,
				"labels":    map[string]any{appLabel: name},
			},
			"spec": map[string]any{
				"selector":          map[string]any{"matchLabels": map[string]any{appLabel: name}},
				"namespaceSelector": map[string]any{"matchNames": []any{Namespace}},
				"podMetricsEndpoints": []any{map[string]any{
					"port": MetricsPortName,
					"relabelings": []any{map[string]any{
						"sourceLabels": []any{"__meta_kubernetes_pod_node_name"},
						"targetLabel":  "instance",
					}},
				}},
			},
		}}
	}
	return []runtime.Object{pm(DaemonName), pm(AgentName)}
}

// Panel is one graph of the Grafana dashboard: a title and the queries it
// draws.
type Panel struct {
	Title string
	Unit  string // Grafana's unit: "short", "s", "bool"
	Exprs []string
}

// DashboardPanels are the dashboard's graphs, in order.
func DashboardPanels() []Panel {
	return []Panel{
		{"VIP held, by node", "bool", []string{`max by (instance) (vigil_vip_held)`}},
		{"Election lock held, by node", "bool", []string{`max by (instance) (vigil_leader)`}},
		{"Holder changes (5 min)", "short", []string{`max(increase(vigil_leader_transitions_total[5m]))`}},
		{"Lock renewal time, p99", "s", []string{`histogram_quantile(0.99, sum by (instance, le) (rate({__name__=~"vigil_(etcd|lease)_request_duration_seconds_bucket", op="renew"}[5m])))`}},
		{"Lease left at each renewal's answer", "s", []string{`vigil_lock_renew_margin_seconds > 0`}},
		{"Usable API servers behind the VIP", "short", []string{`max by (instance) (vigil_lb_backends_usable{upstream=""})`}},
		{"Connections through the VIP", "short", []string{`sum by (instance) (vigil_lb_connections_active{upstream=""})`}},
		{"Guard answering, by node", "bool", []string{`vigil_guard_up`}},
		{"BGP sessions established, by node", "short", []string{`vigil_bgp_sessions_established`}},
		{"VIP conflicts", "short", []string{`max by (instance) (vigil_vip_conflict)`}},
		{"Agents with no usable API server", "short", []string{`count(max by (instance) (vigil_lb_backends_usable{upstream="apiserver"}) == 0) or vector(0)`}},
		{"etcd members unreachable, as each node sees them", "s", []string{`max by (instance, member) (vigil_member_unreachable_seconds) > 0`}},
	}
}

// Dashboard is a Grafana dashboard (JSON model) of DashboardPanels, two
// panels a row, on a data source chosen at import (${DS_PROMETHEUS}).
func Dashboard() map[string]any {
	var panels []any
	for i, p := range DashboardPanels() {
		var targets []any
		for j, e := range p.Exprs {
			targets = append(targets, map[string]any{
				"refId": string(rune('A' + j)), "expr": e, "legendFormat": "__auto",
				"datasource": map[string]any{"type": "prometheus", "uid": "${DS_PROMETHEUS}"},
			})
		}
		panels = append(panels, map[string]any{
			"id": i + 1, "type": "timeseries", "title": p.Title,
			"gridPos":     map[string]any{"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i / 2)},
			"datasource":  map[string]any{"type": "prometheus", "uid": "${DS_PROMETHEUS}"},
			"fieldConfig": map[string]any{"defaults": map[string]any{"unit": p.Unit}, "overrides": []any{}},
			"targets":     targets,
		})
	}
	return map[string]any{
		"__inputs": []any{map[string]any{
			"name": "DS_PROMETHEUS", "label": "Prometheus", "type": "datasource", "pluginId": "prometheus", "pluginName": "Prometheus",
		}},
		"title":         "vigil",
		"uid":           "vigil",
		"tags":          []any{"vigil", "kubernetes", "control-plane"},
		"timezone":      "browser",
		"schemaVersion": 39,
		"refresh":       "30s",
		"time":          map[string]any{"from": "now-1h", "to": "now"},
		"panels":        panels,
	}
}

func toAny(m map[string]string) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
