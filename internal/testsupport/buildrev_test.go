package testsupport

import (
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
