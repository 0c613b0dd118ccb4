package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io/fs"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/klog/v2"

	"github.com/vigil-ha/vigil"
	"github.com/vigil-ha/vigil/internal/config"
	"github.com/vigil-ha/vigil/internal/manifest"
	"github.com/vigil-ha/vigil/internal/nstest"
)

// The real binary: --version and the version command print one line, the
// same one, with the release, the revision and the Go release.
func TestVersionFlag(t *testing.T) {
	bin := nstest.Binary(t, "vigil")
	flag, err := exec.Command(bin, "--version").Output()
	if err != nil {
		t.Fatalf("vigil --version: %v", err)
	}
	cmd, err := exec.Command(bin, "version").Output()
	if err != nil {
		t.Fatalf("vigil version: %v", err)
	}
	if string(flag) != string(cmd) {
		t.Fatalf("vigil --version printed %q, vigil version %q", flag, cmd)
	}
	re := regexp.MustCompile(`^vigil ` + regexp.QuoteMeta(vigil.Version) + ` \(revision ([0-9a-f]{40}(-dirty)?|unknown), go[0-9.a-z]+\)\n$`)
	if !re.Match(flag) {
		t.Fatalf("vigil --version printed %q, want %s", flag, re)
	}
	// hack/build.sh stamps the revision; CI's binary comes from it.
	if os.Getenv("VIGIL_BIN") != "" && strings.Contains(string(flag), "revision unknown") {
		t.Errorf("%s (from hack/build.sh) has no revision: %q", bin, flag)
	}
}

// client-go's klog lines come out through vigil's logger, in its format.
func TestKlogGoesThroughSlog(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr := os.Stderr
	os.Stderr = w
	_, err = newLogger("info", "json")
	os.Stderr = stderr
	if err != nil {
		t.Fatal(err)
	}
	defer klog.ClearLogger()
	klog.InfoS("from client-go", "key", "value")
	klog.Flush()
	w.Close()
	line, err := bufio.NewReader(r).ReadString('\n')
	if err != nil {
		t.Fatalf("nothing logged: %v", err)
	}
	var rec map[string]any
	if err := json.Unmarshal([]byte(line), &rec); err != nil {
		t.Fatalf("klog's line is not vigil's JSON: %q", line)
	}
	if rec["msg"] != "from client-go" || rec["key"] != "value" || rec["level"] != "INFO" {
		t.Fatalf("klog's line = %v", rec)
	}
}

// What print-defaults prints, both commands read back: each then stops at
// the first setting that has no default (the VIP, the server), not at the
// file.
func TestPrintDefaultsReadsBack(t *testing.T) {
	bin := nstest.Binary(t, "vigil")
	out, err := exec.Command(bin, "config", "print-defaults").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"apiVersion: vigil.dev/v1alpha1\n", "kind: VigilConfiguration\n", "\nrun:\n", "\nagent:\n", "  leaseDuration: 800ms\n", "  nodeName: \"\"\n"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("print-defaults lacks %q", want)
		}
	}
	file := filepath.Join(t.TempDir(), "defaults.yaml")
	if err := os.WriteFile(file, out, 0o600); err != nil {
		t.Fatal(err)
	}
	for cmd, want := range map[string]string{"run": "--vip is required", "agent": "--server is required"} {
		b, err := exec.Command(bin, cmd, "--config", file).CombinedOutput()
		if err == nil || !strings.Contains(string(b), want) {
			t.Errorf("vigil %s --config <defaults> = %v, %q; want it to stop at %q", cmd, err, b, want)
		}
		// One section alone (the Debian packages' files): the other's
		// key is absent, and the command reads it the same.
		one, err := exec.Command(bin, "config", "print-defaults", "--section", cmd).Output()
		if err != nil {
			t.Fatal(err)
		}
		other := map[string]string{"run": "\nagent:\n", "agent": "\nrun:\n"}[cmd]
		if !strings.Contains(string(one), "\n"+cmd+":\n") || strings.Contains(string(one), other) {
			t.Errorf("print-defaults --section %s:\n%s", cmd, one)
		}
		path := filepath.Join(t.TempDir(), cmd+".yaml")
		if err := os.WriteFile(path, one, 0o600); err != nil {
			t.Fatal(err)
		}
		if b, err := exec.Command(bin, cmd, "--config", path).CombinedOutput(); err == nil || !strings.Contains(string(b), want) {
			t.Errorf("vigil %s --config <its section> = %v, %q; want it to stop at %q", cmd, err, b, want)
		}
	}
}

// print-env lists, commented out, exactly the variables each command reads
// (the Debian packages' /etc/default files).
func TestPrintEnvListsEachVariable(t *testing.T) {
	bin := nstest.Binary(t, "vigil")
	for _, sec := range []config.Section{config.SectionRun, config.SectionAgent} {
		out, err := exec.Command(bin, "config", "print-env", "--section", string(sec)).Output()
		if err != nil {
			t.Fatalf("print-env --section %s: %v", sec, err)
		}
		var got, want []string
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			switch {
			case strings.HasPrefix(line, "#VIGIL_"):
				got = append(got, strings.TrimSuffix(strings.TrimPrefix(line, "#"), "="))
			case strings.HasPrefix(line, "# "):
			default:
				t.Errorf("print-env --section %s: line %q is neither a comment nor a variable", sec, line)
			}
		}
		for _, flag := range config.Env[sec] {
			want = append(want, config.EnvName(flag))
		}
		if !slices.Equal(got, want) {
			t.Errorf("print-env --section %s lists %v, want %v", sec, got, want)
		}
	}
}

// manifest chart writes the chart internal/manifest renders, file for file,
// and refuses a directory that holds anything, leaving it as it was.
func TestManifestChartWritesTheChart(t *testing.T) {
	bin := nstest.Binary(t, "vigil")
	dir := filepath.Join(t.TempDir(), "vigil-agent")
	if out, err := exec.Command(bin, "manifest", "chart", "--out", dir).CombinedOutput(); err != nil {
		t.Fatalf("manifest chart: %v\n%s", err, out)
	}
	want, err := manifest.AgentChart()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]byte{}
	if err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		got[filepath.ToSlash(rel)], err = os.ReadFile(path)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if !maps.EqualFunc(got, want, bytes.Equal) {
		t.Errorf("manifest chart wrote %v, want %v", slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(want)))
	}
	out, err := exec.Command(bin, "manifest", "chart", "--out", dir).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "is not empty") {
		t.Errorf("manifest chart into a full directory = %v, %q; want a refusal", err, out)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "Chart.yaml")); err != nil || !bytes.Equal(b, want["Chart.yaml"]) {
		t.Errorf("the refused run changed Chart.yaml: %v", err)
	}
}

// The units in deploy/systemd pass systemd's own check, pointed at the
// real binaries.
func TestSystemdUnitsVerify(t *testing.T) {
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze is not installed (Debian package systemd); the unit files are not checked")
	}
	bin := nstest.Binary(t, "vigil")
	agentBin := filepath.Join(filepath.Dir(bin), "vigil-agent")
	if _, err := os.Stat(agentBin); err != nil {
		agentBin = bin // vigil agent is the same command
	}
	dir := t.TempDir()
	config := map[string]string{"vigil.service": "--config /etc/vigil/config.yaml", "vigil-agent.service": "--config /etc/vigil/agent.yaml"}
	for unit, exe := range map[string]string{"vigil.service": bin, "vigil-agent.service": agentBin} {
		b, err := os.ReadFile(filepath.Join("..", "..", "deploy", "systemd", unit))
		if err != nil {
			t.Fatal(err)
		}
		text := string(b)
		for _, want := range []string{"Type=notify", "WatchdogSec=", config[unit]} {
			if !strings.Contains(text, want) {
				t.Errorf("%s lacks %q", unit, want)
			}
		}
		text = regexp.MustCompile(`/usr/local/bin/vigil(-agent)?`).ReplaceAllString(text, exe)
		path := filepath.Join(dir, unit)
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(analyze, "verify", path).CombinedOutput()
		if err != nil || len(strings.TrimSpace(string(out))) > 0 {
			t.Errorf("systemd-analyze verify %s: %v\n%s", unit, err, out)
		}
	}
}

// Under a Type=notify unit the real binary says READY=1, pings the
// watchdog at half WATCHDOG_USEC, and says STOPPING=1 when stopped.
func TestSystemdNotify(t *testing.T) {
	bin := nstest.Binary(t, "vigil")
	dir := t.TempDir()
	sock := filepath.Join(dir, "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cmd := exec.Command(bin, "agent", "--server", "https://127.0.0.1:1", "--apiserver-listen", "127.0.0.1:0",
		"--metrics-address", "", "--cache-dir", filepath.Join(dir, "cache"))
	cmd.Env = append(os.Environ(), "NOTIFY_SOCKET="+sock, "WATCHDOG_USEC=200000")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	got := map[string]int{}
	buf := make([]byte, 512)
	deadline := time.Now().Add(10 * time.Second)
	_ = conn.SetReadDeadline(deadline)
	for got["READY=1"] == 0 || got["WATCHDOG=1"] < 3 {
		n, err := conn.Read(buf)
		if err != nil {
			t.Fatalf("after %v: %v", got, err)
		}
		got[string(buf[:n])]++
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for got["STOPPING=1"] == 0 {
		n, err := conn.Read(buf)
		if err != nil {
			t.Fatalf("no STOPPING=1 after SIGTERM: %v (got %v)", err, got)
		}
		got[string(buf[:n])]++
	}
}

// Libraries name settings, not flags: no error built in internal/ (the
// lab's own tool aside) names one of vigil's flags, and every setting an
// error names in backquotes is the key of a flag of vigil or vigil-agent,
// which config.FlagNames turns into that flag when the command reports it.
func TestLibrariesNameSettingsNotFlags(t *testing.T) {
	flags := map[string]bool{}
	keys := map[string]bool{}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		c.Flags().VisitAll(func(f *pflag.Flag) { flags[f.Name], keys[config.Key(f.Name)] = true, true })
		c.PersistentFlags().VisitAll(func(f *pflag.Flag) { flags[f.Name], keys[config.Key(f.Name)] = true, true })
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(newRoot())
	delete(flags, "help")
	construction := regexp.MustCompile(`(Errorf|errors\.New)\(`)
	literal := regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	flagRef := regexp.MustCompile(`(?:^|[^\w-])--([a-z][a-z0-9-]*[a-z0-9])`)
	settingRef := regexp.MustCompile("`([a-z][A-Za-z0-9]*)`")
	root := filepath.Join("..", "..", "internal")
	checked := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") ||
			strings.HasPrefix(path, filepath.Join(root, "lab")+string(filepath.Separator)) {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for i, line := range strings.Split(string(b), "\n") {
			if !construction.MatchString(line) || strings.HasPrefix(strings.TrimSpace(line), "//") {
				continue
			}
			checked++
			for _, lit := range literal.FindAllString(line, -1) {
				for _, m := range flagRef.FindAllStringSubmatchIndex(lit, -1) {
					name, before := lit[m[2]:m[3]], lit[:m[2]]
					// A command line to run (vigil handoff --release), or
					// etcd's own flag, is no setting of this command.
					if strings.Contains(before, "vigil ") || strings.HasSuffix(before, "etcd's --") {
						continue
					}
					if flags[name] {
						t.Errorf("%s:%d: an error names the flag --%s; name the setting, `%s`", path, i+1, name, config.Key(name))
					}
				}
				for _, m := range settingRef.FindAllStringSubmatch(lit, -1) {
					if !keys[m[1]] {
						t.Errorf("%s:%d: an error names `%s`, which is no flag's key", path, i+1, m[1])
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 100 {
		t.Fatalf("only %d error constructions found under %s", checked, root)
	}
	// And the command shows them as its flags.
	if got := config.FlagNames("invalid configuration: `leaseDuration` 1s is not above `renewDeadline` 2s; `notAFlag` stays", newRoot()); got != "invalid configuration: --lease-duration 1s is not above --renew-deadline 2s; `notAFlag` stays" {
		t.Fatalf("FlagNames: %q", got)
	}
}
