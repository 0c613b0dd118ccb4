package main

import (
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// An SPDX 2.3 document (https://spdx.github.io/spdx-spec/v2.3/), the
// fields vigil fills.
type spdxDoc struct {
	SPDXVersion       string         `json:"spdxVersion"`
	DataLicense       string         `json:"dataLicense"`
	SPDXID            string         `json:"SPDXID"`
	Name              string         `json:"name"`
	DocumentNamespace string         `json:"documentNamespace"`
	CreationInfo      spdxCreation   `json:"creationInfo"`
	Packages          []spdxPackage  `json:"packages"`
	Relationships     []spdxRelation `json:"relationships"`
}

type spdxCreation struct {
	Created  string   `json:"created"`
	Creators []string `json:"creators"`
}

type spdxPackage struct {
	SPDXID           string         `json:"SPDXID"`
	Name             string         `json:"name"`
	VersionInfo      string         `json:"versionInfo,omitempty"`
	PackageFileName  string         `json:"packageFileName,omitempty"`
	DownloadLocation string         `json:"downloadLocation"`
	FilesAnalyzed    bool           `json:"filesAnalyzed"`
	Checksums        []spdxChecksum `json:"checksums,omitempty"`
	LicenseConcluded string         `json:"licenseConcluded"`
	LicenseDeclared  string         `json:"licenseDeclared"`
	CopyrightText    string         `json:"copyrightText"`
	PrimaryPurpose   string         `json:"primaryPackagePurpose,omitempty"`
	ExternalRefs     []spdxRef      `json:"externalRefs,omitempty"`
	Comment          string         `json:"comment,omitempty"`
}

type spdxChecksum struct {
	Algorithm string `json:"algorithm"`
	Value     string `json:"checksumValue"`
}

type spdxRef struct {
	Category string `json:"referenceCategory"`
	Type     string `json:"referenceType"`
	Locator  string `json:"referenceLocator"`
}

type spdxRelation struct {
	Element string `json:"spdxElementId"`
	Type    string `json:"relationshipType"`
	Related string `json:"relatedSpdxElement"`
}

const noAssertion = "NOASSERTION"

// sbom builds documents; ids keeps SPDX identifiers unique.
type sbom struct {
	doc spdxDoc
	ids map[string]bool
}

func newSBOM(name string, digest string, mtime time.Time) *sbom {
	return &sbom{
		doc: spdxDoc{
			SPDXVersion: "SPDX-2.3",
			DataLicense: "CC0-1.0",
			SPDXID:      "SPDXRef-DOCUMENT",
			Name:        name,
			// Unique per artifact and stable across rebuilds of the same bytes.
			DocumentNamespace: "https://github.com/vigil-ha/vigil/spdx/" + name + "-" + digest,
			CreationInfo: spdxCreation{
				Created:  mtime.Format(time.RFC3339),
				Creators: []string{"Organization: vigil developers", "Tool: vigil-hack-release"},
			},
		},
		ids: map[string]bool{},
	}
}

var idUnsafe = regexp.MustCompile(`[^A-Za-z0-9.-]+`)

func (s *sbom) id(kind, name string) string {
	base := "SPDXRef-" + kind + "-" + strings.Trim(idUnsafe.ReplaceAllString(name, "-"), "-")
	id := base
	for i := 2; s.ids[id]; i++ {
		id = fmt.Sprintf("%s-%d", base, i)
	}
	s.ids[id] = true
	return id
}

func (s *sbom) add(p spdxPackage) string {
	if p.DownloadLocation == "" {
		p.DownloadLocation = noAssertion
	}
	p.LicenseConcluded, p.LicenseDeclared, p.CopyrightText = noAssertion, noAssertion, noAssertion
	s.doc.Packages = append(s.doc.Packages, p)
	return p.SPDXID
}

func (s *sbom) relate(a, typ, b string) {
	s.doc.Relationships = append(s.doc.Relationships, spdxRelation{a, typ, b})
}

// addBinary describes the binary at path as a package that contains its
// main module, its dependencies at the versions linked, and the Go
// standard library, all read from the build information Go records in the
// binary: what was linked, not what go.mod asks for. It returns the
// binary's identifier.
func (s *sbom) addBinary(path, version string) (string, error) {
	sum, err := fileSHA256(path)
	if err != nil {
		return "", err
	}
	bi, err := buildinfo.ReadFile(path)
	if err != nil {
		return "", err
	}
	name := filepath.Base(path)
	var settings []string
	for _, st := range bi.Settings {
		settings = append(settings, st.Key+"="+st.Value)
	}
	binID := s.add(spdxPackage{
		SPDXID:          s.id("Binary", name),
		Name:            name,
		VersionInfo:     version,
		PackageFileName: name,
		Checksums:       []spdxChecksum{{"SHA256", sum}},
		PrimaryPurpose:  "APPLICATION",
		Comment:         "Go build settings: " + strings.Join(settings, " "),
	})
	// The main module is vigil itself at the release's version ((devel) in
	// a build from a checkout).
	mainID := s.add(spdxPackage{
		SPDXID:           s.id("Module", bi.Main.Path+"-"+name),
		Name:             bi.Main.Path,
		VersionInfo:      version,
		DownloadLocation: "https://github.com/vigil-ha/vigil",
		PrimaryPurpose:   "SOURCE",
		ExternalRefs:     []spdxRef{purl(bi.Main.Path, "v"+version)},
	})
	s.relate(binID, "GENERATED_FROM", mainID)
	goID := s.add(spdxPackage{
		SPDXID:           s.id("Go", bi.GoVersion+"-"+name),
		Name:             "golang.org/toolchain",
		VersionInfo:      bi.GoVersion,
		DownloadLocation: "https://go.dev/dl/",
		PrimaryPurpose:   "LIBRARY",
		ExternalRefs:     []spdxRef{purl("stdlib", bi.GoVersion)},
		Comment:          "The Go standard library and runtime linked into the binary.",
	})
	s.relate(binID, "CONTAINS", goID)
	for _, d := range bi.Deps {
		m := d
		if d.Replace != nil {
			m = d.Replace
		}
		p := spdxPackage{
			SPDXID:           s.id("Module", m.Path+"-"+m.Version+"-"+name),
			Name:             m.Path,
			VersionInfo:      m.Version,
			DownloadLocation: "https://proxy.golang.org/" + strings.ToLower(m.Path) + "/@v/" + m.Version + ".zip",
			PrimaryPurpose:   "LIBRARY",
			ExternalRefs:     []spdxRef{purl(m.Path, m.Version)},
		}
		if m.Sum != "" {
			// go.sum's hash of the module's files (h1: SHA-256 of its
			// file list), which SPDX has no algorithm for.
			p.Comment = "go.sum hash " + m.Sum
		}
		if d.Replace != nil {
			p.Comment = strings.TrimSpace(p.Comment + " (replaces " + d.Path + " " + d.Version + ")")
		}
		s.relate(binID, "CONTAINS", s.add(p))
	}
	return binID, nil
}

func purl(path, version string) spdxRef {
	loc := "pkg:golang/" + path + "@" + version
	if path == "stdlib" {
		loc = "pkg:golang/stdlib@" + version
	}
	return spdxRef{"PACKAGE-MANAGER", "purl", loc}
}

func (s *sbom) write(path string) error {
	b, err := json.MarshalIndent(s.doc, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// binarySBOM writes <binary>.spdx.json beside the binary.
func (r *release) binarySBOM(bin string) error {
	sum, err := fileSHA256(bin)
	if err != nil {
		return err
	}
	s := newSBOM(filepath.Base(bin), sum, r.mtime)
	id, err := s.addBinary(bin, r.version)
	if err != nil {
		return err
	}
	s.relate("SPDXRef-DOCUMENT", "DESCRIBES", id)
	return s.write(bin + ".spdx.json")
}

// imageSBOM writes <image>.spdx.json: the archive, and each binary it
// holds with that binary's modules. The image holds nothing but vigil's
// two static binaries per architecture (hack/buildimage: no base image,
// no shell, no libc), each the same bytes as the one released beside it;
// a binary that differs is an error, not an SBOM about other bytes.
func (r *release) imageSBOM() error {
	sum, err := fileSHA256(r.image)
	if err != nil {
		return err
	}
	s := newSBOM(filepath.Base(r.image), sum, r.mtime)
	imgID := s.add(spdxPackage{
		SPDXID:          s.id("Image", filepath.Base(r.image)),
		Name:            "ghcr.io/vigil-ha/vigil",
		VersionInfo:     "v" + r.version,
		PackageFileName: filepath.Base(r.image),
		Checksums:       []spdxChecksum{{"SHA256", sum}},
		PrimaryPurpose:  "CONTAINER",
		ExternalRefs:    []spdxRef{{"PACKAGE-MANAGER", "purl", "pkg:oci/vigil@sha256:" + sum + "?repository_url=ghcr.io/vigil-ha"}},
		Comment:         "OCI image archive; the checksum is the archive file's.",
	})
	s.relate("SPDXRef-DOCUMENT", "DESCRIBES", imgID)
	for _, arch := range r.arches {
		for _, cmd := range commands {
			in := filepath.Join(r.imageBinaries, cmd+"-linux-"+arch)
			released := filepath.Join(r.dist, binaryName(cmd, r.version, arch))
			a, err := fileSHA256(in)
			if err != nil {
				return err
			}
			b, err := fileSHA256(released)
			if err != nil {
				return err
			}
			if a != b {
				return fmt.Errorf("the image's %s differs from the released %s", in, released)
			}
			id, err := s.addBinary(released, r.version)
			if err != nil {
				return err
			}
			s.relate(imgID, "CONTAINS", id)
		}
	}
	return s.write(r.image + ".spdx.json")
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// writeSums writes SHA256SUMS in dist: every file but itself and the
// signatures, in sha256sum's format, sorted by name.
func writeSums(dist string) error {
	entries, err := os.ReadDir(dist)
	if err != nil {
		return err
	}
	var b strings.Builder
	for _, e := range entries { // ReadDir sorts by name
		n := e.Name()
		if e.IsDir() || n == "SHA256SUMS" || strings.HasSuffix(n, ".minisig") {
			continue
		}
		sum, err := fileSHA256(filepath.Join(dist, n))
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "%s  %s\n", sum, n)
	}
	return os.WriteFile(filepath.Join(dist, "SHA256SUMS"), []byte(b.String()), 0o644)
}
