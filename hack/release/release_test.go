package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// The tests run hack/release.sh and hack/verify-release.sh as a user
// would, on this checkout. hack/test.sh sets VIGIL_REQUIRE_RELEASE=1 so
// that nothing here skips in CI.

func repo(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

func version(t *testing.T) string {
	b, err := os.ReadFile(filepath.Join(repo(t), "VERSION"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// runScript runs a script of hack/ and returns its exit code and output.
func runScript(t *testing.T, env []string, name string, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command("bash", append([]string{filepath.Join(repo(t), "hack", name)}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0, string(out)
	case errors.As(err, &exit):
		return exit.ExitCode(), string(out)
	}
	t.Fatalf("%s: %v", name, err)
	return 0, ""
}

func need(t *testing.T, cmds ...string) {
	t.Helper()
	for _, c := range cmds {
		if _, err := exec.LookPath(c); err != nil {
			if os.Getenv("VIGIL_REQUIRE_RELEASE") != "" {
				t.Fatalf("%s is not installed, and VIGIL_REQUIRE_RELEASE is set (hack/test.sh installs it)", c)
			}
			t.Skipf("%s is not installed (hack/deps.sh %s installs it)", c, c)
		}
	}
}

// Bad input stops the script before it builds or removes anything.
func TestReleaseRefusesBadInput(t *testing.T) {
	v := version(t)
	dir := t.TempDir()
	key := filepath.Join(dir, "vigil.key")
	// The script checks the key's form before it signs; a real key is not
	// needed to reach the checks after that one.
	if err := os.WriteFile(key, []byte("untrusted comment: minisign secret key\nRWQAAEIyAAAA\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	notKey := filepath.Join(dir, "notes.txt")
	foreign := filepath.Join(dir, "mine")
	for _, f := range []string{notKey, filepath.Join(foreign, "precious")} {
		if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f, []byte("keep me\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	out := filepath.Join(dir, "dist")
	for _, c := range []struct {
		env  []string
		args []string
		want string
	}{
		{nil, nil, "Usage: hack/release.sh VERSION"},
		{nil, []string{"9.9.9", "--key", key, "--out", out}, "VERSION says " + v + ", not 9.9.9"},
		{nil, []string{v, "--out", out}, "--key is required"},
		{nil, []string{v, "--key", filepath.Join(dir, "missing.key"), "--out", out}, "cannot read"},
		{nil, []string{v, "--key", notKey, "--out", out}, "is not a minisign secret key"},
		{nil, []string{v, "--key", key, "--out", out, "--sign"}, "unknown flag --sign"},
		{nil, []string{v, v, "--key", key}, "one VERSION only"},
		{[]string{"VIGIL_RELEASE_ARCHES=amd64 riscv64"}, []string{v, "--key", key, "--out", out, "--allow-dirty"}, "unknown architecture riscv64"},
		{nil, []string{v, "--key", key, "--out", foreign, "--allow-dirty"}, "refusing to empty it"},
		{nil, []string{v, "--key", key, "--out", notKey, "--allow-dirty"}, "is not a directory"},
	} {
		code, text := runScript(t, c.env, "release.sh", c.args...)
		if code != 2 || !strings.Contains(text, c.want) {
			t.Errorf("release.sh %q = exit %d, %q; want exit 2 and %q", c.args, code, text, c.want)
		}
	}
	if _, err := os.Stat(out); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a refused release.sh made %s", out)
	}
	if b, err := os.ReadFile(filepath.Join(foreign, "precious")); err != nil || string(b) != "keep me\n" {
		t.Errorf("release.sh --out %s touched what it held: %q, %v", foreign, b, err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{dir}, "--pub or -P is required"},
		{[]string{notKey, "-P", "RWQ"}, "is not a directory"},
		{[]string{dir, "--pub", filepath.Join(dir, "missing.pub")}, "cannot read"},
		{[]string{dir, "-P", "RWQ", "--strict"}, "unknown flag --strict"},
		{[]string{dir, foreign, "-P", "RWQ"}, "one directory only"},
	} {
		if code, text := runScript(t, nil, "verify-release.sh", c.args...); code != 2 || !strings.Contains(text, c.want) {
			t.Errorf("verify-release.sh %q = exit %d, %q; want exit 2 and %q", c.args, code, text, c.want)
		}
	}
}

// One release, made twice from the same tree: the same bytes, which
// verify-release.sh accepts, and rejects once any byte changes.
func TestRelease(t *testing.T) {
	need(t, "minisign", "git", "dpkg-deb")
	arches := os.Getenv("VIGIL_RELEASE_ARCHES")
	if arches == "" {
		// Both architectures take another full compile; hack/release.sh
		// builds both by default, and bench/release records such a run.
		arches = "amd64"
	}
	v := version(t)
	dir := t.TempDir()
	key, pub := filepath.Join(dir, "vigil.key"), filepath.Join(dir, "vigil.pub")
	if out, err := exec.Command("minisign", "-G", "-W", "-p", pub, "-s", key).CombinedOutput(); err != nil {
		t.Fatalf("minisign -G: %v\n%s", err, out)
	}
	env := []string{"VIGIL_RELEASE_ARCHES=" + arches}
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	for _, out := range []string{a, b} {
		// --allow-dirty: a developer runs the tests on uncommitted work;
		// in CI the clone is clean and the flag changes nothing.
		if code, text := runScript(t, env, "release.sh", v, "--key", key, "--out", out, "--allow-dirty"); code != 0 {
			t.Fatalf("release.sh: exit %d\n%s", code, text)
		}
	}
	names := listDir(t, a)
	if got := listDir(t, b); !slices.Equal(names, got) {
		t.Fatalf("two runs wrote different files:\n%q\n%q", names, got)
	}
	for _, n := range names {
		x, err := os.ReadFile(filepath.Join(a, n))
		if err != nil {
			t.Fatal(err)
		}
		y, err := os.ReadFile(filepath.Join(b, n))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(x, y) {
			t.Errorf("%s differs between two runs", n)
		}
	}
	var want []string
	for _, arch := range strings.Fields(arches) {
		for _, cmd := range commands {
			bin := binaryName(cmd, v, arch)
			want = append(want, bin, bin+".spdx.json", cmd+"_"+v+"_"+arch+".deb")
		}
	}
	want = append(want, "vigil-image_"+v+".oci.tar", "vigil-image_"+v+".oci.tar.spdx.json", "vigil-agent-"+v+".tgz", "SHA256SUMS")
	for _, w := range want {
		if !slices.Contains(names, w) || !slices.Contains(names, w+".minisig") {
			t.Errorf("the release lacks %s or its signature; it holds %q", w, names)
		}
	}
	if code, text := runScript(t, nil, "verify-release.sh", a, "--pub", pub); code != 0 || !strings.Contains(text, "verified: vigil "+v) {
		t.Fatalf("verify-release.sh on a fresh release = exit %d\n%s", code, text)
	}

	t.Run("tampered", func(t *testing.T) { testTampered(t, a, names, pub, v) })
	t.Run("packages", func(t *testing.T) { testPackages(t, a, arches, v) })
	t.Run("sbom", func(t *testing.T) { testSBOMs(t, a, arches, v) })
	t.Run("install", func(t *testing.T) { testInstall(t, a, v) })
	t.Run("chart", func(t *testing.T) { testChart(t, a, v) })
}

func listDir(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// cloneRelease links every file of src into a new directory but skip,
// which it copies, so that changing skip leaves src alone.
func cloneRelease(t *testing.T, src string, names []string, own string) string {
	t.Helper()
	dst := t.TempDir()
	for _, n := range names {
		if n == own {
			b, err := os.ReadFile(filepath.Join(src, n))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dst, n), b, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.Link(filepath.Join(src, n), filepath.Join(dst, n)); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

func flipByte(t *testing.T, path string, at func(size int) int) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[at(len(b))] ^= 0x01
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func testTampered(t *testing.T, rel string, names []string, pub, v string) {
	// Every file, one flipped bit in its middle: caught by its SHA-256, or
	// for SHA256SUMS and the signatures, by a signature.
	for _, n := range names {
		t.Run(n, func(t *testing.T) {
			dir := cloneRelease(t, rel, names, n)
			flipByte(t, filepath.Join(dir, n), func(size int) int {
				if strings.HasSuffix(n, ".minisig") {
					// The signature line: line 2, past "RW" and the key id.
					return bytes.IndexByte(mustRead(t, filepath.Join(dir, n)), '\n') + 30
				}
				return size / 2
			})
			if code, text := runScript(t, nil, "verify-release.sh", dir, "--pub", pub); code != 1 || !strings.Contains(text, "FAILED: ") {
				t.Errorf("verify-release.sh with one bit of %s flipped = exit %d\n%s", n, code, text)
			}
		})
	}
	other := filepath.Join(t.TempDir(), "other")
	if out, err := exec.Command("minisign", "-G", "-W", "-p", other+".pub", "-s", other+".key").CombinedOutput(); err != nil {
		t.Fatalf("minisign -G: %v\n%s", err, out)
	}
	bin := binaryName("vigil-agent", v, "amd64")
	for _, c := range []struct {
		name   string
		change func(t *testing.T, dir string)
		want   string
	}{
		{"extra file", func(t *testing.T, dir string) {
			if err := os.WriteFile(filepath.Join(dir, "install.sh"), []byte("#!/bin/sh\n"), 0o755); err != nil {
				t.Fatal(err)
			}
		}, "install.sh: not part of the release"},
		{"missing file", func(t *testing.T, dir string) {
			if err := os.Remove(filepath.Join(dir, bin)); err != nil {
				t.Fatal(err)
			}
		}, bin + ": listed in SHA256SUMS, missing"},
		{"missing signature", func(t *testing.T, dir string) {
			if err := os.Remove(filepath.Join(dir, bin+".minisig")); err != nil {
				t.Fatal(err)
			}
		}, bin + ": no signature"},
		{"another key", func(t *testing.T, dir string) {
			// The file and SHA256SUMS unchanged, the signature made by a
			// key that is not the release's.
			if err := os.Remove(filepath.Join(dir, bin+".minisig")); err != nil {
				t.Fatal(err)
			}
			if out, err := exec.Command("minisign", "-S", "-s", other+".key", "-t", "vigil "+v, "-m", filepath.Join(dir, bin)).CombinedOutput(); err != nil {
				t.Fatalf("minisign -S: %v\n%s", err, out)
			}
		}, bin + ": bad signature"},
		{"another release's comment", func(t *testing.T, dir string) {
			// Signed by the release key, but for another version: a file
			// from another release.
			if err := os.Remove(filepath.Join(dir, bin+".minisig")); err != nil {
				t.Fatal(err)
			}
			key := filepath.Join(filepath.Dir(pub), "vigil.key")
			if out, err := exec.Command("minisign", "-S", "-s", key, "-t", "vigil 0.0.1", "-m", filepath.Join(dir, bin)).CombinedOutput(); err != nil {
				t.Fatalf("minisign -S: %v\n%s", err, out)
			}
		}, `signed as "vigil 0.0.1"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			if !slices.Contains(names, bin) {
				t.Skipf("no %s in this release", bin)
			}
			own := bin + ".minisig"
			dir := cloneRelease(t, rel, names, own)
			c.change(t, dir)
			if code, text := runScript(t, nil, "verify-release.sh", dir, "--pub", pub); code != 1 || !strings.Contains(text, c.want) {
				t.Errorf("verify-release.sh = exit %d, %q; want exit 1 and %q", code, text, c.want)
			}
		})
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func dpkgDeb(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("dpkg-deb", args...).Output()
	if err != nil {
		t.Fatalf("dpkg-deb %q: %v", args, err)
	}
	return string(out)
}

// What Debian's own tools read from the packages.
func testPackages(t *testing.T, rel, arches, v string) {
	for _, arch := range strings.Fields(arches) {
		for _, cmd := range commands {
			deb := filepath.Join(rel, cmd+"_"+v+"_"+arch+".deb")
			for field, want := range map[string]string{"Package": cmd, "Version": v, "Architecture": arch} {
				if got := strings.TrimSpace(dpkgDeb(t, "-f", deb, field)); got != want {
					t.Errorf("%s: %s = %q, want %q", deb, field, got, want)
				}
			}
			contents := dpkgDeb(t, "-c", deb)
			p := packages[cmd]
			for _, want := range []string{
				"-rwxr-xr-x root/root .* ./usr/bin/" + cmd + "\n",
				"-rw-r--r-- root/root .* ./lib/systemd/system/" + cmd + ".service\n",
				"-rw-r--r-- root/root .* ." + p.configFile + "\n",
				"-rw-r--r-- root/root .* ./etc/default/" + cmd + "\n",
			} {
				if !regexp.MustCompile(want).MatchString(contents) {
					t.Errorf("%s lacks %q:\n%s", deb, want, contents)
				}
			}
			ctl := t.TempDir()
			if out, err := exec.Command("dpkg-deb", "-e", deb, ctl).CombinedOutput(); err != nil {
				t.Fatalf("dpkg-deb -e: %v\n%s", err, out)
			}
			if got, want := string(mustRead(t, filepath.Join(ctl, "conffiles"))), "/etc/default/"+cmd+"\n"+p.configFile+"\n"; got != want {
				t.Errorf("%s: conffiles = %q, want %q", deb, got, want)
			}
			for _, s := range []string{"postinst", "prerm", "postrm"} {
				if out, err := exec.Command("sh", "-n", filepath.Join(ctl, s)).CombinedOutput(); err != nil {
					t.Errorf("%s: %s is not valid sh: %v\n%s", deb, s, err, out)
				}
			}
		}
	}
}

// The SBOMs list what `go version -m` reads from each binary, and the
// image's lists every binary the image holds.
func testSBOMs(t *testing.T, rel, arches, v string) {
	read := func(path string) spdxDoc {
		var d spdxDoc
		if err := json.Unmarshal(mustRead(t, path), &d); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if d.SPDXVersion != "SPDX-2.3" || d.SPDXID != "SPDXRef-DOCUMENT" || d.DataLicense != "CC0-1.0" || d.DocumentNamespace == "" || d.CreationInfo.Created == "" {
			t.Errorf("%s: not a complete SPDX 2.3 document header: %+v", path, d)
		}
		ids := map[string]bool{d.SPDXID: true}
		for _, p := range d.Packages {
			if ids[p.SPDXID] || !regexp.MustCompile(`^SPDXRef-[A-Za-z0-9.-]+$`).MatchString(p.SPDXID) {
				t.Errorf("%s: identifier %q repeated or malformed", path, p.SPDXID)
			}
			ids[p.SPDXID] = true
		}
		for _, r := range d.Relationships {
			if !ids[r.Element] || !ids[r.Related] {
				t.Errorf("%s: relationship %+v names an unknown element", path, r)
			}
		}
		return d
	}
	has := func(d spdxDoc, name, version string) bool {
		return slices.ContainsFunc(d.Packages, func(p spdxPackage) bool { return p.Name == name && p.VersionInfo == version })
	}
	var bins []string
	for _, arch := range strings.Fields(arches) {
		for _, cmd := range commands {
			bin := filepath.Join(rel, binaryName(cmd, v, arch))
			bins = append(bins, bin)
			d := read(bin + ".spdx.json")
			out, err := exec.Command("go", "version", "-m", bin).Output()
			if err != nil {
				t.Fatalf("go version -m: %v", err)
			}
			deps := 0
			lines := strings.Split(string(out), "\n")
			for i, line := range lines {
				f := strings.Fields(line)
				if len(f) < 3 || (f[0] != "dep" && f[0] != "=>") {
					continue
				}
				if f[0] == "dep" {
					deps++
					if i+1 < len(lines) && strings.HasPrefix(strings.TrimSpace(lines[i+1]), "=>") {
						continue // the SBOM names the replacement, on the next line
					}
				}
				if !has(d, f[1], f[2]) {
					t.Errorf("%s.spdx.json lacks module %s %s", bin, f[1], f[2])
				}
			}
			if deps < 5 || len(d.Packages) < deps+3 {
				t.Errorf("%s: %d modules from go version -m, %d packages in its SBOM", bin, deps, len(d.Packages))
			}
			if d.Packages[0].Checksums[0].Value != sha256File(t, bin) {
				t.Errorf("%s.spdx.json: the binary's checksum is not its SHA-256", bin)
			}
		}
	}
	img := filepath.Join(rel, "vigil-image_"+v+".oci.tar")
	d := read(img + ".spdx.json")
	if d.Packages[0].Checksums[0].Value != sha256File(t, img) {
		t.Errorf("the image SBOM's checksum is not the archive's SHA-256")
	}
	for _, bin := range bins {
		sum := sha256File(t, bin)
		if !slices.ContainsFunc(d.Packages, func(p spdxPackage) bool {
			return p.Name == filepath.Base(bin) && len(p.Checksums) == 1 && p.Checksums[0].Value == sum
		}) {
			t.Errorf("the image SBOM lacks %s", filepath.Base(bin))
		}
	}
}

func sha256File(t *testing.T, path string) string {
	sum := sha256.Sum256(mustRead(t, path))
	return hex.EncodeToString(sum[:])
}

// dpkg installs both packages on this machine, systemd accepts the units
// they install, and removing them leaves only the configuration files
// (Debian's conffiles, kept on remove by policy), and purging nothing.
func testInstall(t *testing.T, rel, v string) {
	need(t, "dpkg", "systemd-analyze")
	if os.Geteuid() != 0 {
		if os.Getenv("VIGIL_REQUIRE_ROOT") != "" {
			t.Fatal("dpkg -i needs root, and VIGIL_REQUIRE_ROOT is set")
		}
		t.Skip("dpkg -i needs root")
	}
	for _, p := range commands {
		if exec.Command("dpkg", "-s", p).Run() == nil {
			t.Skipf("the package %s is installed on this machine: the test would replace it", p)
		}
	}
	for _, p := range []string{"/etc/vigil", "/usr/bin/vigil", "/usr/bin/vigil-agent", "/etc/default/vigil", "/etc/default/vigil-agent"} {
		if _, err := os.Lstat(p); err == nil {
			t.Skipf("%s exists on this machine: the test would overwrite it", p)
		}
	}
	debs := []string{filepath.Join(rel, "vigil_"+v+"_amd64.deb"), filepath.Join(rel, "vigil-agent_"+v+"_amd64.deb")}
	if _, err := os.Stat(debs[0]); err != nil {
		t.Skipf("this release has no amd64 package: %v", err)
	}
	dpkg := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("dpkg", args...).CombinedOutput(); err != nil {
			t.Fatalf("dpkg %q: %v\n%s", args, err, out)
		}
	}
	t.Cleanup(func() { _ = exec.Command("dpkg", "--purge", "vigil", "vigil-agent").Run() })
	dpkg(append([]string{"--install"}, debs...)...)

	units := []string{"/lib/systemd/system/vigil.service", "/lib/systemd/system/vigil-agent.service"}
	if out, err := exec.Command("systemd-analyze", append([]string{"verify"}, units...)...).CombinedOutput(); err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
	if out, err := exec.Command("/usr/bin/vigil", "--version").Output(); err != nil || !strings.HasPrefix(string(out), "vigil "+v+" ") {
		t.Errorf("/usr/bin/vigil --version = %q, %v", out, err)
	}
	// Each shipped configuration is what its command reads: it stops at
	// the first setting without a default, not at the file.
	for cmd, want := range map[string]string{
		"/usr/bin/vigil run --config /etc/vigil/config.yaml":  "--vip is required",
		"/usr/bin/vigil-agent --config /etc/vigil/agent.yaml": "--server is required",
		"/usr/bin/vigil agent --config /etc/vigil/agent.yaml": "--server is required",
	} {
		f := strings.Fields(cmd)
		out, err := exec.Command(f[0], f[1:]...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), want) {
			t.Errorf("%s = %v, %q; want it to stop at %q", cmd, err, out, want)
		}
	}
	wants := "/etc/systemd/system/multi-user.target.wants/"
	if _, err := exec.LookPath("systemctl"); err == nil {
		if out, err := exec.Command("systemctl", "enable", "vigil.service").CombinedOutput(); err != nil {
			t.Fatalf("systemctl enable vigil: %v\n%s", err, out)
		}
		if _, err := os.Lstat(wants + "vigil.service"); err != nil {
			t.Fatalf("systemctl enable made no link: %v", err)
		}
	}

	dpkg("--remove", "vigil", "vigil-agent")
	for _, p := range append(units, "/usr/bin/vigil", "/usr/bin/vigil-agent", wants+"vigil.service") {
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("dpkg --remove left %s", p)
		}
	}
	for _, p := range []string{"/etc/vigil/config.yaml", "/etc/vigil/agent.yaml", "/etc/default/vigil", "/etc/default/vigil-agent"} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("dpkg --remove took the configuration file %s (Debian keeps conffiles until purge): %v", p, err)
		}
	}
	dpkg("--purge", "vigil", "vigil-agent")
	for _, p := range []string{"/etc/vigil", "/etc/default/vigil", "/etc/default/vigil-agent", "/var/lib/vigil-agent"} {
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("dpkg --purge left %s", p)
		}
	}
	for _, p := range commands {
		if exec.Command("dpkg", "-s", p).Run() == nil {
			t.Errorf("dpkg -s %s: still known after --purge", p)
		}
	}
}
