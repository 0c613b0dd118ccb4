// Command release writes the parts of a vigil release that hack/release.sh
// does not build with go build: the Debian packages (nfpm as a library),
// an SPDX SBOM for every binary and for the image, read from the module
// graph each binary records, the worker agent's Helm chart (the templates
// internal/manifest renders), and SHA256SUMS. Every time stamp is --epoch
// (the commit's time), so the same binaries give the same bytes.
//
// It is its own Go module, so that the packager's dependencies stay out of
// the module that builds vigil's binaries.
//
//	go run . --dist DIR --version 0.3.0 --epoch 1700000000 --arches "amd64 arm64" \
//	    --image DIR/vigil-image_0.3.0.oci.tar --image-binaries bin/image
package main

import (
	"archive/tar"
	"compress/gzip"
	"errors"
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/vigil-ha/vigil"
	"github.com/vigil-ha/vigil/internal/manifest"
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
	// `--section agent`, the packages' configuration files.
	defaults map[string][]byte
	image    string // the OCI image archive in dist, or ""
	// imageBinaries holds the binaries the image was built from
	// (hack/build-image.sh's bin/image), each also in dist.
	imageBinaries string
}

var versionRE = regexp.MustCompile(`^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.]+)?$`)

func run(args []string) error {
	fs := flag.NewFlagSet("release", flag.ContinueOnError)
	var r release
	var epoch int64
	var arches, runDefaults, agentDefaults string
	fs.StringVar(&r.dist, "dist", "", "the directory hack/release.sh built the binaries into; the packages, SBOMs and SHA256SUMS are written there")
	fs.StringVar(&r.root, "root", "../..", "the repository's top directory")
	fs.StringVar(&r.version, "version", "", "the release version, such as 0.3.0 (no leading v)")
	fs.Int64Var(&epoch, "epoch", -1, "every time stamp, in seconds since 1970 (SOURCE_DATE_EPOCH: the commit's time)")
	fs.StringVar(&arches, "arches", "amd64 arm64", "the architectures whose binaries are in --dist")
	fs.StringVar(&runDefaults, "run-defaults", "", "vigil config print-defaults --section run, for /etc/vigil/config.yaml")
	fs.StringVar(&agentDefaults, "agent-defaults", "", "vigil config print-defaults --section agent, for /etc/vigil/agent.yaml")
	fs.StringVar(&r.image, "image", "", "the image archive in --dist, to describe in an SBOM")
	fs.StringVar(&r.imageBinaries, "image-binaries", "", "the directory of the binaries the image holds, named <command>-linux-<arch>")
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch {
	case fs.NArg() > 0:
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	case r.dist == "":
		return errors.New("--dist is required")
	case !versionRE.MatchString(r.version):
		return fmt.Errorf("--version %q: want a version such as 0.3.0", r.version)
	case r.version != vigil.Version:
		return fmt.Errorf("--version %s: this tree is vigil %s (the VERSION file)", r.version, vigil.Version)
	case epoch < 0:
		return errors.New("--epoch is required")
	case runDefaults == "" || agentDefaults == "":
		return errors.New("--run-defaults and --agent-defaults are required")
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
	r.defaults = map[string][]byte{}
	for name, path := range map[string]string{"vigil": runDefaults, "vigil-agent": agentDefaults} {
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		r.defaults[name] = b
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

// chart writes the agent's Helm chart as Helm packages one,
// <name>-<version>.tgz, with every entry's time the commit's and in name
// order, so that the archive is the same bytes every run.
func (r *release) chart() error {
	files, err := manifest.AgentChart()
	if err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(r.dist, fmt.Sprintf("%s-%s.tgz", manifest.AgentChartName, r.version)))
	if err != nil {
		return err
	}
	defer f.Close()
	zw := gzip.NewWriter(f) // no name, no time in the gzip header
	tw := tar.NewWriter(zw)
	for _, name := range slices.Sorted(maps.Keys(files)) {
		body := files[name]
		hdr := &tar.Header{
			Name: manifest.AgentChartName + "/" + name, Mode: 0o644, Size: int64(len(body)),
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
