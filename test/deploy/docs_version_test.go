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

// The commands docs/deploy.md shows for building and pushing images are
// the Makefile's and build/Dockerfile's: each make target and variable
// exists, each docker build names a build arg and a target the Dockerfile
// has, and the push commands read the layout where make image writes it.
func TestDeployDocsImageCommandsMatchTheMakefileAndDockerfile(t *testing.T) {
	root := repoRoot(t)
	raw, err := os.ReadFile(filepath.Join(root, "docs", "deploy.md"))
	if err != nil {
		t.Fatal(err)
	}
	checkImageCommands(t, root, raw)
}

// checkImageCommands checks the commands in the code blocks of doc.
func checkImageCommands(t *testing.T, root string, doc []byte) {
	t.Helper()
	makefile, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	global, stages := parseDockerfile(t, filepath.Join(root, "build", "Dockerfile"))
	buildArgs := map[string]bool{}
	for _, in := range append(slices.Clone(global), stages[0].instr...) {
		if in.keyword == "ARG" {
			name, _, _ := strings.Cut(in.args, "=")
			buildArgs[name] = true
		}
	}
	targets := map[string]bool{}
	for _, st := range stages {
		targets[st.name] = true
	}
	imageDir := strings.ReplaceAll(makefileVar(t, root, "IMAGE_DIR"), "$(BIN_DIR)", makefileVar(t, root, "BIN_DIR"))

	var commands []string // code block lines, continuation lines joined
	inBlock := false
	var cur strings.Builder
	for _, line := range strings.Split(string(doc), "\n") {
		if strings.HasPrefix(line, "```") {
			inBlock = !inBlock
			continue
		}
		if !inBlock {
			continue
		}
		if code, _, _ := strings.Cut(line, " #"); strings.HasSuffix(strings.TrimSpace(code), `\`) {
			cur.WriteString(strings.TrimSuffix(strings.TrimSpace(code), `\`) + " ")
			continue
		}
		cur.WriteString(line)
		commands = append(commands, strings.TrimSpace(cur.String()))
		cur.Reset()
	}
	seen := map[string]int{}
	for _, c := range commands {
		c, _, _ = strings.Cut(c, " #")
		f := strings.Fields(c)
		if len(f) < 2 {
			continue
		}
		switch {
		case f[0] == "make":
			seen["make"]++
			if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(f[1]) + `:`).Match(makefile) {
				t.Errorf("docs/deploy.md: %q: the Makefile has no target %s", c, f[1])
			}
			for _, a := range f[2:] {
				if name, _, ok := strings.Cut(a, "="); ok && !regexp.MustCompile(`(?m)^`+regexp.QuoteMeta(name)+` [?:]?=`).Match(makefile) {
					t.Errorf("docs/deploy.md: %q: the Makefile has no variable %s", c, name)
				}
			}
		case f[0] == "docker" && f[1] == "build":
			seen["docker build"]++
			for i, a := range f {
				if i+1 >= len(f) {
					break
				}
				switch a {
				case "--build-arg":
					if name, _, _ := strings.Cut(f[i+1], "="); !buildArgs[name] {
						t.Errorf("docs/deploy.md: %q: build/Dockerfile's build stage has no ARG %s", c, name)
					}
				case "--target":
					if !targets[f[i+1]] {
						t.Errorf("docs/deploy.md: %q: build/Dockerfile has no stage %s", c, f[i+1])
					}
				case "-f":
					if f[i+1] != "build/Dockerfile" {
						t.Errorf("docs/deploy.md: %q: the Dockerfile is build/Dockerfile", c)
					}
				}
			}
		case f[0] == "crane" && f[1] == "push":
			seen["crane push"]++
			if len(f) != 4 || !strings.HasPrefix(f[2], imageDir+"/") {
				t.Errorf("docs/deploy.md: %q: want crane push %s/<binary> <image>", c, imageDir)
			}
		case f[0] == "skopeo" && f[1] == "copy":
			seen["skopeo copy"]++
			if !slices.ContainsFunc(f, func(a string) bool { return strings.HasPrefix(a, "oci:"+imageDir+"/") }) {
				t.Errorf("docs/deploy.md: %q: want the source oci:%s/<binary>:<tag>", c, imageDir)
			}
		}
	}
	for _, want := range []string{"make", "docker build", "crane push", "skopeo copy"} {
		if seen[want] == 0 {
			t.Errorf("docs/deploy.md shows no %s command", want)
		}
	}
}
