// Command upstreammods builds the upstream components under test/upstream
// with latch's dependency versions: in each module there, every dependency
// latch's own module also uses is replaced by latch's version of it (but
// those internal/testsupport's keepOwnVersion keeps, each with its
// reason; none since latch builds against Kubernetes 1.37), and the
// module is tidied. Run it after changing a dependency
// version in latch's go.mod (make upstream-mods); the test
// TestUpstreamModulesBuildWithLatchsVersions in internal/testsupport says
// when it is needed. A package at latch's version is compiled once for
// latch-local and the upstream binaries alike.
//
//	go run ./hack/upstreammods [module...]   (default: every module under test/upstream)
package main

import (
	"fmt"
	"os"

	"github.com/latchcsi/latch/internal/testsupport"
)

func main() {
	names := os.Args[1:]
	if len(names) == 0 {
		names = testsupport.UpstreamModuleDirs()
	}
	failed := false
	for _, name := range names {
		if err := testsupport.AlignUpstreamModule(name, os.Stderr); err != nil {
			fmt.Fprintln(os.Stderr, "upstreammods:", err)
			failed = true
			continue
		}
		drift, err := testsupport.UpstreamVersionDrift(name)
		if err != nil {
			fmt.Fprintln(os.Stderr, "upstreammods:", err)
			failed = true
			continue
		}
		for _, d := range drift {
			fmt.Printf("%s (kept: %s)\n", d, d.Reason)
		}
		fmt.Printf("test/upstream/%s: every other dependency at latch's version\n", name)
	}
	if failed {
		os.Exit(1)
	}
}
