package testsupport

import (
	"os"
	"testing"
)

func TestBinaryBuildsOncePerProcess(t *testing.T) {
	defer RemoveBinaries()
	p1, err := Binary("cmd/csi-mock-driver")
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(p1)
	if err != nil || st.Mode()&0o111 == 0 {
		t.Fatalf("built binary %s: %v %v", p1, st, err)
	}
	p2, err := Binary("cmd/csi-mock-driver")
	if err != nil || p2 != p1 {
		t.Errorf("second Binary = %s %v, want the same %s", p2, err, p1)
	}
	if _, err := Binary("cmd/no-such-command"); err == nil {
		t.Error("building a missing package succeeded")
	}
}

type fatalRecorder struct{ msg string }

func (f *fatalRecorder) Helper()                        {}
func (f *fatalRecorder) Fatalf(format string, _ ...any) { f.msg = format }
