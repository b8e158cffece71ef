package deploy_test

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"debug/buildinfo"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/latchcsi/latch/internal/version"
)

// imageBinary is the binary whose image the test builds, for both
// platforms, with make image: csi-mock-driver links the fewest packages of
// the released binaries (329 with grpcnotrace, against 593 for latchctl and
// 882 for csi-attacher), so that the first run's cross-compile (-trimpath
// and CGO_ENABLED=0 share no build cache with the tests' own builds) costs
// the least; every binary goes through the same code in hack/image.
const imageBinary = "csi-mock-driver"

// craneVersion is the crane (github.com/google/go-containerregistry) the
// test pushes the image with, as docs/deploy.md tells to.
const craneVersion = "v0.22.1"

var imagePlatforms = []string{"linux/amd64", "linux/arm64"}

// make image builds, from Go modules alone, a multi-platform OCI image
// layout of each binary: the test builds csi-mock-driver's twice, opens the
// layout, checks the index, each image's config and layer, runs the binary
// from its layer, checks the SBOM against go list, that both builds are
// identical, and that crane pushes the layout as it is.
func TestMakeImageBuildsReproducibleMultiPlatformImagesWithSBOMs(t *testing.T) {
	root := repoRoot(t)
	tmp := t.TempDir()
	first, second := filepath.Join(tmp, "first"), filepath.Join(tmp, "second")
	out := makeImage(t, root, first)
	makeImage(t, root, second)

	lay := filepath.Join(first, imageBinary)
	top := readJSON[ocispec.Index](t, filepath.Join(lay, ocispec.ImageIndexFile))
	if len(top.Manifests) != 1 || top.Manifests[0].MediaType != ocispec.MediaTypeImageIndex {
		t.Fatalf("index.json lists %+v, want one image index", top.Manifests)
	}
	if ref := top.Manifests[0].Annotations[ocispec.AnnotationRefName]; ref != version.Version {
		t.Errorf("index.json names the index %q, want the version %s (IMAGE_TAG's default)", ref, version.Version)
	}
	layoutMarker := readJSON[ocispec.ImageLayout](t, filepath.Join(lay, ocispec.ImageLayoutFile))
	if layoutMarker.Version != ocispec.ImageLayoutVersion {
		t.Errorf("oci-layout says version %q", layoutMarker.Version)
	}
	indexDesc := top.Manifests[0]
	if !strings.Contains(out, indexDesc.Digest.String()) {
		t.Errorf("make image did not print the index digest %s:\n%s", indexDesc.Digest, out)
	}
	index := blobJSON[ocispec.Index](t, lay, indexDesc)

	images := map[string]ocispec.Descriptor{}
	var sboms []ocispec.Descriptor
	for _, d := range index.Manifests {
		switch {
		case d.Platform == nil:
			t.Errorf("index entry %s has no platform", d.Digest)
		case d.Platform.OS == "unknown" && d.Platform.Architecture == "unknown":
			sboms = append(sboms, d)
		default:
			images[d.Platform.OS+"/"+d.Platform.Architecture] = d
		}
	}
	if got := slices.Sorted(maps.Keys(images)); !slices.Equal(got, imagePlatforms) {
		t.Fatalf("index has images for %v, want %v", got, imagePlatforms)
	}

	makefileTags := makefileVar(t, root, "BUILD_TAGS")
	wantCreated := time.Time{}
	for _, p := range imagePlatforms {
		t.Run(p, func(t *testing.T) {
			bin, info, created := checkImage(t, lay, p, images[p], makefileTags)
			if wantCreated.IsZero() {
				wantCreated = created
			} else if !created.Equal(wantCreated) {
				t.Errorf("created %s, the other platform's %s", created, wantCreated)
			}
			if !strings.Contains(out, images[p].Digest.String()) {
				t.Errorf("make image did not print %s's digest %s", p, images[p].Digest)
			}
			sbom := sbomOf(t, lay, images[p], sboms)
			beside, err := os.ReadFile(filepath.Join(first, imageBinary+"."+strings.ReplaceAll(p, "/", "-")+".spdx.json"))
			if err != nil {
				t.Fatalf("the SBOM beside the layout: %v", err)
			}
			if !bytes.Equal(sbom, beside) {
				t.Error("the SBOM attached to the image differs from the one beside the layout")
			}
			checkSBOM(t, root, p, sbom, bin, info, makefileTags)
			if p == "linux/"+runtime.GOARCH {
				runFromLayer(t, bin)
			}
		})
	}
	if len(sboms) != len(imagePlatforms) {
		t.Errorf("%d SBOM artifacts in the index, want one per image", len(sboms))
	}

	t.Run("reproducible", func(t *testing.T) {
		if diff := compareTrees(t, first, second); diff != "" {
			t.Errorf("two builds of the same tree differ: %s", diff)
		}
	})
	t.Run("crane push", func(t *testing.T) {
		cranePush(t, lay, indexDesc, images, sboms)
	})
}

// makeImage runs the Makefile's image target for imageBinary into dir.
func makeImage(t *testing.T, root, dir string) string {
	t.Helper()
	cmd := exec.Command("make", "--no-print-directory", "image", "IMAGE_BINARIES="+imageBinary, "IMAGE_DIR="+dir)
	cmd.Dir = root
	// A make test's jobserver does not reach this make.
	cmd.Env = slices.DeleteFunc(os.Environ(), func(e string) bool {
		return strings.HasPrefix(e, "MAKEFLAGS=") || strings.HasPrefix(e, "MFLAGS=") || strings.HasPrefix(e, "MAKELEVEL=")
	})
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("make image: %v\n%s%s", err, stdout.String(), stderr.String())
	}
	t.Logf("make image:\n%s", stdout.String())
	return stdout.String()
}

// checkImage checks one platform's image: its config and its one layer. It
// returns the binary from the layer, its build info and the image's
// creation time.
func checkImage(t *testing.T, lay, platform string, desc ocispec.Descriptor, tags string) ([]byte, *buildinfo.BuildInfo, time.Time) {
	t.Helper()
	if desc.MediaType != ocispec.MediaTypeImageManifest {
		t.Fatalf("media type %q", desc.MediaType)
	}
	m := blobJSON[ocispec.Manifest](t, lay, desc)
	cfg := blobJSON[ocispec.Image](t, lay, m.Config)
	if m.Config.MediaType != ocispec.MediaTypeImageConfig {
		t.Errorf("config media type %q", m.Config.MediaType)
	}
	if got := cfg.OS + "/" + cfg.Architecture; got != platform {
		t.Errorf("config is for %s", got)
	}
	c := cfg.Config
	if c.User != "65532:65532" {
		t.Errorf("User %q, want 65532:65532 (the manifests' runAsUser)", c.User)
	}
	if !slices.Equal(c.Entrypoint, []string{"/" + imageBinary}) || len(c.Cmd) != 0 {
		t.Errorf("Entrypoint %q Cmd %q, want [/%s] and none", c.Entrypoint, c.Cmd, imageBinary)
	}
	if len(m.Layers) != 1 || m.Layers[0].MediaType != ocispec.MediaTypeImageLayerGzip || len(cfg.RootFS.DiffIDs) != 1 {
		t.Fatalf("layers %+v, diff IDs %v: want one gzip layer", m.Layers, cfg.RootFS.DiffIDs)
	}
	files, diffID := readLayer(t, blob(t, lay, m.Layers[0]))
	if diffID != cfg.RootFS.DiffIDs[0].String() {
		t.Errorf("the layer's diff ID is %s, the config says %s", diffID, cfg.RootFS.DiffIDs[0])
	}
	bin := files[imageBinary]
	if bin == nil || bin.mode != 0o755 {
		t.Fatalf("/%s missing or not mode 0755 in the layer", imageBinary)
	}
	info, err := buildinfo.Read(bytes.NewReader(bin.data))
	if err != nil {
		t.Fatalf("build info of /%s: %v", imageBinary, err)
	}
	settings := map[string]string{}
	for _, s := range info.Settings {
		settings[s.Key] = s.Value
	}
	for k, want := range map[string]string{"GOOS": "linux", "GOARCH": strings.TrimPrefix(platform, "linux/"), "CGO_ENABLED": "0", "-trimpath": "true", "-tags": tags} {
		if settings[k] != want {
			t.Errorf("/%s was built with %s=%q, want %q", imageBinary, k, settings[k], want)
		}
	}
	if strings.Contains(settings["-ldflags"], "-X") {
		t.Errorf("/%s was built with -ldflags %q: the version comes from internal/version/VERSION, nothing is set with -X", imageBinary, settings["-ldflags"])
	}
	ef, err := elf.NewFile(bytes.NewReader(bin.data))
	if err != nil {
		t.Fatalf("/%s is not an ELF binary: %v", imageBinary, err)
	}
	if want := map[string]elf.Machine{"linux/amd64": elf.EM_X86_64, "linux/arm64": elf.EM_AARCH64}[platform]; ef.Machine != want {
		t.Errorf("/%s is for %s, want %s", imageBinary, ef.Machine, want)
	}

	// Every timestamp is SOURCE_DATE_EPOCH, else the commit's time.
	created := time.Time{}
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		sec, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		created = time.Unix(sec, 0).UTC()
	} else if created, err = time.Parse(time.RFC3339, settings["vcs.time"]); err != nil {
		t.Fatalf("/%s carries no commit time (vcs.time %q): %v", imageBinary, settings["vcs.time"], err)
	}
	if cfg.Created == nil || !cfg.Created.Equal(created) {
		t.Errorf("config created %v, want %s", cfg.Created, created)
	}
	for name, f := range files {
		if !f.modTime.Equal(created) {
			t.Errorf("layer entry %s has mtime %s, want %s", name, f.modTime, created)
		}
	}
	wantLabels := map[string]string{
		"org.opencontainers.image.title":   imageBinary,
		"org.opencontainers.image.version": version.Version,
		"org.opencontainers.image.source":  "https://github.com/latchcsi/latch",
		"org.opencontainers.image.created": created.Format(time.RFC3339),
	}
	if rev := settings["vcs.revision"]; rev != "" {
		wantLabels["org.opencontainers.image.revision"] = rev
	}
	if !maps.Equal(c.Labels, wantLabels) {
		t.Errorf("labels %v, want %v", c.Labels, wantLabels)
	}

	// What the binary needs of a base image: the nonroot user and group,
	// its home, /tmp. Nothing else.
	wantFiles := map[string]layerFile{
		"etc/":          {mode: 0o755, dir: true},
		"etc/group":     {mode: 0o644},
		"etc/passwd":    {mode: 0o644},
		"home/":         {mode: 0o755, dir: true},
		"home/nonroot/": {mode: 0o700, dir: true, uid: 65532, gid: 65532},
		"tmp/":          {mode: 0o1777, dir: true},
		imageBinary:     {mode: 0o755},
	}
	if got, want := slices.Sorted(maps.Keys(files)), slices.Sorted(maps.Keys(wantFiles)); !slices.Equal(got, want) {
		t.Errorf("layer holds %v, want %v", got, want)
	}
	for name, w := range wantFiles {
		if f := files[name]; f != nil && (f.mode != w.mode || f.dir != w.dir || f.uid != w.uid || f.gid != w.gid) {
			t.Errorf("layer entry %s: mode %o dir %v owner %d:%d, want mode %o dir %v owner %d:%d", name, f.mode, f.dir, f.uid, f.gid, w.mode, w.dir, w.uid, w.gid)
		}
	}
	if f := files["etc/passwd"]; f == nil || !regexp.MustCompile(`(?m)^nonroot:x:65532:65532:[^:]*:/home/nonroot:`).Match(f.data) {
		t.Errorf("/etc/passwd has no nonroot user 65532 with home /home/nonroot")
	}
	if f := files["etc/group"]; f == nil || !regexp.MustCompile(`(?m)^nonroot:x:65532:`).Match(f.data) {
		t.Errorf("/etc/group has no nonroot group 65532")
	}
	return bin.data, info, created
}

// runFromLayer runs the binary taken from the image's layer.
func runFromLayer(t *testing.T, bin []byte) {
	t.Helper()
	path := filepath.Join(t.TempDir(), imageBinary)
	if err := os.WriteFile(path, bin, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(path, "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("%s --version from the image: %v\n%s", imageBinary, err, out)
	}
	if want := imageBinary + " " + version.Version + "\n"; string(out) != want {
		t.Errorf("%s --version from the image printed %q, want %q", imageBinary, out, want)
	}
}

// sbomOf is the SPDX document attached to the image desc: the artifact in
// the index whose subject it is.
func sbomOf(t *testing.T, lay string, image ocispec.Descriptor, sboms []ocispec.Descriptor) []byte {
	t.Helper()
	var found [][]byte
	for _, d := range sboms {
		m := blobJSON[ocispec.Manifest](t, lay, d)
		if m.Subject == nil || m.Subject.Digest != image.Digest {
			continue
		}
		if m.ArtifactType != "application/spdx+json" || m.Config.MediaType != ocispec.MediaTypeEmptyJSON || len(m.Layers) != 1 || m.Layers[0].MediaType != "application/spdx+json" {
			t.Errorf("SBOM artifact %s: artifactType %q, config %q, layers %+v; want an application/spdx+json artifact with the empty config and the document as its layer", d.Digest, m.ArtifactType, m.Config.MediaType, m.Layers)
			continue
		}
		if string(blob(t, lay, m.Config)) != "{}" {
			t.Errorf("SBOM artifact %s: the empty config is not {}", d.Digest)
		}
		found = append(found, blob(t, lay, m.Layers[0]))
	}
	if len(found) != 1 {
		t.Fatalf("%d SBOM artifacts name image %s as subject, want 1", len(found), image.Digest)
	}
	return found[0]
}

// checkSBOM checks the SPDX document: it describes the binary (its
// SHA-256) and lists every module go list says the binary links, at the
// version built, and the Go release.
func checkSBOM(t *testing.T, root, platform string, doc, bin []byte, info *buildinfo.BuildInfo, tags string) {
	t.Helper()
	var sbom struct {
		SPDXVersion string `json:"spdxVersion"`
		DataLicense string `json:"dataLicense"`
		SPDXID      string `json:"SPDXID"`
		Namespace   string `json:"documentNamespace"`
		Packages    []struct {
			SPDXID    string `json:"SPDXID"`
			Name      string `json:"name"`
			Version   string `json:"versionInfo"`
			Checksums []struct {
				Algorithm string `json:"algorithm"`
				Value     string `json:"checksumValue"`
			} `json:"checksums"`
			ExternalRefs []struct {
				Type    string `json:"referenceType"`
				Locator string `json:"referenceLocator"`
			} `json:"externalRefs"`
		} `json:"packages"`
		Relationships []struct {
			From string `json:"spdxElementId"`
			Type string `json:"relationshipType"`
			To   string `json:"relatedSpdxElement"`
		} `json:"relationships"`
	}
	if err := json.Unmarshal(doc, &sbom); err != nil {
		t.Fatalf("SBOM: %v", err)
	}
	if sbom.SPDXVersion != "SPDX-2.3" || sbom.DataLicense != "CC0-1.0" || sbom.SPDXID != "SPDXRef-DOCUMENT" || sbom.Namespace == "" {
		t.Errorf("SBOM header: version %q, data license %q, ID %q, namespace %q", sbom.SPDXVersion, sbom.DataLicense, sbom.SPDXID, sbom.Namespace)
	}
	sum := sha256.Sum256(bin)
	described := ""
	for _, r := range sbom.Relationships {
		if r.From == "SPDXRef-DOCUMENT" && r.Type == "DESCRIBES" {
			described = r.To
		}
	}
	contained := map[string]bool{}
	modules := map[string]string{} // name -> version
	purls := map[string]string{}
	for _, r := range sbom.Relationships {
		if r.From == described && r.Type == "CONTAINS" {
			contained[r.To] = true
		}
	}
	for _, p := range sbom.Packages {
		if p.SPDXID == described {
			if p.Name != imageBinary || p.Version != version.Version || len(p.Checksums) != 1 || p.Checksums[0].Algorithm != "SHA256" || p.Checksums[0].Value != hex.EncodeToString(sum[:]) {
				t.Errorf("SBOM describes %s %s with checksums %+v, want %s %s with the SHA-256 of the binary in the layer", p.Name, p.Version, p.Checksums, imageBinary, version.Version)
			}
			continue
		}
		if !contained[p.SPDXID] {
			t.Errorf("SBOM package %s (%s) is not CONTAINed by the binary", p.SPDXID, p.Name)
		}
		modules[p.Name] = p.Version
		for _, r := range p.ExternalRefs {
			if r.Type == "purl" {
				purls[p.Name] = r.Locator
			}
		}
	}
	if modules["stdlib"] != info.GoVersion {
		t.Errorf("SBOM lists stdlib %q, the binary was built by %s", modules["stdlib"], info.GoVersion)
	}
	if _, ok := modules[info.Main.Path]; !ok {
		t.Errorf("SBOM lists no main module %s", info.Main.Path)
	}

	// The modules the binary links, from the source (not from the binary).
	goos, goarch, _ := strings.Cut(platform, "/")
	cmd := exec.Command("go", "list", "-deps", "-tags", tags,
		"-f", `{{with .Module}}{{if not .Main}}{{.Path}} {{.Version}}{{with .Replace}} {{.Path}} {{.Version}}{{end}}{{end}}{{end}}`,
		"./cmd/"+imageBinary)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GOOS="+goos, "GOARCH="+goarch, "CGO_ENABLED=0")
	listed, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	want := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(listed)), "\n") {
		if f := strings.Fields(line); len(f) >= 2 {
			want[f[0]] = f[len(f)-1]
		}
	}
	if len(want) == 0 {
		t.Fatal("go list found no module")
	}
	for path, v := range want {
		if modules[path] != v {
			t.Errorf("SBOM lists module %s at %q, go list says the binary links %s", path, modules[path], v)
		}
		if purls[path] != "pkg:golang/"+path+"@"+strings.ReplaceAll(v, "+", "%2B") {
			t.Errorf("module %s: purl %q", path, purls[path])
		}
	}
	for path := range modules {
		if _, ok := want[path]; !ok && path != "stdlib" && path != info.Main.Path {
			t.Errorf("SBOM lists module %s, which go list does not", path)
		}
	}
}

// cranePush pushes the layout with crane, as docs/deploy.md tells, to
// crane's own registry on a local port: the pushed index has the layout's
// digest, crane validates it, and the registry lists each SBOM as its
// image's referrer.
func cranePush(t *testing.T, lay string, index ocispec.Descriptor, images map[string]ocispec.Descriptor, sboms []ocispec.Descriptor) {
	bin := t.TempDir()
	install := exec.Command("go", "install", "github.com/google/go-containerregistry/cmd/crane@"+craneVersion)
	install.Env = append(os.Environ(), "GOBIN="+bin, "GOFLAGS=-buildvcs=false")
	if out, err := install.CombinedOutput(); err != nil {
		t.Fatalf("go install crane: %v\n%s", err, out)
	}
	crane := filepath.Join(bin, "crane")

	serve := exec.Command(crane, "registry", "serve", "--address", "127.0.0.1:0")
	logs, err := serve.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = serve.Process.Kill()
		_ = serve.Wait()
	})
	port := ""
	scanner := bufio.NewScanner(logs)
	for port == "" && scanner.Scan() {
		if m := regexp.MustCompile(`serving on port (\d+)`).FindStringSubmatch(scanner.Text()); m != nil {
			port = m[1]
		}
	}
	if port == "" {
		t.Fatalf("crane registry serve printed no port: %v", scanner.Err())
	}
	go func() { _, _ = io.Copy(io.Discard, logs) }()
	repo := "127.0.0.1:" + port + "/latch/" + imageBinary

	run := func(args ...string) string {
		t.Helper()
		var stdout, stderr bytes.Buffer
		cmd := exec.Command(crane, args...)
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("crane %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
		}
		return strings.TrimSpace(stdout.String())
	}
	if got, want := run("push", lay, repo+":"+version.Version), repo+"@"+index.Digest.String(); got != want {
		t.Errorf("crane push printed %q, want %q: the registry holds another index than the layout", got, want)
	}
	if got := run("validate", "--remote", repo+":"+version.Version); !strings.HasPrefix(got, "PASS") {
		t.Errorf("crane validate: %s", got)
	}
	// crane's registry has no referrers API: crane keeps the referrers of
	// an image in the tag sha256-<digest> (the OCI 1.1 fallback).
	for _, p := range imagePlatforms {
		raw := run("manifest", repo+":"+strings.Replace(images[p].Digest.String(), ":", "-", 1))
		var referrers ocispec.Index
		if err := json.Unmarshal([]byte(raw), &referrers); err != nil {
			t.Fatalf("referrers of %s: %v", p, err)
		}
		n := 0
		for _, d := range referrers.Manifests {
			if slices.ContainsFunc(sboms, func(s ocispec.Descriptor) bool { return s.Digest == d.Digest }) && d.ArtifactType == "application/spdx+json" {
				n++
			}
		}
		if n != 1 {
			t.Errorf("the registry lists %d SBOMs as referrers of the %s image, want 1: %s", n, p, raw)
		}
	}
}

type layerFile struct {
	mode     int64
	dir      bool
	uid, gid int
	modTime  time.Time
	data     []byte
}

// readLayer unpacks a tar+gzip layer; it returns its entries and diff ID.
func readLayer(t *testing.T, gz []byte) (map[string]*layerFile, string) {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		t.Fatalf("layer: %v", err)
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		t.Fatalf("layer: %v", err)
	}
	sum := sha256.Sum256(raw)
	files := map[string]*layerFile{}
	tr := tar.NewReader(bytes.NewReader(raw))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("layer: %v", err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[h.Name] = &layerFile{mode: h.Mode, dir: h.Typeflag == tar.TypeDir, uid: h.Uid, gid: h.Gid, modTime: h.ModTime, data: data}
	}
	return files, "sha256:" + hex.EncodeToString(sum[:])
}

// blob reads desc's blob from the layout and checks its digest and size.
func blob(t *testing.T, lay string, desc ocispec.Descriptor) []byte {
	t.Helper()
	if desc.Digest.Algorithm() != "sha256" {
		t.Fatalf("descriptor %s: not sha256", desc.Digest)
	}
	raw, err := os.ReadFile(filepath.Join(lay, "blobs", "sha256", desc.Digest.Encoded()))
	if err != nil {
		t.Fatalf("blob %s: %v", desc.Digest, err)
	}
	sum := sha256.Sum256(raw)
	if got := hex.EncodeToString(sum[:]); got != desc.Digest.Encoded() || int64(len(raw)) != desc.Size {
		t.Fatalf("blob %s: content has digest sha256:%s and %d bytes, the descriptor says %d", desc.Digest, got, len(raw), desc.Size)
	}
	return raw
}

func blobJSON[T any](t *testing.T, lay string, desc ocispec.Descriptor) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(blob(t, lay, desc), &v); err != nil {
		t.Fatalf("blob %s: %v", desc.Digest, err)
	}
	return v
}

func readJSON[T any](t *testing.T, path string) T {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var v T
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return v
}

// compareTrees says how the files under a and b differ ("" when they are
// the same).
func compareTrees(t *testing.T, a, b string) string {
	t.Helper()
	read := func(root string) map[string][]byte {
		files := map[string][]byte{}
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			rel, _ := filepath.Rel(root, path)
			files[rel], err = os.ReadFile(path)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return files
	}
	fa, fb := read(a), read(b)
	if len(fa) == 0 {
		return "no files"
	}
	for name, content := range fa {
		if other, ok := fb[name]; !ok {
			return name + " only in the first"
		} else if !bytes.Equal(content, other) {
			return name + " differs"
		}
	}
	for name := range fb {
		if _, ok := fa[name]; !ok {
			return name + " only in the second"
		}
	}
	return ""
}

// makefileVar is the default value the Makefile gives name (NAME ?= value).
func makefileVar(t *testing.T, root, name string) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` \?= (.*)$`).FindSubmatch(raw)
	if m == nil {
		t.Fatalf("the Makefile sets no %s", name)
	}
	return strings.TrimSpace(string(m[1]))
}
