// Package version carries latch's release version. The one place it is
// written is the file VERSION next to this one: the binaries embed it
// (--version, the start-up log line), and the Makefile's image tags, the
// Helm chart's version and appVersion and the image tags of deploy/ are
// the same string (test/deploy's TestOneVersionEverywhere checks them).
// CHANGELOG.md has a section for it.
package version

import (
	_ "embed"
	"strings"
)

//go:embed VERSION
var file string

// Version is the release version, e.g. "v0.1.0".
var Version = strings.TrimSpace(file)
