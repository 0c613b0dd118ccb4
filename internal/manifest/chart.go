package manifest

import (
	"fmt"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/runtime"

	"github.com/vigil-ha/vigil"
)

// The worker agent's Helm chart. Its templates are not written by hand:
// they are the DaemonSet and RBAC that vigil manifest prints, rendered by
// DaemonSet and AgentRBAC with a marker in place of each value, and each
// marker then replaced by the value's template expression. So the chart and
// vigil manifest daemonset cannot disagree on anything but the values, and
// hack/release's tests render both with the same values and compare them.
//
// The chart's values are the flags of vigil manifest daemonset:
//
//	server           --server (required)
//	image            --image
//	apiserverListen  --apiserver-listen
//	metrics.expose   --metrics-address 0.0.0.0:<metrics.port>, a port for a
//	                 PodMonitor to scrape; false: 127.0.0.1:<metrics.port>
//	metrics.port     the port of --metrics-address (default 9559)
//
// Like vigil manifest's, the chart's objects are in kube-system and
// default (the EndpointSlices' Role), whatever namespace the release is
// installed in.

// Markers: values DaemonSet accepts and no real manifest holds.
const (
	markServer = "https://vigil-chart-server.invalid:6443"
	markImage  = "vigil-chart-image.invalid/vigil:marker"
	markListen = "127.0.0.253:46253"
	markPort   = 46254
)

// AgentChartName names the chart.
const AgentChartName = AgentName

// AgentChart returns the chart's files by their paths inside the chart
// directory (Chart.yaml, values.yaml, values.schema.json, templates/...),
// for this version of vigil.
func AgentChart() (map[string][]byte, error) {
	version := vigil.Version
	variants := map[string]string{ // --metrics-address for each branch
		"default":  "",
		"loopback": fmt.Sprintf("127.0.0.1:%d", markPort),
		"exposed":  fmt.Sprintf("0.0.0.0:%d", markPort),
	}
	rendered := map[string]string{}
	for name, addr := range variants {
		d, err := DaemonSet(DaemonSetOptions{Server: markServer, Image: markImage, Listen: markListen, MetricsAddress: addr})
		if err != nil {
			return nil, fmt.Errorf("the chart's DaemonSet: %w", err)
		}
		t, err := template(d)
		if err != nil {
			return nil, err
		}
		rendered[name] = t
	}
	daemonset := "{{- if .Values.metrics.expose }}\n" + rendered["exposed"] +
		fmt.Sprintf("{{- else if ne (int .Values.metrics.port) %d }}\n", metricsPortAgent) + rendered["loopback"] +
		"{{- else }}\n" + rendered["default"] + "{{- end }}\n"
	rbac, err := YAML("", AgentRBAC()...)
	if err != nil {
		return nil, err
	}
	header := "# Generated from vigil's internal/manifest (AgentChart): edit that, not this.\n"
	return map[string][]byte{
		"Chart.yaml":               []byte(chartYAML(version)),
		"values.yaml":              []byte(valuesYAML(version)),
		"values.schema.json":       []byte(valuesSchema),
		"templates/daemonset.yaml": []byte(header + daemonset),
		"templates/rbac.yaml":      append([]byte(header), rbac...),
		"templates/NOTES.txt":      []byte(notes),
		"README.md":                []byte(readme(version)),
	}, nil
}

// template is obj as YAML with every marker replaced by its value's
// expression; a marker that is missing means the DaemonSet no longer uses
// that value, which the chart would then silently ignore: an error.
func template(obj runtime.Object) (string, error) {
	b, err := YAML("", obj)
	if err != nil {
		return "", err
	}
	s := string(b)
	port := strconv.Itoa(markPort)
	for _, r := range []struct {
		mark, expr string
		required   bool
	}{
		{markServer, `{{ required "server is required: the API server URL, such as https://10.0.0.100:6443" .Values.server | quote }}`, true},
		{markImage, `{{ .Values.image | quote }}`, true},
		{markListen, `{{ .Values.apiserverListen | quote }}`, true},
		{"0.0.0.0:" + port, `{{ printf "0.0.0.0:%d" (int .Values.metrics.port) | quote }}`, false},
		{"127.0.0.1:" + port, `{{ printf "127.0.0.1:%d" (int .Values.metrics.port) | quote }}`, false},
		{port, `{{ int .Values.metrics.port }}`, false},
	} {
		if r.required && !strings.Contains(s, r.mark) {
			return "", fmt.Errorf("the chart's DaemonSet no longer holds the value %q", r.mark)
		}
		// The value as yaml wrote it: quoted or not.
		s = strings.NewReplacer(`"`+r.mark+`"`, r.expr, `'`+r.mark+`'`, r.expr, r.mark, r.expr).Replace(s)
	}
	return s, nil
}

func chartYAML(version string) string {
	return fmt.Sprintf(`apiVersion: v2
name: %s
description: vigil-agent on every worker, a DaemonSet with stable local endpoints for the API server
type: application
version: %s
appVersion: %q
home: https://github.com/vigil-ha/vigil
sources:
  - https://github.com/vigil-ha/vigil
keywords:
  - kubernetes
  - control-plane
  - high-availability
`, AgentChartName, version, version)
}

func valuesYAML(version string) string {
	return fmt.Sprintf(`# Each value is a flag of vigil manifest daemonset, which prints the same
# objects for the same values.

# --server: the API server URL the agents start from, https://VIP:PORT
# (required).
server: ""

# --image: vigil's image, by default this release's, pinned by tag.
image: %s

# --apiserver-listen: the local API server endpoint on each worker.
apiserverListen: 127.0.0.1:6443

metrics:
  # true: --metrics-address 0.0.0.0:<port>, with a container port named
  # metrics that vigil manifest monitoring's PodMonitor scrapes.
  # false: 127.0.0.1:<port>, reachable from the node only.
  expose: false
  port: %d
`, DefaultImage, metricsPortAgent)
}

// The schema Helm checks the values against before it renders anything.
const valuesSchema = `{
  "$schema": "https://json-schema.org/draft-07/schema#",
  "type": "object",
  "additionalProperties": false,
  "required": ["server"],
  "properties": {
    "server": {
      "type": "string",
      "pattern": "^(|https://[^/?#]+(/.*)?)$",
      "description": "--server: the API server URL, https://VIP:PORT"
    },
    "image": {"type": "string", "minLength": 1},
    "apiserverListen": {
      "type": "string",
      "pattern": "^(\\[[0-9a-fA-F:.]+\\]|[0-9.]+):[0-9]{1,5}$",
      "description": "--apiserver-listen: IP:PORT"
    },
    "metrics": {
      "type": "object",
      "additionalProperties": false,
      "properties": {
        "expose": {"type": "boolean"},
        "port": {"type": "integer", "minimum": 1, "maximum": 65535}
      }
    }
  }
}
`

const notes = `vigil-agent runs on every node that is not labelled control-plane, with
the local API server endpoint https://{{ .Values.apiserverListen }} for the
clients that start after it (kube-proxy, CNI). A kubelet that should use
it needs the agent as a static pod or systemd unit: docs/agent.md.
`

func readme(version string) string {
	return fmt.Sprintf(`# vigil-agent %s

The worker agent of vigil as a DaemonSet, with the RBAC it needs.

    helm install vigil-agent vigil-agent-%s.tgz --set server=https://10.0.0.100:6443

The chart renders exactly what `+"`vigil manifest daemonset`"+` and the agent's
part of `+"`vigil manifest rbac`"+` print for the same values (values.yaml
names the flag of each). Its objects go to kube-system, whatever namespace
the release is installed in.
`, version, version)
}
