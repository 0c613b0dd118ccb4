package manifest

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

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
