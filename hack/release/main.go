// Command release writes the parts of a vigil release that hack/release.sh
// does not build with go build: the Debian packages (nfpm as a library),
// an SPDX SBOM for every binary and for the image, read from the module
// graph each binary records, the worker agent's Helm chart (the directory
// vigil manifest chart writes) as Helm packages one, and SHA256SUMS. Every time stamp is --epoch
// (the commit's time), so the same binaries give the same bytes.
//
// It is its own Go module, so that the packager's dependencies stay out of
// the module that builds vigil's binaries; and it imports none of vigil's
// packages (what it needs from vigil, vigil's binary prints), so that its
// build compiles nfpm and nothing that vigil's own build has not.
//
//	go run . --dist DIR --version 0.3.0 --epoch 1700000000 --arches "amd64 arm64" \
//	    --defaults DIR --chart DIR/vigil-agent \
//	    --image DIR/vigil-image_0.3.0.oci.tar --image-binaries bin/image
package main

import (
	"archive/tar"
	"compress/gzip"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(1)
	}
}

// release is what one run writes, given the binaries already in dist.
type release struct {
	dist    string
	root    string // the repository, for deploy/systemd
	version string
	mtime   time.Time
	arches  []string
	// defaults are `vigil config print-defaults --section run` and
	// `--section agent`, the packages' configuration files, and env
	// `vigil config print-env` of each section, their /etc/default files;
	// both by package name.
	defaults, env map[string][]byte
	chartDir      string // what vigil manifest chart --out wrote
	image         string // the OCI image archive in dist, or ""
	// imageBinaries holds the binaries the image was built from
	// (hack/build-image.sh's bin/image), each also in dist.
	imageBinaries string
}

var versionRE = regexp.MustCompile(`^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.]+)?$`)

func run(args []string) error {
	flags := flag.NewFlagSet("release", flag.ContinueOnError)
	var r release
	var epoch int64
	var arches, defaults string
	flags.StringVar(&r.dist, "dist", "", "the directory hack/release.sh built the binaries into; the packages, SBOMs and SHA256SUMS are written there")
	flags.StringVar(&r.root, "root", "../..", "the repository's top directory")
	flags.StringVar(&r.version, "version", "", "the release version, such as 0.3.0 (no leading v)")
	flags.Int64Var(&epoch, "epoch", -1, "every time stamp, in seconds since 1970 (SOURCE_DATE_EPOCH: the commit's time)")
	flags.StringVar(&arches, "arches", "amd64 arm64", "the architectures whose binaries are in --dist")
	flags.StringVar(&defaults, "defaults", "", "a directory holding, for each package (vigil, vigil-agent), <name>.yaml (vigil config print-defaults --section run or agent: its /etc/vigil file) and <name>.env (vigil config print-env: its /etc/default file)")
	flags.StringVar(&r.chartDir, "chart", "", "the agent's chart directory, as vigil manifest chart --out wrote it")
	flags.StringVar(&r.image, "image", "", "the image archive in --dist, to describe in an SBOM")
	flags.StringVar(&r.imageBinaries, "image-binaries", "", "the directory of the binaries the image holds, named <command>-linux-<arch>")
	if err := flags.Parse(args); err != nil {
		return err
	}
	switch {
	case flags.NArg() > 0:
		return fmt.Errorf("unexpected arguments %q", flags.Args())
	case r.dist == "":
		return errors.New("--dist is required")
	case !versionRE.MatchString(r.version):
		return fmt.Errorf("--version %q: want a version such as 0.3.0", r.version)
	case epoch < 0:
		return errors.New("--epoch is required")
	case defaults == "" || r.chartDir == "":
		return errors.New("--defaults and --chart are required")
	case (r.image == "") != (r.imageBinaries == ""):
		return errors.New("--image and --image-binaries go together")
	}
	r.mtime = time.Unix(epoch, 0).UTC()
	r.arches = strings.Fields(arches)
	for _, a := range r.arches {
		if a != "amd64" && a != "arm64" {
			return fmt.Errorf("--arches: unknown architecture %q (amd64, arm64)", a)
		}
	}
	tree, err := os.ReadFile(filepath.Join(r.root, "VERSION"))
	if err != nil {
		return err
	}
	if v := strings.TrimSpace(string(tree)); r.version != v {
		return fmt.Errorf("--version %s: this tree is vigil %s (the VERSION file)", r.version, v)
	}
	r.defaults, r.env = map[string][]byte{}, map[string][]byte{}
	for _, cmd := range commands {
		for ext, m := range map[string]map[string][]byte{".yaml": r.defaults, ".env": r.env} {
			b, err := os.ReadFile(filepath.Join(defaults, cmd+ext))
			if err != nil {
				return err
			}
			m[cmd] = b
		}
	}
	return r.write()
}

func (r *release) write() error {
	for _, arch := range r.arches {
		for _, cmd := range commands {
			bin := filepath.Join(r.dist, binaryName(cmd, r.version, arch))
			if err := r.deb(cmd, arch, bin); err != nil {
				return fmt.Errorf("%s %s package: %w", cmd, arch, err)
			}
			if err := r.binarySBOM(bin); err != nil {
				return fmt.Errorf("%s SBOM: %w", bin, err)
			}
		}
	}
	if err := r.chart(); err != nil {
		return fmt.Errorf("the agent's Helm chart: %w", err)
	}
	if r.image != "" {
		if err := r.imageSBOM(); err != nil {
			return fmt.Errorf("image SBOM: %w", err)
		}
	}
	return writeSums(r.dist)
}

// commands are the binaries a release ships, each with its own package.
var commands = []string{"vigil", "vigil-agent"}

func binaryName(cmd, version, arch string) string {
	return fmt.Sprintf("%s_%s_linux_%s", cmd, version, arch)
}

// chartName is the agent chart's name, and its directory's in the archive.
const chartName = "vigil-agent"

// chart writes the agent's Helm chart as Helm packages one,
// <name>-<version>.tgz, with every entry's time the commit's and in name
// order, so that the archive is the same bytes every run.
func (r *release) chart() error {
	files := map[string][]byte{}
	err := filepath.WalkDir(r.chartDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		if !d.Type().IsRegular() {
			return fmt.Errorf("%s: not a regular file", path)
		}
		rel, err := filepath.Rel(r.chartDir, path)
		if err != nil {
			return err
		}
		b, err := os.ReadFile(path)
		files[filepath.ToSlash(rel)] = b
		return err
	})
	if err != nil {
		return err
	}
	if _, ok := files["Chart.yaml"]; !ok {
		return fmt.Errorf("--chart %s: no Chart.yaml (vigil manifest chart --out writes it)", r.chartDir)
	}
	f, err := os.Create(filepath.Join(r.dist, fmt.Sprintf("%s-%s.tgz", chartName, r.version)))
	if err != nil {
		return err
	}
	defer f.Close()
	zw := gzip.NewWriter(f) // no name, no time in the gzip header
	tw := tar.NewWriter(zw)
	for _, name := range slices.Sorted(maps.Keys(files)) {
		body := files[name]
		hdr := &tar.Header{
			Name: chartName + "/" + name, Mode: 0o644, Size: int64(len(body)),
			ModTime: r.mtime, Typeflag: tar.TypeReg, Format: tar.FormatPAX,
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if _, err := tw.Write(body); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return err
	}
	return f.Close()
}
