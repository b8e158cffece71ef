// Package version carries the build's version, set with
// -ldflags "-X github.com/latchcsi/latch/internal/version.Version=v1.2.3".
package version

// Version is the release version; "devel" for builds from a work tree.
var Version = "devel"
