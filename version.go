// Package vigil holds what the whole project shares from its root: the
// release version, read from the VERSION file, which names the container
// image (ghcr.io/vigil-ha/vigil:v<version>) that hack/build-image.sh builds
// and `vigil manifest` pins.
package vigil

import (
	_ "embed"
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
