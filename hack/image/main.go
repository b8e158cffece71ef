// Command image builds latch's container images from Go modules alone, with
// no container engine: each binary is cross-compiled (CGO_ENABLED=0,
// -trimpath) for every platform asked for and put on an empty base (scratch)
// with only what it needs, the nonroot user 65532 in /etc/passwd and
// /etc/group, its home and /tmp. Each binary gets an OCI image layout
// directory holding a multi-platform image index, ready for `crane push` or
// `skopeo copy --all oci:`, and an SPDX 2.3 SBOM per platform, made from the
// module list the Go toolchain embeds in the binary, written beside the
// layout and attached to its image as an OCI artifact (a manifest whose
// subject is the image, listed in the index so that a push carries it).
//
// The result is reproducible: every timestamp is SOURCE_DATE_EPOCH, or else
// the commit time the toolchain stamps into the binary (vcs.time), and
// nothing else varies between two builds of the same tree with the same Go
// toolchain. `make image` runs it; docs/deploy.md ("Images") explains the
// output and how to push it.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/latchcsi/latch/internal/version"
)

type options struct {
	out        string
	platforms  []platform
	buildTags  string
	tag        string
	repository string
	binaries   []string
}

func main() {
	var o options
	var platforms string
	fs := flag.NewFlagSet("image", flag.ExitOnError)
	fs.StringVar(&o.out, "o", "bin/images", "Directory to write each binary's OCI image layout (<dir>/<binary>) and SBOMs (<dir>/<binary>.<os>-<arch>.spdx.json) into.")
	fs.StringVar(&platforms, "platforms", "linux/amd64,linux/arm64", "Comma-separated os/arch pairs to build for.")
	fs.StringVar(&o.buildTags, "tags", "", "Go build tags (the Makefile's BUILD_TAGS).")
	fs.StringVar(&o.tag, "tag", version.Version, "Tag the layout names its image index by (org.opencontainers.image.ref.name).")
	fs.StringVar(&o.repository, "repository", "ghcr.io/latchcsi", "Registry and path the printed push commands name.")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: go run ./hack/image [flags] <binary>...\n\nBuilds an OCI image layout of ./cmd/<binary> for each binary.\n\n")
		fs.PrintDefaults()
	}
	_ = fs.Parse(os.Args[1:])
	o.binaries = fs.Args()
	if len(o.binaries) == 0 {
		fs.Usage()
		os.Exit(2)
	}
	var err error
	if o.platforms, err = parsePlatforms(platforms); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

type platform struct{ os, arch string }

func (p platform) String() string { return p.os + "/" + p.arch }

func parsePlatforms(s string) ([]platform, error) {
	var out []platform
	for _, f := range strings.Split(s, ",") {
		osName, arch, ok := strings.Cut(strings.TrimSpace(f), "/")
		if !ok || osName == "" || arch == "" || strings.Contains(arch, "/") {
			return nil, fmt.Errorf("platform %q: want os/arch, e.g. linux/arm64", f)
		}
		out = append(out, platform{osName, arch})
	}
	return out, nil
}

func run(ctx context.Context, o options) error {
	work, err := os.MkdirTemp("", "latch-image")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)

	// binaryPath[p][b] is binary b compiled for platform p.
	binaryPath := map[platform]map[string]string{}
	for _, p := range o.platforms {
		dir := filepath.Join(work, p.os+"-"+p.arch)
		if err := goBuild(ctx, p, o.buildTags, dir, o.binaries); err != nil {
			return err
		}
		binaryPath[p] = map[string]string{}
		for _, b := range o.binaries {
			binaryPath[p][b] = filepath.Join(dir, b)
		}
	}

	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return err
	}
	for _, b := range o.binaries {
		var images []platformImage
		for _, p := range o.platforms {
			img, err := newPlatformImage(b, p, binaryPath[p][b])
			if err != nil {
				return err
			}
			images = append(images, img)
		}
		res, err := writeLayout(filepath.Join(o.out, b), o.tag, images)
		if err != nil {
			return fmt.Errorf("%s: %w", b, err)
		}
		for _, img := range images {
			if err := os.WriteFile(filepath.Join(o.out, sbomFileName(b, img.platform)), img.sbom, 0o644); err != nil {
				return err
			}
		}
		report(os.Stdout, o, b, res)
	}
	return nil
}

// report prints what was built: the index digest to push, and each
// platform's image digest and sizes.
func report(w io.Writer, o options, binary string, res layoutResult) {
	dir := filepath.Join(o.out, binary)
	fmt.Fprintf(w, "%s %s  index %s  (%s, tag %s)\n", binary, version.Version, res.index, dir, o.tag)
	for _, img := range res.images {
		fmt.Fprintf(w, "  %-12s image %s  %s compressed, %s uncompressed  sbom %s (%d modules)\n",
			img.platform, img.manifest, mb(img.compressed), mb(img.uncompressed),
			filepath.Join(o.out, sbomFileName(binary, img.platform)), img.modules)
	}
	if res.modified {
		fmt.Fprintf(w, "  warning: built from a working tree with uncommitted changes (vcs.modified=true); the images are not those of revision %s\n", res.revision)
	}
	fmt.Fprintf(w, "  push: crane push %s %s/%s:%s\n", dir, o.repository, binary, o.tag)
}

func mb(n int64) string { return fmt.Sprintf("%.1f MB", float64(n)/1e6) }

func sbomFileName(binary string, p platform) string {
	return binary + "." + p.os + "-" + p.arch + ".spdx.json"
}
