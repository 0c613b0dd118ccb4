package main

import (
	"os/exec"
	"strings"
	"testing"
)

// The worker binary stays small only while it links neither client-go (and
// the API types it registers at start) nor gRPC and the etcd client: each
// cost the agent megabytes of resident memory (bench/agent/README.md). An
// import that brings one back fails here, before a benchmark would show it.
func TestLinksNoClientGoNorGRPC(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, pkg := range strings.Fields(string(out)) {
		for _, heavy := range []string{"k8s.io/client-go", "k8s.io/api/", "k8s.io/apimachinery", "google.golang.org/grpc", "go.etcd.io/etcd", "github.com/gogo/protobuf"} {
			if strings.HasPrefix(pkg, heavy) {
				t.Errorf("vigil-agent links %s", pkg)
			}
		}
	}
}
