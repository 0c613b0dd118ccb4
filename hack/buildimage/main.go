// Command buildimage writes a container image of one static binary as an OCI
// image archive: one image per architecture (a single layer holding the
// binary at /usr/local/bin/NAME, its entrypoint), in one multi-architecture
// index. By default the image is vigil's, ghcr.io/vigil-ha/vigil:v<VERSION>;
// the kubeadm lab also uses it for the Kubernetes components it builds
// (hack/build-kube-images.sh). It needs no container daemon, and the same
// binaries and epoch give the same archive, byte for byte.
// hack/build-image.sh builds vigil's binaries and runs it; --extra puts
// more binaries beside the first (vigil-agent beside vigil).
//
//	buildimage --out bin/vigil-image.oci.tar --epoch 1764547200 \
//	    --binary linux/amd64=bin/image/vigil-linux-amd64 \
//	    --binary linux/arm64=bin/image/vigil-linux-arm64
package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/vigil-ha/vigil"
)

// binDir is where the binary lives in the image.
const binDir = "usr/local/bin/"

// meta names what goes into an image.
type meta struct {
	name     string // the binary's file name in binDir, and the image's title
	version  string
	revision string
	created  time.Time
}

type binaries []string

func (b *binaries) String() string     { return strings.Join(*b, ",") }
func (b *binaries) Set(v string) error { *b = append(*b, v); return nil }

func main() {
	var (
		bins  binaries
		extra binaries
		out   string
		ref   string
		epoch int64
		m     meta
	)
	flag.Var(&bins, "binary", "OS/ARCH=PATH of a static vigil binary; repeat once per architecture")
	flag.Var(&extra, "extra", "NAME@OS/ARCH=PATH of another static binary, put beside the first as /usr/local/bin/NAME (vigil-agent); repeat once per architecture")
	flag.StringVar(&out, "out", "", "the OCI image archive to write")
	flag.StringVar(&ref, "ref", vigil.Image(), "the image's name, recorded in the archive")
	flag.Int64Var(&epoch, "epoch", 0, "creation time of every file and of the image, in seconds since 1970 (SOURCE_DATE_EPOCH; the commit's time keeps rebuilds identical)")
	flag.StringVar(&m.revision, "revision", "", "the source revision, recorded as org.opencontainers.image.revision")
	flag.StringVar(&m.name, "name", "vigil", "the binary's name in /usr/local/bin, and the image's title")
	flag.StringVar(&m.version, "version", vigil.Version, "the version recorded as org.opencontainers.image.version")
	flag.Parse()
	m.created = time.Unix(epoch, 0).UTC()
	if err := run(bins, extra, out, ref, m); err != nil {
		fmt.Fprintln(os.Stderr, "buildimage:", err)
		os.Exit(1)
	}
}

// file is one binary in the image: its name in binDir and where it is now.
type file struct{ name, path string }

func run(bins, extra []string, out, ref string, m meta) error {
	if out == "" || len(bins) == 0 {
		return errors.New("--out and at least one --binary are required")
	}
	if m.name == "" || strings.ContainsAny(m.name, "/ ") {
		return fmt.Errorf("--name %q: want a plain file name", m.name)
	}
	extras := map[string][]file{} // by architecture
	for _, e := range extra {
		name, rest, ok := strings.Cut(e, "@")
		platform, path, ok2 := strings.Cut(rest, "=")
		_, arch, ok3 := strings.Cut(platform, "/")
		if !ok || !ok2 || !ok3 || name == "" || strings.ContainsAny(name, "/ ") || name == m.name || path == "" {
			return fmt.Errorf("--extra %q: want NAME@linux/ARCH=PATH, NAME a plain file name other than --name", e)
		}
		extras[arch] = append(extras[arch], file{name, path})
	}
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, b := range bins {
		platform, path, ok := strings.Cut(b, "=")
		osName, arch, ok2 := strings.Cut(platform, "/")
		if !ok || !ok2 || osName != "linux" || path == "" {
			return fmt.Errorf("--binary %q: want linux/ARCH=PATH", b)
		}
		img, err := image(append([]file{{m.name, path}}, extras[arch]...), arch, m)
		if err != nil {
			return fmt.Errorf("image for %s: %w", platform, err)
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
			Add:        img,
			Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: osName, Architecture: arch}},
		})
	}
	dir, err := os.MkdirTemp("", "vigil-image-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	// containerd names an imported image by io.containerd.image.name,
	// podman and skopeo by org.opencontainers.image.ref.name.
	names := map[string]string{"io.containerd.image.name": ref, "org.opencontainers.image.ref.name": ref}
	if err := p.AppendIndex(idx, layout.WithAnnotations(names)); err != nil {
		return err
	}
	return tarDir(dir, out, m.created)
}

// image is one architecture's image: the binaries in one layer, the first
// run as its entrypoint.
func image(files []file, arch string, m meta) (v1.Image, error) {
	created := m.created
	layerTar, err := layerContents(files, created)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := mutate.Append(base, mutate.Addendum{
		Layer:     layer,
		MediaType: types.OCILayer,
		History:   v1.History{Created: v1.Time{Time: created}, CreatedBy: "hack/buildimage", Comment: m.name + " " + m.version},
	})
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", arch
	cf.Created = v1.Time{Time: created}
	cf.Config.Entrypoint = []string{"/" + binDir + m.name}
	cf.Config.Env = []string{"PATH=/usr/local/bin"}
	// Root inside the container, with only the capabilities the pod
	// grants: vigil run needs NET_ADMIN and NET_RAW, which Kubernetes
	// gives a non-root process only through file capabilities. The agent's
	// DaemonSet needs none and may run as any user.
	cf.Config.User = "0:0"
	cf.Config.Labels = map[string]string{
		"org.opencontainers.image.title":   m.name,
		"org.opencontainers.image.version": m.version,
		"org.opencontainers.image.source":  "https://github.com/vigil-ha/vigil",
	}
	if m.revision != "" {
		cf.Config.Labels["org.opencontainers.image.revision"] = m.revision
	}
	return mutate.ConfigFile(img, cf)
}

// layerContents is the layer's tar: the binaries and their directories,
// owned by root, every time stamp the epoch.
func layerContents(files []file, created time.Time) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, d := range []string{"usr/", "usr/local/", "usr/local/bin/"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755, ModTime: created, Format: tar.FormatPAX}); err != nil {
			return nil, err
		}
	}
	for _, f := range files {
		binary, err := os.ReadFile(f.path)
		if err != nil {
			return nil, err
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: binDir + f.name, Mode: 0o755, Size: int64(len(binary)), ModTime: created, Format: tar.FormatPAX}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(binary); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// tarDir writes the OCI layout in dir as a tar archive at out, entries in
// sorted order with fixed owners and times, so that the archive depends on
// its contents only.
func tarDir(dir, out string, created time.Time) error {
	var paths []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != dir {
			paths = append(paths, p)
		}
		return nil
	})
	if err != nil {
		return err
	}
	slices.Sort(paths)
	tmp := out + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	tw := tar.NewWriter(f)
	for _, p := range paths {
		st, err := os.Stat(p)
		if err != nil {
			f.Close()
			return err
		}
		name, _ := filepath.Rel(dir, p)
		h := &tar.Header{Name: filepath.ToSlash(name), ModTime: created, Mode: 0o644, Format: tar.FormatPAX}
		if st.IsDir() {
			h.Typeflag, h.Name, h.Mode = tar.TypeDir, h.Name+"/", 0o755
		} else {
			h.Typeflag, h.Size = tar.TypeReg, st.Size()
		}
		if err := tw.WriteHeader(h); err != nil {
			f.Close()
			return err
		}
		if !st.IsDir() {
			data, err := os.ReadFile(p)
			if err != nil {
				f.Close()
				return err
			}
			if _, err := tw.Write(data); err != nil {
				f.Close()
				return err
			}
		}
	}
	if err := tw.Close(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, out)
}
