package main

import (
	"encoding/json"
	"fmt"
	"net/url"
	"runtime/debug"
	"sort"
	"strings"
	"time"

	"github.com/latchcsi/latch/internal/version"
)

// The SPDX 2.3 JSON fields the SBOM uses (https://spdx.github.io/spdx-spec/v2.3/).
type spdxDocument struct {
	SPDXVersion       string             `json:"spdxVersion"`
	DataLicense       string             `json:"dataLicense"`
	SPDXID            string             `json:"SPDXID"`
	Name              string             `json:"name"`
	DocumentNamespace string             `json:"documentNamespace"`
	CreationInfo      spdxCreationInfo   `json:"creationInfo"`
	Packages          []spdxPackage      `json:"packages"`
	Relationships     []spdxRelationship `json:"relationships"`
}

type spdxCreationInfo struct {
	Created  string   `json:"created"`
	Creators []string `json:"creators"`
}

type spdxPackage struct {
	SPDXID                string            `json:"SPDXID"`
	Name                  string            `json:"name"`
	VersionInfo           string            `json:"versionInfo,omitempty"`
	DownloadLocation      string            `json:"downloadLocation"`
	FilesAnalyzed         bool              `json:"filesAnalyzed"`
	PrimaryPackagePurpose string            `json:"primaryPackagePurpose,omitempty"`
	Checksums             []spdxChecksum    `json:"checksums,omitempty"`
	ExternalRefs          []spdxExternalRef `json:"externalRefs,omitempty"`
	Comment               string            `json:"comment,omitempty"`
}

type spdxChecksum struct {
	Algorithm     string `json:"algorithm"`
	ChecksumValue string `json:"checksumValue"`
}

type spdxExternalRef struct {
	ReferenceCategory string `json:"referenceCategory"`
	ReferenceType     string `json:"referenceType"`
	ReferenceLocator  string `json:"referenceLocator"`
}

type spdxRelationship struct {
	SPDXElementID      string `json:"spdxElementId"`
	RelationshipType   string `json:"relationshipType"`
	RelatedSPDXElement string `json:"relatedSpdxElement"`
}

// spdx is the SBOM of one binary: the binary itself (the application, with
// its SHA-256 and how it was built), and every Go module the toolchain
// recorded as linked into it (debug/buildinfo: the main module, each
// dependency at the version that was built, replacements applied, and the
// standard library of the Go release), each with its package URL. It
// returns the document and how many modules it lists.
func spdx(binary string, p platform, binarySHA256 string, bi *debug.BuildInfo, created time.Time) ([]byte, int, error) {
	source := sourceURL(bi.Main.Path)
	var settings []string
	for _, s := range bi.Settings {
		settings = append(settings, s.Key+"="+s.Value)
	}
	sort.Strings(settings)
	download := "NOASSERTION"
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" {
			download = "git+" + source + ".git@" + s.Value
		}
	}
	app := spdxPackage{
		SPDXID:                "SPDXRef-Package-" + pathSafe(binary),
		Name:                  binary,
		VersionInfo:           version.Version,
		DownloadLocation:      download,
		PrimaryPackagePurpose: "APPLICATION",
		Checksums:             []spdxChecksum{{Algorithm: "SHA256", ChecksumValue: binarySHA256}},
		Comment:               fmt.Sprintf("/%s of the image for %s, built by %s with %s", binary, p, bi.GoVersion, strings.Join(settings, " ")),
	}
	doc := spdxDocument{
		SPDXVersion:       "SPDX-2.3",
		DataLicense:       "CC0-1.0",
		SPDXID:            "SPDXRef-DOCUMENT",
		Name:              fmt.Sprintf("%s %s %s", binary, version.Version, p),
		DocumentNamespace: fmt.Sprintf("%s/spdx/%s-%s-%s-%s-%s", source, binary, version.Version, p.os, p.arch, binarySHA256),
		CreationInfo: spdxCreationInfo{
			Created:  created.Format(time.RFC3339),
			Creators: []string{"Tool: latch-hack-image-" + version.Version},
		},
		Packages:      []spdxPackage{app},
		Relationships: []spdxRelationship{{"SPDXRef-DOCUMENT", "DESCRIBES", app.SPDXID}},
	}
	add := func(pkg spdxPackage) {
		pkg.SPDXID = fmt.Sprintf("SPDXRef-Module-%d-%s", len(doc.Packages), pathSafe(pkg.Name))
		pkg.DownloadLocation = "NOASSERTION"
		pkg.PrimaryPackagePurpose = "LIBRARY"
		doc.Packages = append(doc.Packages, pkg)
		doc.Relationships = append(doc.Relationships, spdxRelationship{app.SPDXID, "CONTAINS", pkg.SPDXID})
	}
	goVersion := strings.TrimPrefix(bi.GoVersion, "go")
	add(spdxPackage{Name: "stdlib", VersionInfo: bi.GoVersion, ExternalRefs: purl("stdlib", goVersion), Comment: "the Go standard library and runtime"})
	add(module(&bi.Main))
	for _, d := range bi.Deps {
		add(module(d))
	}
	out, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return nil, 0, err
	}
	return append(out, '\n'), 1 + len(bi.Deps), nil
}

// module is the SPDX package of one module as it was built: a replacement's
// path and version when the module was replaced.
func module(m *debug.Module) spdxPackage {
	pkg := spdxPackage{Name: m.Path, VersionInfo: m.Version}
	built := m
	if m.Replace != nil {
		built = m.Replace
		pkg.VersionInfo = built.Version
		pkg.Comment = fmt.Sprintf("replaced: %s %s => %s %s", m.Path, m.Version, built.Path, built.Version)
	}
	if built.Sum != "" {
		pkg.Comment = strings.TrimPrefix(pkg.Comment+"; go.sum "+built.Sum, "; ")
	}
	if built.Version != "" && built.Version != "(devel)" {
		pkg.ExternalRefs = purl(built.Path, built.Version)
	}
	return pkg
}

// purl is the package URL of a Go module (https://github.com/package-url/purl-spec):
// pkg:golang/<module path>@<version>, the version percent-encoded.
func purl(path, version string) []spdxExternalRef {
	v := strings.ReplaceAll(url.PathEscape(version), "+", "%2B")
	return []spdxExternalRef{{
		ReferenceCategory: "PACKAGE-MANAGER",
		ReferenceType:     "purl",
		ReferenceLocator:  "pkg:golang/" + path + "@" + v,
	}}
}
