package deploy_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/latchcsi/latch/internal/version"
)

// versionPin matches what pins a version of latch in the docs: a remote
// kustomize base's ?ref=, kustomize's newTag:, make image's IMAGE_TAG= and
// an image reference ghcr.io/latchcsi/<binary>:<tag>. A placeholder such as
// <version> is no pin.
var versionPin = regexp.MustCompile(`(\?ref=|newTag: *|IMAGE_TAG=|ghcr\.io/latchcsi/[a-z-]+:)(v[0-9][^\s)"'\x60]*)`)

// remoteBase is a remote kustomize base of this repository and its ref.
var remoteBase = regexp.MustCompile(`github\.com/latchcsi/latch/([^?\s]+)\?ref=`)

// Every version the docs pin is the one internal/version/VERSION holds, so
// that a reader who copies a command installs the version the docs
// describe; and when the repository has release tags (clones do not always
// carry them), that version is one of them, on a commit whose VERSION says
// so: a ?ref= pin names a tag.
func TestDocsPinTheVersionInternalVersionHolds(t *testing.T) {
	root := repoRoot(t)
	files := []string{"README.md", "charts/latch/README.md"}
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range docs {
		rel, _ := filepath.Rel(root, d)
		files = append(files, rel)
	}
	refPins := 0
	var bases []string // the directories the ?ref= pins name
	for _, f := range files {
		raw, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(raw), "\n") {
			for _, m := range remoteBase.FindAllStringSubmatch(line, -1) {
				bases = append(bases, m[1])
			}
			for _, m := range versionPin.FindAllStringSubmatch(line, -1) {
				if m[1] == "?ref=" {
					refPins++
				}
				if m[2] != version.Version {
					t.Errorf("%s:%d pins %s%s, internal/version/VERSION says %s", f, i+1, m[1], m[2], version.Version)
				}
			}
		}
	}
	if refPins == 0 {
		t.Fatal("no ?ref= pin found in the docs: the check above has nothing to check (docs/deploy.md pins the remote base)")
	}

	git := func(args ...string) (string, error) {
		cmd := exec.Command("git", args...)
		cmd.Dir = root
		out, err := cmd.Output()
		return strings.TrimSpace(string(out)), err
	}
	tags, err := git("tag", "--list")
	if err != nil {
		t.Fatalf("git tag --list: %v", err)
	}
	if tags == "" {
		t.Logf("the repository has no tags (a clone without them): the pins are checked against internal/version/VERSION only")
		return
	}
	if !slices.Contains(strings.Fields(tags), version.Version) {
		t.Fatalf("the repository has tags %v but none is %s, which the docs pin: tag the commit of %s (git tag -a %s <commit> -m \"latch %s\")",
			strings.Fields(tags), version.Version, version.Version, version.Version, version.Version)
	}
	tagged, err := git("show", version.Version+":internal/version/VERSION")
	if err != nil {
		t.Fatalf("git show %s:internal/version/VERSION: %v", version.Version, err)
	}
	if tagged != version.Version {
		t.Errorf("the tag %s is on a commit whose internal/version/VERSION says %q", version.Version, tagged)
	}
	for _, dir := range bases {
		if _, err := git("cat-file", "-e", version.Version+":"+dir+"/kustomization.yaml"); err != nil {
			t.Errorf("the docs pin github.com/latchcsi/latch/%s?ref=%s, but the tag has no %s/kustomization.yaml", dir, version.Version, dir)
		}
	}
}
