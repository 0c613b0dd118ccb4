package config

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"github.com/vigil-ha/vigil/internal/validate"
	"sigs.k8s.io/yaml"
)

type settings struct {
	vip       string
	endpoints []string
	port      int
	lease     time.Duration
	guard     bool
	peers     []string
	metrics   string
}

func flags(s *settings) *pflag.FlagSet {
	fs := pflag.NewFlagSet("run", pflag.ContinueOnError)
	AddFlag(fs, "run")
	fs.StringVar(&s.vip, "vip", "", "")
	fs.StringSliceVar(&s.endpoints, "etcd-endpoints", nil, "")
	fs.IntVar(&s.port, "lb-port", 0, "")
	fs.DurationVar(&s.lease, "lease-duration", 800*time.Millisecond, "")
	fs.BoolVar(&s.guard, "guard", true, "")
	fs.StringArrayVar(&s.peers, "bgp-peer", nil, "")
	fs.StringVar(&s.metrics, "metrics-address", "127.0.0.1:9558", "")
	return fs
}

func write(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "vigil.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

const header = "apiVersion: vigil.dev/v1alpha1\nkind: VigilConfiguration\n"

func noEnv(string) string { return "" }

// The file sets what the command line left alone; the environment beats
// the file; the command line beats both.
func TestPrecedence(t *testing.T) {
	p := write(t, header+`run:
  vip: 10.0.0.100/24
  etcdEndpoints: [https://a:2379, https://b:2379]
  lbPort: 8443
  leaseDuration: 2s
  guard: false
  bgpPeer: ["10.0.0.1,65000", "10.0.0.2,65000"]
  metricsAddress: ""
agent:
  server: https://10.0.0.100:6443
`)
	var s settings
	fs := flags(&s)
	if err := fs.Parse([]string{"--config", p, "--lb-port", "9443"}); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"VIGIL_VIP": "10.0.0.200/24", "VIGIL_LB_PORT": "7443", "VIGIL_GUARD": "true"}
	if err := Apply(fs, SectionRun, func(k string) string { return env[k] }); err != nil {
		t.Fatal(err)
	}
	if s.vip != "10.0.0.200/24" {
		t.Errorf("vip = %q, want the environment's", s.vip)
	}
	if s.port != 9443 {
		t.Errorf("lb-port = %d, want the command line's 9443", s.port)
	}
	if !slices.Equal(s.endpoints, []string{"https://a:2379", "https://b:2379"}) {
		t.Errorf("etcd-endpoints = %v", s.endpoints)
	}
	if s.lease != 2*time.Second || s.guard || s.metrics != "" {
		t.Errorf("lease %v, guard %v (VIGIL_GUARD is no variable vigil reads), metrics %q", s.lease, s.guard, s.metrics)
	}
	if !slices.Equal(s.peers, []string{"10.0.0.1,65000", "10.0.0.2,65000"}) {
		t.Errorf("bgp-peer = %v", s.peers)
	}
	if !fs.Changed("lease-duration") {
		t.Error("a value from the file does not count as set")
	}
}

// Mistakes name the file and the key, and leave every flag as it was.
func TestErrors(t *testing.T) {
	for _, c := range []struct{ name, body, want string }{
		{"unknown key", header + "run:\n  vip: 10.0.0.1/24\n  leaseDurration: 2s\n", "unknown key run.leaseDurration"},
		{"flag name, not camelCase", header + "run:\n  lease-duration: 2s\n", "unknown key run.lease-duration"},
		{"config in the file", header + "run:\n  config: /x\n", "unknown key run.config"},
		{"unknown top-level field", header + "runn:\n  vip: x\n", `unknown field "runn"`},
		{"wrong kind", "apiVersion: vigil.dev/v1alpha1\nkind: Config\n", "want apiVersion vigil.dev/v1alpha1, kind VigilConfiguration"},
		{"wrong version", "apiVersion: vigil.dev/v1\nkind: VigilConfiguration\n", "want apiVersion vigil.dev/v1alpha1"},
		{"bad duration", header + "run:\n  vip: 10.0.0.1/24\n  leaseDuration: 2\n", `run.leaseDuration: --lease-duration "2"`},
		{"bad number", header + "run:\n  vip: 10.0.0.1/24\n  lbPort: 1.5\n", "want a whole number"},
		{"list for a single value", header + "run:\n  vip: [a, b]\n", "want a single value"},
		{"not YAML", "apiVersion: [", "vigil.yaml"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := write(t, c.body)
			var s settings
			fs := flags(&s)
			if err := fs.Parse([]string{"--config", p}); err != nil {
				t.Fatal(err)
			}
			err := Apply(fs, SectionRun, noEnv)
			if !errors.Is(err, validate.ErrInvalid) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Apply = %v, want validate.ErrInvalid saying %q", err, c.want)
			}
			if s.vip != "" || s.lease != 800*time.Millisecond || s.port != 0 {
				t.Fatalf("a refused file set flags: %+v", s)
			}
		})
	}
	var s settings
	fs := flags(&s)
	_ = fs.Parse([]string{"--config", "/nonexistent/vigil.yaml"})
	if err := Apply(fs, SectionRun, noEnv); !errors.Is(err, validate.ErrInvalid) || !strings.Contains(err.Error(), "/nonexistent/vigil.yaml") {
		t.Fatalf("missing file: %v", err)
	}
	fs = flags(&s)
	_ = fs.Parse(nil)
	if err := Apply(fs, SectionRun, func(k string) string { return map[string]string{"VIGIL_LB_PORT": "x"}[k] }); !errors.Is(err, validate.ErrInvalid) || !strings.Contains(err.Error(), "VIGIL_LB_PORT") {
		t.Fatalf("bad variable: %v", err)
	}
}

// The other command's section is that command's business.
func TestOtherSectionIgnored(t *testing.T) {
	p := write(t, header+"run:\n  vip: 10.0.0.1/24\nagent:\n  anything: 1\n")
	var s settings
	fs := flags(&s)
	_ = fs.Parse([]string{"--config", p})
	if err := Apply(fs, SectionRun, noEnv); err != nil || s.vip != "10.0.0.1/24" {
		t.Fatalf("Apply = %v, vip %q", err, s.vip)
	}
}

// What Defaults prints is a file Apply takes, and it changes nothing.
func TestDefaultsRoundTrip(t *testing.T) {
	var s settings
	b, err := yaml.Marshal(Defaults(map[Section]*pflag.FlagSet{SectionRun: flags(&s)}))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"leaseDuration: 800ms", "guard: true", "lbPort: 0", "etcdEndpoints: []", "metricsAddress: 127.0.0.1:9558"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("defaults lack %q:\n%s", want, b)
		}
	}
	p := write(t, string(b))
	var got settings
	fs := flags(&got)
	_ = fs.Parse([]string{"--config", p})
	if err := Apply(fs, SectionRun, noEnv); err != nil {
		t.Fatal(err)
	}
	var want settings
	_ = flags(&want).Parse(nil)
	if got.lease != want.lease || got.guard != want.guard || got.metrics != want.metrics || len(got.endpoints) != 0 || got.port != 0 {
		t.Fatalf("defaults read back = %+v, want %+v", got, want)
	}
}

func TestKeys(t *testing.T) {
	for flag, key := range map[string]string{"vip": "vip", "etcd-endpoints": "etcdEndpoints", "lb-max-conns-per-source": "lbMaxConnsPerSource"} {
		if Key(flag) != key || flagName(key) != flag {
			t.Errorf("Key(%q) = %q, flagName(%q) = %q", flag, Key(flag), key, flagName(key))
		}
	}
	if EnvName("etcd-endpoints") != "VIGIL_ETCD_ENDPOINTS" {
		t.Error(EnvName("etcd-endpoints"))
	}
}

// A flag that took one number and now takes several (--lb-port) still
// reads a file that gives it one number.
func TestNumberIntoListFlag(t *testing.T) {
	for body, want := range map[string][]string{
		"run:\n  lbPort: 6443\n":                  {"6443"},
		"run:\n  lbPort: [6443, \"9345:9345\"]\n": {"6443", "9345:9345"},
	} {
		var ports []string
		fs := pflag.NewFlagSet("run", pflag.ContinueOnError)
		AddFlag(fs, "run")
		fs.StringSliceVar(&ports, "lb-port", nil, "")
		if err := fs.Parse([]string{"--config", write(t, header+body)}); err != nil {
			t.Fatal(err)
		}
		if err := Apply(fs, SectionRun, noEnv); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(ports, want) {
			t.Errorf("%q: lb-port = %q, want %q", body, ports, want)
		}
	}
}
