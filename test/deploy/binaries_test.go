package deploy_test

import (
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/latchcsi/latch/internal/testsupport"
)

// releasedBinaries are the binaries that ship as images and appear in the
// manifests. latch-local is a development tool and has no image.
var releasedBinaries = []string{"attachdetach-controller", "csi-attacher", "csi-mock-driver", "latchctl"}

var built struct {
	once sync.Once
	dir  string
	err  error
}

// binaries returns a directory holding the released binaries (links to
// them), built once per test process. They are the builds every test
// package shares (testsupport.Binary: kept between runs, so the
// end-to-end packages' csi-attacher and attachdetach-controller are
// these): flags, --version, metrics and shutdown do not depend on how the
// binary was linked. How the images build them (CGO_ENABLED=0, -trimpath,
// -tags grpcnotrace) is TestMakeImageBuildsReproducibleMultiPlatformImagesWithSBOMs's;
// a CGO_ENABLED=0 build here compiled about 490 packages a second time on a
// cold cache (net and everything above it).
func binaries(t *testing.T) string {
	t.Helper()
	built.once.Do(func() {
		built.dir, built.err = os.MkdirTemp("", "latch-bin")
		if built.err != nil {
			return
		}
		for _, b := range releasedBinaries {
			var bin string
			if bin, built.err = testsupport.Binary("cmd/" + b); built.err != nil {
				return
			}
			if built.err = os.Symlink(bin, filepath.Join(built.dir, b)); built.err != nil {
				return
			}
		}
	})
	if built.err != nil {
		t.Fatalf("the released binaries: %v", built.err)
	}
	return built.dir
}

func removeBinaries() {
	if built.dir != "" {
		os.RemoveAll(built.dir)
	}
}
