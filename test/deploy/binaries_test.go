package deploy_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// releasedBinaries are the binaries that ship as images and appear in the
// manifests. latch-local is a development tool and has no image.
var releasedBinaries = []string{"attachdetach-controller", "csi-attacher", "csi-mock-driver", "latchctl"}

var built struct {
	once sync.Once
	dir  string
	err  error
	out  []byte
}

// binaries builds the released binaries once per test process (as `make
// build` does) and returns the directory holding them.
func binaries(t *testing.T) string {
	t.Helper()
	built.once.Do(func() {
		built.dir, built.err = os.MkdirTemp("", "latch-bin")
		if built.err != nil {
			return
		}
		args := []string{"build", "-o", built.dir + string(filepath.Separator)}
		for _, b := range releasedBinaries {
			args = append(args, "./cmd/"+b)
		}
		cmd := exec.Command("go", args...)
		cmd.Dir = repoRoot(t)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		built.out, built.err = cmd.CombinedOutput()
	})
	if built.err != nil {
		t.Fatalf("go build: %v\n%s", built.err, built.out)
	}
	return built.dir
}

func removeBinaries() {
	if built.dir != "" {
		os.RemoveAll(built.dir)
	}
}
