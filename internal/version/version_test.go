package version

import (
	"regexp"
	"testing"
)

func TestVersionIsASemverTag(t *testing.T) {
	if !regexp.MustCompile(`^v\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?$`).MatchString(Version) {
		t.Fatalf("Version = %q, want a tag like v1.2.3 (the file VERSION)", Version)
	}
}
