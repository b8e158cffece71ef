// Command compilecount counts what a cold machine compiles for make demo and
// make test, step by step: the packages each step links, and how many of
// them no earlier step compiled. It runs go list only (no build), so the
// counts are the same on every machine for a given checkout.
//
// The Go build cache keys a compiled package by its source and the
// compiled packages it imports, so here a package is keyed by its source
// directory (a module cache directory names the module version) and the
// keys of its imports: two steps share a package exactly when they build
// the same source against the same dependencies.
//
//	go run ./hack/compilecount
package main

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// A step is one go build (or go test) of a cold run.
type step struct {
	name string
	dir  string // where the go command runs, from the repository root
	args []string
}

var steps = []step{
	{"make demo: bin/latch-local", ".", []string{"./cmd/latch-local"}},
	{"make demo: kube-controller-manager, kube-scheduler, hollow kubelet", "test/upstream/kubernetes", []string{
		"k8s.io/kubernetes/cmd/kube-controller-manager", "k8s.io/kubernetes/cmd/kube-scheduler", "./hollowkubelet"}},
	{"make test: the tests' packages, test variants and test mains", ".", []string{"-test", "./..."}},
	{"make test: external-attacher (test/interop)", "test/upstream/external-attacher", []string{
		"github.com/kubernetes-csi/external-attacher/v4/cmd/csi-attacher"}},
}

func main() {
	seen := map[string]bool{}
	total := 0
	for _, s := range steps {
		pkgs, err := keys(s.dir, s.args)
		if err != nil {
			fmt.Fprintln(os.Stderr, "compilecount:", err)
			os.Exit(1)
		}
		var fresh, variants, mains int
		for _, p := range pkgs {
			if seen[p.key] {
				continue
			}
			seen[p.key] = true
			switch {
			case strings.HasSuffix(p.path, ".test]"):
				variants++
			case strings.HasSuffix(p.path, ".test"):
				mains++
			default:
				fresh++
			}
		}
		total += fresh + variants + mains
		extra := ""
		if variants+mains > 0 {
			extra = fmt.Sprintf(", then %d test variants and %d test mains", variants, mains)
		}
		fmt.Printf("%s: links %d packages, compiles %d%s\n", s.name, len(pkgs)-countTests(pkgs), fresh, extra)
	}
	fmt.Printf("all: %d packages compiled\n", total)
}

type pkg struct{ path, key string }

func countTests(pkgs []pkg) int {
	n := 0
	for _, p := range pkgs {
		if strings.HasSuffix(p.path, ".test]") || strings.HasSuffix(p.path, ".test") {
			n++
		}
	}
	return n
}

// keys lists the packages go list -deps finds for args in dir, each with
// its key, in go list's order.
func keys(dir string, args []string) ([]pkg, error) {
	format := `{{.ImportPath}}|{{if .Module}}{{.Dir}}{{else}}std{{end}}|{{join .Imports ","}}`
	cmd := exec.Command("go", append([]string{"list", "-deps", "-f", format}, args...)...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list -deps %s (in %s): %v\n%s", strings.Join(args, " "), dir, err, stderr.String())
	}
	type listed struct {
		where   string
		imports []string
	}
	all := map[string]listed{}
	var order []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		f := strings.SplitN(sc.Text(), "|", 3)
		if len(f) != 3 || f[0] == "unsafe" || f[0] == "C" {
			continue
		}
		if _, ok := all[f[0]]; ok {
			continue
		}
		var imports []string
		if f[2] != "" {
			imports = strings.Split(f[2], ",")
		}
		all[f[0]] = listed{f[1], imports}
		order = append(order, f[0])
	}
	memo := map[string]string{}
	var key func(string) string
	key = func(path string) string {
		if k, ok := memo[path]; ok {
			return k
		}
		l := all[path]
		h := sha256.New()
		fmt.Fprintf(h, "%s %s\n", path, l.where)
		for _, i := range l.imports {
			if i != "unsafe" && i != "C" {
				fmt.Fprintln(h, key(i))
			}
		}
		k := hex.EncodeToString(h.Sum(nil))
		memo[path] = k
		return k
	}
	pkgs := make([]pkg, len(order))
	for i, p := range order {
		pkgs[i] = pkg{p, key(p)}
	}
	return pkgs, nil
}
