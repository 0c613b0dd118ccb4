// Package vigil holds what the whole project shares from its root: the
// release version, read from the VERSION file, which names the container
// image (ghcr.io/vigil-ha/vigil:v<version>) that hack/build-image.sh builds
// and `vigil manifest` pins.
package vigil

import (
	_ "embed"
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
)

//go:embed VERSION
var versionFile string

// Version is vigil's release version, such as "0.3.0".
var Version = strings.TrimSpace(versionFile)

// ImageRepository is where vigil's image is published; operators who mirror
// it give their own with --image.
const ImageRepository = "ghcr.io/vigil-ha/vigil"

// Image is the image reference of this version: ImageRepository:v<Version>.
func Image() string { return ImageRepository + ":v" + Version }

// Build describes the running binary: the release version, the VCS
// revision it was built from, and the Go release that built it.
type Build struct {
	Version   string `json:"version"`
	Revision  string `json:"revision"` // "unknown" when built without VCS information; "-dirty" marks local changes
	GoVersion string `json:"goVersion"`
}

// revision is set by hack/build.sh (-ldflags "-X
// github.com/vigil-ha/vigil.revision=..."), for builds where Go records no
// VCS information (-buildvcs=false, a tree without .git).
var revision string

// BuildInfo reads the running binary's Build from Version, the revision
// hack/build.sh stamped, or else the VCS information Go embeds.
func BuildInfo() Build {
	b := Build{Version: Version, Revision: "unknown", GoVersion: runtime.Version()}
	if revision != "" {
		b.Revision = revision
		return b
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return b
	}
	dirty := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			b.Revision = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if dirty && b.Revision != "unknown" {
		b.Revision += "-dirty"
	}
	return b
}

// String is the line `vigil --version` prints after the program's name.
func (b Build) String() string {
	return fmt.Sprintf("%s (revision %s, %s)", b.Version, b.Revision, b.GoVersion)
}

// RecordFormat is the format of every record vigil keeps in etcd or a
// Lease: the election lock, the node-name claim, the membership reports
// and the handoff records each carry it ("format", or the annotation
// vigil.dev/format on a Lease). Records of vigil 0.3.0 and before carry
// none: format 0, the same fields.
//
// The policy (docs/operations.md, "Rolling upgrades"): a format only adds
// fields, and every reader ignores the fields it does not know, so release
// N reads N-1's records and N-1 reads N's, in any mix of nodes during a
// rolling upgrade. A change that an older reader would get wrong is not a
// new format of the same record: it is a new key, written beside the old
// one until no reader of the old one can be running.
const RecordFormat = 1
