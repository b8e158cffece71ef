package testsupport

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

// The modules under test/upstream build their components with latch's
// dependency versions: every module latch's own build also uses is
// replaced by latch's version of it, but those keepOwnVersion keeps. The
// go command keys each compiled package by its source and the compiled
// packages it imports, so a package at the same version as in latch's
// build is compiled once and shared: kube-controller-manager,
// kube-scheduler and the hollow kubelet then compile the 491 packages
// latch-local does not link, not 2,046, and the external-attacher 8
// after latch's tests, not 976 (README, "What a cold machine compiles").
//
// keepOwnVersion lists, per module directory, the modules that stay at the
// component's own version, and why: a module path, or a prefix ending in
// "/" for every module under it. A module kept, and everything above it,
// is compiled twice. Since latch builds against Kubernetes 1.37 nothing is
// kept: Kubernetes v1.37.2's CSI volume plugin compiles with the CSI spec
// v1.13 (v1.36's used VOLUME_CONDITION, which v1.13 dropped, and kept the
// spec at v1.9), and the external-attacher v4.13.0's Kubernetes libraries
// are v0.37 like latch's (with v0.36 its --help listed v0.36's feature
// gates, not the release's, and its etcd client stayed at v3.7).
var keepOwnVersion = map[string]map[string]string{
	"kubernetes":        {},
	"external-attacher": {},
}

// UpstreamModuleDirs are the module directories under test/upstream, by
// name.
func UpstreamModuleDirs() []string {
	names := make([]string, 0, len(keepOwnVersion))
	for n := range keepOwnVersion {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// keptReason is why keep keeps the module path at its own version, if it
// does.
func keptReason(keep map[string]string, path string) (string, bool) {
	if reason, ok := keep[path]; ok {
		return reason, true
	}
	for k, reason := range keep {
		if strings.HasSuffix(k, "/") && strings.HasPrefix(path, k) {
			return reason, true
		}
	}
	return "", false
}

// A VersionDrift is a module an upstream module builds at another version
// than latch does.
type VersionDrift struct {
	Module        string // the upstream module's directory name under test/upstream
	Path          string // the dependency's module path
	Theirs, Latch string
	// KeepOwn is set when keepOwnVersion lists it, for Reason.
	KeepOwn bool
	Reason  string
}

func (d VersionDrift) String() string {
	return fmt.Sprintf("test/upstream/%s builds %s %s, latch %s", d.Module, d.Path, d.Theirs, d.Latch)
}

// UpstreamVersionDrift lists the modules the upstream module name (a
// directory under test/upstream) builds at another version than latch's
// own module, those keepOwnVersion lists included (KeepOwn set).
func UpstreamVersionDrift(name string) ([]VersionDrift, error) {
	keep, ok := keepOwnVersion[name]
	if !ok {
		return nil, fmt.Errorf("no upstream module %q (known: %s)", name, strings.Join(UpstreamModuleDirs(), ", "))
	}
	root, err := moduleRoot()
	if err != nil {
		return nil, err
	}
	return versionDrift(name, root, filepath.Join(upstreamRoot(), name), keep)
}

// versionDrift compares the build lists of the modules in latchDir and
// theirDir (the upstream module name).
func versionDrift(name, latchDir, theirDir string, keep map[string]string) ([]VersionDrift, error) {
	latch, err := buildList(latchDir)
	if err != nil {
		return nil, err
	}
	theirs, err := buildList(theirDir)
	if err != nil {
		return nil, err
	}
	var drift []VersionDrift
	for _, path := range sortedKeys(theirs) {
		lv, ok := latch[path]
		if !ok || lv == theirs[path] {
			continue
		}
		d := VersionDrift{Module: name, Path: path, Theirs: theirs[path], Latch: lv}
		if reason, ok := keptReason(keep, path); ok {
			d.KeepOwn, d.Reason = true, reason
		}
		drift = append(drift, d)
	}
	return drift, nil
}

// AlignUpstreamModule replaces, in the upstream module name, every
// dependency latch also uses by latch's version of it (but those
// keepOwnVersion lists), then tidies it; again until nothing drifts (a
// replaced version can bring modules of its own). log receives each go
// command run.
func AlignUpstreamModule(name string, log io.Writer) error {
	dir := filepath.Join(upstreamRoot(), name)
	for range 5 {
		drift, err := UpstreamVersionDrift(name)
		if err != nil {
			return err
		}
		args := []string{"mod", "edit"}
		for _, d := range drift {
			if !d.KeepOwn {
				args = append(args, "-replace="+d.Path+"="+d.Path+"@"+d.Latch)
			}
		}
		if len(args) == 2 {
			return nil
		}
		for _, a := range [][]string{args, {"mod", "tidy"}} {
			fmt.Fprintf(log, "test/upstream/%s: go %s\n", name, shorten(a))
			cmd := exec.Command("go", a...)
			cmd.Dir = dir
			if out, err := cmd.CombinedOutput(); err != nil {
				return fmt.Errorf("go %s (in test/upstream/%s): %v\n%s", shorten(a), name, err, out)
			}
		}
	}
	return fmt.Errorf("test/upstream/%s: versions still drift from latch's after five rounds of replace and tidy", name)
}

// buildList is the module path -> version (the replacement's, where
// replaced) of every module in the build list of the module in dir.
func buildList(dir string) (map[string]string, error) {
	cmd := exec.Command("go", "list", "-m", "-json", "all")
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list -m -json all (in %s): %v\n%s", dir, err, stderr.String())
	}
	type module struct {
		Path, Version string
		Main          bool
		Replace       *module
	}
	mods := map[string]string{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var m module
		if err := dec.Decode(&m); errors.Is(err, io.EOF) {
			return mods, nil
		} else if err != nil {
			return nil, fmt.Errorf("go list -m -json all (in %s): %w", dir, err)
		}
		if m.Main {
			continue
		}
		v := m.Version
		if m.Replace != nil && m.Replace.Version != "" {
			v = m.Replace.Version
		}
		mods[m.Path] = v
	}
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// shorten is a go command line for a message: the first arguments, then
// how many more.
func shorten(args []string) string {
	if len(args) <= 6 {
		return strings.Join(args, " ")
	}
	return fmt.Sprintf("%s ... (%d more)", strings.Join(args[:6], " "), len(args)-6)
}
