package manifest

import (
	"strconv"
	"strings"
	"testing"

	"github.com/vigil-ha/vigil"
)

// Every value the DaemonSet takes became a template expression: no marker
// is left for Helm to print as it is. (hack/release's tests render the
// chart with a real Helm and compare it with vigil manifest's output.)
func TestAgentChartTemplates(t *testing.T) {
	files, err := AgentChart()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"Chart.yaml", "values.yaml", "values.schema.json", "templates/daemonset.yaml", "templates/rbac.yaml", "templates/NOTES.txt", "README.md"} {
		if len(files[name]) == 0 {
			t.Errorf("the chart lacks %s", name)
		}
	}
	for name, b := range files {
		for _, mark := range []string{markServer, markImage, markListen, strconv.Itoa(markPort), "invalid"} {
			if strings.Contains(string(b), mark) {
				t.Errorf("%s still holds the marker %q", name, mark)
			}
		}
	}
	ds := string(files["templates/daemonset.yaml"])
	for _, want := range []string{".Values.server", ".Values.image", ".Values.apiserverListen", ".Values.metrics.port", "{{- if .Values.metrics.expose }}", "{{- end }}"} {
		if !strings.Contains(ds, want) {
			t.Errorf("templates/daemonset.yaml lacks %q", want)
		}
	}
	if !strings.Contains(string(files["Chart.yaml"]), "\nversion: "+vigil.Version+"\n") || !strings.Contains(string(files["values.yaml"]), "\nimage: "+DefaultImage+"\n") {
		t.Errorf("Chart.yaml or values.yaml is not this version's:\n%s\n%s", files["Chart.yaml"], files["values.yaml"])
	}
}
