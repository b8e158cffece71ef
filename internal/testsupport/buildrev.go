package testsupport

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
)

// RevisionCommands are the commands BinaryAt builds as of a git revision:
// the two binaries an upgrade or rollback replaces.
var RevisionCommands = []string{"cmd/csi-attacher", "cmd/attachdetach-controller"}

// revisionStamp is written beside a revision's binaries once both are
// built; it holds the Go version and the build settings that built them
// (revisionBuildInfo).
const revisionStamp = "built-with"

// A revision is built as the images build a release (build/Dockerfile, the
// Makefile's BUILD_TAGS, bench.BuildComponents): static, with gRPC's
// grpcnotrace tag. Built otherwise, an older latch carries gRPC's trace
// pages and the code they keep (15 MB more peak RSS in bench-peers) and would look
// bigger than the release it stands for beside this checkout's bench
// build.
var (
	revisionBuildFlags = []string{"-tags", "grpcnotrace"}
	revisionBuildEnv   = []string{"CGO_ENABLED=0"}
)

// revisionBuildInfo is what revisionStamp holds: a build by another Go
// version or with other settings is redone.
func revisionBuildInfo() string {
	return strings.Join(append(append([]string{runtime.Version()}, revisionBuildFlags...), revisionBuildEnv...), " ")
}

// revisionBuildCommand is the go build of RevisionCommands in the exported
// tree src into dir.
func revisionBuildCommand(src, dir string) *exec.Cmd {
	args := append([]string{"build"}, revisionBuildFlags...)
	args = append(args, "-o", dir+string(filepath.Separator))
	for _, c := range RevisionCommands {
		args = append(args, "./"+c)
	}
	cmd := exec.Command("go", args...)
	cmd.Dir = src
	// The revision's go.mod and go.sum as they were; -mod=mod lets go add
	// a go.sum line the tree lacked instead of failing. No VCS stamp: the
	// exported tree has no .git.
	cmd.Env = append(append(os.Environ(), "GOFLAGS=-mod=mod -buildvcs=false"), revisionBuildEnv...)
	return cmd
}

// BinaryAt returns latch's command pkg (one of RevisionCommands) built as
// of the git revision rev of this checkout (anything git rev-parse takes:
// a hash, a tag, HEAD~3): the revision's tree is exported with git
// archive into a temporary directory and built there with its own go.mod
// (GOFLAGS=-mod=mod; the same build and module caches, so most packages
// are cached), both commands at once. They are kept under BinaryDirEnv by
// the revision's full hash, so later processes reuse them: a revision's
// tree never changes (a build by another Go version, or with other build
// settings, is redone). They are built as a release is: static, with the
// grpcnotrace tag (revisionBuildFlags).
func BinaryAt(rev, pkg string) (string, error) {
	pkg = strings.TrimPrefix(pkg, "./")
	if !slices.Contains(RevisionCommands, pkg) {
		return "", fmt.Errorf("build %s at revision %s: only %s are built by revision", pkg, rev, strings.Join(RevisionCommands, ", "))
	}
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	commit, err := resolveRevision(root, rev)
	if err != nil {
		return "", err
	}
	b, err := keptBuild("revision "+commit, func(binDir string) (string, error) { return filepath.Join(binDir, "rev-"+commit), nil })
	if err != nil {
		return "", fmt.Errorf("build latch at revision %s: %w", rev, err)
	}
	b.once.Do(func() {
		b.err = buildRevision(root, rev, commit, b.out)
		if b.err == nil {
			b.path = b.out
		}
	})
	if b.err != nil {
		return "", b.err
	}
	return filepath.Join(b.path, path.Base(pkg)), nil
}

// MustBinaryAt is BinaryAt that fails the test.
func MustBinaryAt(t TB, rev, pkg string) string {
	t.Helper()
	p, err := BinaryAt(rev, pkg)
	if err != nil {
		t.Fatalf("%v", err)
	}
	return p
}

// ResolveRevision is the full commit hash of rev in this checkout, or an
// error naming rev and what to do (a shallow clone lacks the history).
func ResolveRevision(rev string) (string, error) {
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	return resolveRevision(root, rev)
}

func resolveRevision(root, rev string) (string, error) {
	if rev == "" || strings.HasPrefix(rev, "-") {
		return "", fmt.Errorf("git revision %q: not a revision", rev)
	}
	out, err := exec.Command("git", "-C", root, "rev-parse", "--verify", "--quiet", rev+"^{commit}").Output()
	if err == nil {
		return strings.TrimSpace(string(out)), nil
	}
	var exit *exec.ExitError
	if !errors.As(err, &exit) {
		return "", fmt.Errorf("git revision %s: run git in %s: %w", rev, root, err)
	}
	shallow, _ := exec.Command("git", "-C", root, "rev-parse", "--is-shallow-repository").Output()
	return "", revisionNotFound(rev, root, strings.TrimSpace(string(shallow)) == "true")
}

// revisionNotFound is the error for a revision git does not know.
func revisionNotFound(rev, root string, shallow bool) error {
	if shallow {
		return fmt.Errorf("git revision %s not found in %s, a shallow clone: building an older latch needs the git history: git fetch --unshallow", rev, root)
	}
	return fmt.Errorf("git revision %s not found in %s: not a commit of this repository (fetch it, or check the name)", rev, root)
}

// revisionBuilt reports whether dir holds a complete build by this Go
// version with revisionBuild's settings.
func revisionBuilt(dir string) bool {
	got, err := os.ReadFile(filepath.Join(dir, revisionStamp))
	return err == nil && string(got) == revisionBuildInfo()
}

// buildRevision builds RevisionCommands of commit into dir unless a
// complete build by this Go version with these settings is there already.
func buildRevision(root, rev, commit, dir string) error {
	stamp := filepath.Join(dir, revisionStamp)
	if revisionBuilt(dir) {
		return nil
	}
	unlock, err := lockOutput(filepath.Join(dir, "build"))
	if err != nil {
		return fmt.Errorf("build latch at revision %s: %w", rev, err)
	}
	defer unlock()
	if revisionBuilt(dir) { // by another process while this one waited
		return nil
	}
	os.Remove(stamp)
	src, err := os.MkdirTemp("", "latch-rev-")
	if err != nil {
		return fmt.Errorf("build latch at revision %s: %w", rev, err)
	}
	defer os.RemoveAll(src)
	if err := exportTree(root, commit, src); err != nil {
		return fmt.Errorf("build latch at revision %s (%s): %w", rev, commit, err)
	}
	cmd := revisionBuildCommand(src, dir)
	if msg, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build latch at revision %s (%s): %s: %v\n%s", rev, commit, strings.Join(cmd.Args, " "), err, msg)
	}
	return os.WriteFile(stamp, []byte(revisionBuildInfo()), 0o644)
}

// exportTree writes commit's tree into dir: git archive | tar -x.
func exportTree(root, commit, dir string) error {
	archive := exec.Command("git", "-C", root, "archive", "--format=tar", commit)
	untar := exec.Command("tar", "-x", "-C", dir)
	pipe, err := archive.StdoutPipe()
	if err != nil {
		return err
	}
	var archiveErr, untarErr bytes.Buffer
	archive.Stderr, untar.Stderr = &archiveErr, &untarErr
	untar.Stdin = pipe
	if err := untar.Start(); err != nil {
		return fmt.Errorf("tar: %w", err)
	}
	if err := archive.Run(); err != nil {
		_ = untar.Wait()
		return fmt.Errorf("git archive %s: %v: %s", commit, err, strings.TrimSpace(archiveErr.String()))
	}
	if err := untar.Wait(); err != nil {
		return fmt.Errorf("tar -x -C %s: %v: %s", dir, err, strings.TrimSpace(untarErr.String()))
	}
	return nil
}
