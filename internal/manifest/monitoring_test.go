package manifest

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/vigil-ha/vigil/internal/validate"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// RequirePromtoolEnv makes a missing promtool a failure instead of a skip;
// hack/test.sh installs it (Debian's prometheus package) and sets it.
const RequirePromtoolEnv = "VIGIL_REQUIRE_PROMTOOL"

func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv(RequirePromtoolEnv) != "" {
			t.Fatalf("promtool not found (%s is set): apt-get install prometheus", RequirePromtoolEnv)
		}
		t.Skip("promtool not found: apt-get install prometheus (hack/test.sh does)")
	}
	return p
}

// alertTests is testdata/alerts_test.yaml as promtool reads it, the parts
// this test reads or fills in.
type alertTests struct {
	RuleFiles          []string `json:"rule_files"`
	EvaluationInterval string   `json:"evaluation_interval"`
	Tests              []struct {
		Name        string `json:"name"`
		Interval    string `json:"interval"`
		InputSeries []any  `json:"input_series"`
		AlertTests  []struct {
			EvalTime  string `json:"eval_time"`
			AlertName string `json:"alertname"`
			ExpAlerts []struct {
				ExpLabels      map[string]string `json:"exp_labels"`
				ExpAnnotations map[string]string `json:"exp_annotations,omitempty"`
			} `json:"exp_alerts"`
		} `json:"alert_rule_test"`
	} `json:"tests"`
}

var labelRef = regexp.MustCompile(`\{\{ \$labels\.([a-z_]+) \}\}`)

// TestAlerts runs the rules vigil manifest monitoring prints through the real
// promtool: check rules, then the unit tests of testdata/alerts_test.yaml,
// where every alert fires once and, with other series, does not once.
func TestAlerts(t *testing.T) {
	bin := promtool(t)
	rules := Rules("")
	b, err := yaml.Marshal(rules)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(bin, "check", "rules", filepath.Join(dir, "rules.yaml")).CombinedOutput(); err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}

	raw, err := os.ReadFile(filepath.Join("testdata", "alerts_test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var tests alertTests
	if err := yaml.UnmarshalStrict(raw, &tests); err != nil {
		t.Fatalf("testdata/alerts_test.yaml: %v", err)
	}
	byName := map[string]Alert{}
	for _, r := range rules.Groups[0].Rules {
		byName[r.Alert] = r
	}
	fires, quiet := map[string]bool{}, map[string]bool{}
	for i, tc := range tests.Tests {
		for j, at := range tc.AlertTests {
			r, ok := byName[at.AlertName]
			if !ok {
				t.Fatalf("test %q expects alert %s, which the rules do not have", tc.Name, at.AlertName)
			}
			if len(at.ExpAlerts) == 0 {
				quiet[at.AlertName] = true
				continue
			}
			fires[at.AlertName] = true
			// The annotations the alert must carry: the rule's, its
			// {{ $labels.X }} filled in from the expected labels.
			for k, e := range at.ExpAlerts {
				ann := map[string]string{}
				for name, tmpl := range r.Annotations {
					ann[name] = labelRef.ReplaceAllStringFunc(tmpl, func(ref string) string {
						return e.ExpLabels[labelRef.FindStringSubmatch(ref)[1]]
					})
				}
				tests.Tests[i].AlertTests[j].ExpAlerts[k].ExpAnnotations = ann
			}
		}
	}
	for _, r := range rules.Groups[0].Rules {
		if !fires[r.Alert] || !quiet[r.Alert] {
			t.Errorf("alert %s: a firing case %v, a quiet case %v in testdata/alerts_test.yaml; want both", r.Alert, fires[r.Alert], quiet[r.Alert])
		}
		if !strings.HasPrefix(r.Annotations["runbook_url"], DefaultRunbookURL+"#vigil") {
			t.Errorf("alert %s: runbook %q", r.Alert, r.Annotations["runbook_url"])
		}
	}
	filled, err := yaml.Marshal(tests)
	if err != nil {
		t.Fatal(err)
	}
	testFile := filepath.Join(dir, "alerts_test.yaml")
	if err := os.WriteFile(testFile, filled, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "test", "rules", testFile).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
	t.Logf("promtool test rules:\n%s", out)
}

// Every alert has its runbook: a section of docs/operations.md under the
// alert's name, which is what its runbook_url points at.
func TestAlertRunbooks(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	var headings []string
	for _, l := range strings.Split(string(doc), "\n") {
		if h, ok := strings.CutPrefix(l, "### "); ok {
			headings = append(headings, strings.TrimSpace(h))
		}
	}
	for _, r := range Rules("").Groups[0].Rules {
		if !slices.Contains(headings, r.Alert) {
			t.Errorf("docs/operations.md has no section \"### %s\", the runbook of alert %s", r.Alert, r.Alert)
		}
	}
}

// The dashboard is valid JSON with a query in every panel, and every query
// is PromQL the real promtool accepts (each checked as a recording rule).
func TestDashboard(t *testing.T) {
	bin := promtool(t)
	b, err := json.Marshal(Dashboard())
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Title  string `json:"title"`
		Panels []struct {
			ID      int    `json:"id"`
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	if d.Title != "vigil" || len(d.Panels) != len(DashboardPanels()) {
		t.Fatalf("dashboard %q with %d panels", d.Title, len(d.Panels))
	}
	var rules []map[string]string
	ids := map[int]bool{}
	for _, p := range d.Panels {
		if len(p.Targets) == 0 || ids[p.ID] {
			t.Errorf("panel %d %q: %d queries, id seen before %v", p.ID, p.Title, len(p.Targets), ids[p.ID])
		}
		ids[p.ID] = true
		for _, q := range p.Targets {
			rules = append(rules, map[string]string{"record": fmt.Sprintf("vigil:dashboard:%d", len(rules)), "expr": q.Expr})
		}
	}
	y, err := yaml.Marshal(map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": rules}}})
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(t.TempDir(), "dashboard.rules.yaml")
	if err := os.WriteFile(f, y, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(bin, "check", "rules", f).CombinedOutput(); err != nil {
		t.Fatalf("promtool check rules of the dashboard's queries: %v\n%s", err, out)
	}
}

// The PodMonitors select what the manifests run, by the port the manifests
// name when their metrics address is reachable.
func TestPodMonitorsSelectTheManifests(t *testing.T) {
	pod, err := Pod(PodOptions{VIPs: []string{"10.0.0.100/24"}, Interface: "eth0", MetricsAddress: "0.0.0.0:9558"})
	if err != nil {
		t.Fatal(err)
	}
	ds, err := DaemonSet(DaemonSetOptions{Server: "https://10.0.0.100:6443", MetricsAddress: "0.0.0.0:9559"})
	if err != nil {
		t.Fatal(err)
	}
	podLabels := map[string]map[string]string{DaemonName: pod.Labels, AgentName: ds.Spec.Template.Labels}
	ports := map[string][]corev1.ContainerPort{DaemonName: pod.Spec.Containers[0].Ports, AgentName: ds.Spec.Template.Spec.Containers[0].Ports}
	for _, o := range PodMonitors() {
		u := o.(*unstructured.Unstructured)
		want, _, _ := unstructured.NestedStringMap(u.Object, "spec", "selector", "matchLabels")
		for k, v := range want {
			if podLabels[u.GetName()][k] != v {
				t.Errorf("PodMonitor %s selects %s=%s; the pods have %v", u.GetName(), k, v, podLabels[u.GetName()])
			}
		}
		if !slices.ContainsFunc(ports[u.GetName()], func(p corev1.ContainerPort) bool { return p.Name == MetricsPortName }) {
			t.Errorf("PodMonitor %s scrapes port %q; the container has %+v", u.GetName(), MetricsPortName, ports[u.GetName()])
		}
	}
}

// --metrics-address in the manifests: passed on, probed where it listens,
// and a container port only where a Prometheus can reach it.
func TestMetricsAddress(t *testing.T) {
	for _, tc := range []struct {
		addr     string
		host     string
		port     int32
		withPort bool
	}{
		{"", "127.0.0.1", 9558, false},
		{"0.0.0.0:9558", "127.0.0.1", 9558, true},
		{"127.0.0.1:9600", "127.0.0.1", 9600, false},
		{"10.0.0.11:9600", "10.0.0.11", 9600, true},
		{"[::]:9558", "127.0.0.1", 9558, true},
	} {
		p, err := Pod(PodOptions{VIPs: []string{"10.0.0.100/24"}, Interface: "eth0", MetricsAddress: tc.addr})
		if err != nil {
			t.Fatalf("%q: %v", tc.addr, err)
		}
		c := p.Spec.Containers[0]
		g := c.LivenessProbe.HTTPGet
		if g.Host != tc.host || g.Port.IntVal != tc.port || (len(c.Ports) > 0) != tc.withPort {
			t.Errorf("%q: probe %s:%d, ports %+v", tc.addr, g.Host, g.Port.IntVal, c.Ports)
		}
		if has := strings.Contains(strings.Join(c.Args, " "), "--metrics-address "+tc.addr); has != (tc.addr != "") {
			t.Errorf("%q: args %v", tc.addr, c.Args)
		}
	}
	for _, bad := range []string{"9558", "eth0:9558", "0.0.0.0:0", "0.0.0.0"} {
		if _, err := Pod(PodOptions{VIPs: []string{"10.0.0.100/24"}, Interface: "eth0", MetricsAddress: bad}); !errors.Is(err, validate.ErrInvalid) {
			t.Errorf("pod --metrics-address %q: %v", bad, err)
		}
		if _, err := DaemonSet(DaemonSetOptions{Server: "https://10.0.0.100:6443", MetricsAddress: bad}); !errors.Is(err, validate.ErrInvalid) {
			t.Errorf("daemonset --metrics-address %q: %v", bad, err)
		}
	}
}
