package testsupport

import (
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
)

// A revision git does not know fails with an error naming it, before
// anything is built; in a shallow clone the error says to fetch the
// history.
func TestBinaryAt_unknownRevisionNamesIt(t *testing.T) {
	isolateBinaries(t)
	const rev = "0123456789abcdef0123456789abcdef01234567"
	_, err := BinaryAt(rev, "cmd/csi-attacher")
	if err == nil || !strings.Contains(err.Error(), "git revision "+rev+" not found") {
		t.Fatalf("BinaryAt(%s) = %v, want an error naming the revision", rev, err)
	}
	if _, err := BinaryAt("", "cmd/csi-attacher"); err == nil || !strings.Contains(err.Error(), `git revision ""`) {
		t.Errorf("BinaryAt(\"\") = %v, want an error naming the empty revision", err)
	}
	if _, err := BinaryAt("HEAD", "cmd/latchctl"); err == nil || !strings.Contains(err.Error(), "cmd/latchctl") {
		t.Errorf("BinaryAt(HEAD, cmd/latchctl) = %v, want an error naming the command", err)
	}
	shallow := revisionNotFound(rev, "/src/latch", true).Error()
	for _, want := range []string{rev, "shallow", "git fetch --unshallow"} {
		if !strings.Contains(shallow, want) {
			t.Errorf("shallow-clone error %q does not say %q", shallow, want)
		}
	}
}

// A revision is built as a release is built (the Makefile's BUILD_TAGS,
// build/Dockerfile's CGO_ENABLED=0), so that bench-peers' previous release
// is measured as it ships; a build kept from before with other settings
// (or another Go version) is not reused. Before, revisions were built
// without the tag and with cgo, and bench-peers read the previous
// release's peak RSS 15-27 % above this checkout's, even for a revision
// that differed from it only in a lock.
func TestRevisionBuildIsTheReleaseBuild(t *testing.T) {
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	makefile, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^BUILD_TAGS \?= (\S+)$`).FindSubmatch(makefile)
	if m == nil {
		t.Fatal("the Makefile sets no BUILD_TAGS default")
	}
	dockerfile, err := os.ReadFile(filepath.Join(root, "build", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(dockerfile), "CGO_ENABLED=0") {
		t.Fatal("build/Dockerfile no longer builds with CGO_ENABLED=0: revisionBuildEnv follows it")
	}

	cmd := revisionBuildCommand("/src", "/out")
	args := strings.Join(cmd.Args, " ")
	if want := "go build -tags " + string(m[1]) + " -o /out/ ./cmd/csi-attacher ./cmd/attachdetach-controller"; args != want {
		t.Errorf("revision build = %q, want %q (the release's tags)", args, want)
	}
	cgo := ""
	for _, kv := range cmd.Env {
		if v, ok := strings.CutPrefix(kv, "CGO_ENABLED="); ok {
			cgo = v // the last one counts
		}
	}
	if cgo != "0" {
		t.Errorf("revision build's CGO_ENABLED = %q, want 0 (static, as the images)", cgo)
	}
	if cmd.Dir != "/src" {
		t.Errorf("revision build runs in %q, want the exported tree /src", cmd.Dir)
	}

	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, revisionStamp), []byte(runtime.Version()), 0o644); err != nil {
		t.Fatal(err)
	}
	if revisionBuilt(dir) {
		t.Error("a revision build stamped with the Go version only (before the release's settings) is reused")
	}
	if err := os.WriteFile(filepath.Join(dir, revisionStamp), []byte(revisionBuildInfo()), 0o644); err != nil {
		t.Fatal(err)
	}
	if !revisionBuilt(dir) {
		t.Error("a revision build with this Go version and these settings is not reused")
	}
}
