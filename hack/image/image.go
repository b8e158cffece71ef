package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/latchcsi/latch/internal/version"
)

// nonroot is the user and group every image runs as: the manifests'
// runAsUser and runAsGroup, distroless' "nonroot".
const nonroot = 65532

// platformImage is one binary for one platform: its single layer, its
// image config's inputs and its SBOM.
type platformImage struct {
	binary   string
	platform platform
	created  time.Time
	labels   map[string]string
	revision string // vcs.revision, "" when the toolchain stamped none
	modified bool   // vcs.modified: built from a working tree with changes

	layer        []byte // tar+gzip
	diffID       string // sha256:<hex> of the uncompressed tar
	uncompressed int64

	sbom    []byte
	modules int
}

func newPlatformImage(binary string, p platform, path string) (platformImage, error) {
	bin, err := os.ReadFile(path)
	if err != nil {
		return platformImage{}, err
	}
	bi, err := buildinfo.Read(bytes.NewReader(bin))
	if err != nil {
		return platformImage{}, fmt.Errorf("%s for %s: reading its build info: %w", binary, p, err)
	}
	settings := map[string]string{}
	for _, s := range bi.Settings {
		settings[s.Key] = s.Value
	}
	if settings["GOOS"] != p.os || settings["GOARCH"] != p.arch {
		return platformImage{}, fmt.Errorf("%s: built for %s/%s, want %s", path, settings["GOOS"], settings["GOARCH"], p)
	}
	created, err := sourceDate(settings["vcs.time"])
	if err != nil {
		return platformImage{}, err
	}
	img := platformImage{
		binary:   binary,
		platform: p,
		created:  created,
		revision: settings["vcs.revision"],
		modified: settings["vcs.modified"] == "true",
	}
	img.labels = map[string]string{
		"org.opencontainers.image.title":   binary,
		"org.opencontainers.image.version": version.Version,
		"org.opencontainers.image.source":  sourceURL(bi.Main.Path),
		"org.opencontainers.image.created": created.Format(time.RFC3339),
	}
	if img.revision != "" {
		img.labels["org.opencontainers.image.revision"] = img.revision
	}
	if img.layer, img.diffID, img.uncompressed, err = layer(binary, bin, created); err != nil {
		return platformImage{}, err
	}
	sum := sha256.Sum256(bin)
	if img.sbom, img.modules, err = spdx(binary, p, hex.EncodeToString(sum[:]), bi, created); err != nil {
		return platformImage{}, err
	}
	return img, nil
}

// sourceDate is the time every timestamp of the image carries:
// SOURCE_DATE_EPOCH when set, else the commit time the Go toolchain stamped
// into the binary.
func sourceDate(vcsTime string) (time.Time, error) {
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		sec, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH=%q: want seconds since 1970: %w", s, err)
		}
		return time.Unix(sec, 0).UTC(), nil
	}
	if vcsTime == "" {
		return time.Time{}, fmt.Errorf("the binary carries no commit time (not built in a git checkout?): set SOURCE_DATE_EPOCH")
	}
	t, err := time.Parse(time.RFC3339, vcsTime)
	if err != nil {
		return time.Time{}, fmt.Errorf("vcs.time %q: %w", vcsTime, err)
	}
	return t.UTC(), nil
}

// sourceURL is the repository a module path like github.com/o/r names.
func sourceURL(modulePath string) string {
	return "https://" + modulePath
}

// layer is the image's one layer: what the binary needs from a base image
// (the users, a home, /tmp) and the binary as /<binary>. Entries are in a
// fixed order, owned by root unless said otherwise, all with mtime created.
func layer(binary string, bin []byte, created time.Time) (gz []byte, diffID string, size int64, err error) {
	type entry struct {
		name     string
		mode     int64
		uid      int
		contents []byte
		dir      bool
	}
	entries := []entry{
		{name: "etc/", mode: 0o755, dir: true},
		{name: "etc/group", mode: 0o644, contents: []byte("root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n")},
		{name: "etc/passwd", mode: 0o644, contents: []byte(
			"root:x:0:0:root:/root:/sbin/nologin\n" +
				"nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n" +
				"nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")},
		{name: "home/", mode: 0o755, dir: true},
		{name: "home/nonroot/", mode: 0o700, uid: nonroot, dir: true},
		{name: "tmp/", mode: 0o1777, dir: true},
		{name: binary, mode: 0o755, contents: bin},
	}
	var tarBuf bytes.Buffer
	tw := tar.NewWriter(&tarBuf)
	for _, e := range entries {
		h := &tar.Header{
			Name:    e.name,
			Mode:    e.mode,
			Uid:     e.uid,
			Gid:     e.uid,
			ModTime: created,
			Format:  tar.FormatPAX,
		}
		if e.dir {
			h.Typeflag = tar.TypeDir
		} else {
			h.Typeflag = tar.TypeReg
			h.Size = int64(len(e.contents))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, "", 0, err
		}
		if _, err := tw.Write(e.contents); err != nil {
			return nil, "", 0, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, "", 0, err
	}
	sum := sha256.Sum256(tarBuf.Bytes())
	size = int64(tarBuf.Len())
	var gzBuf bytes.Buffer
	zw := gzip.NewWriter(&gzBuf) // no name, no mtime: the header is fixed
	if _, err := io.Copy(zw, &tarBuf); err != nil {
		return nil, "", 0, err
	}
	if err := zw.Close(); err != nil {
		return nil, "", 0, err
	}
	return gzBuf.Bytes(), "sha256:" + hex.EncodeToString(sum[:]), size, nil
}

// pathSafe turns s into characters an SPDX identifier may hold.
func pathSafe(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '-' {
			return r
		}
		return '-'
	}, s)
}
