package main

import (
	"context"
	"fmt"
	"io"
	"path"
	"strings"
	"sync"

	"github.com/latchcsi/latch/internal/buildprogress"
)

// A warm build compiles, into the Go build cache only, the packages that
// the main packages of another module (the upstream binaries latch-local
// builds when it starts: kube-controller-manager, kube-scheduler, the
// hollow kubelet) need besides their own main packages, while the build
// it accompanies links. A cold make demo otherwise left one of the two
// cores idle for that link (about 15 s for latch-local), and only then
// started the go command that compiles the upstream packages. The
// packages both builds share are compiled by then, so nothing is compiled
// twice; and the module downloads of the other module happen at the
// start, during the main compile.
type warm struct {
	label  string
	dir    string
	mains  []string
	w      io.Writer
	ctx    context.Context
	cancel context.CancelFunc
	// listed is closed once deps (or err) is set.
	listed  chan struct{}
	deps    []string
	listErr error
	once    sync.Once
	done    chan struct{}
}

// startWarm lists (and so downloads) the other module's packages at once;
// begin starts their compile.
func startWarm(ctx context.Context, label, dir string, mains []string, w io.Writer) *warm {
	ctx, cancel := context.WithCancel(ctx)
	m := &warm{label: label, dir: dir, mains: mains, w: w, ctx: ctx, cancel: cancel, listed: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(m.listed)
		m.deps, m.listErr = nonMainDeps(ctx, dir, mains)
	}()
	return m
}

// begin starts the compile (once; Build.Linking calls it).
func (m *warm) begin() {
	m.once.Do(func() {
		go func() {
			defer close(m.done)
			<-m.listed
			if m.listErr != nil {
				fmt.Fprintf(m.w, "%s: %v (the packages are compiled when the command builds them)\n", m.label, m.listErr)
				return
			}
			names := make([]string, len(m.mains))
			for i, p := range m.mains {
				names[i] = path.Base(p)
			}
			b := buildprogress.Build{
				Label: m.label, Dir: m.dir, Packages: m.deps, Progress: m.w, Passthrough: m.w,
				What: fmt.Sprintf("compiling the %d packages %s need (from %s) while the link runs; the command links them", len(m.deps), strings.Join(names, ", "), m.dir),
			}
			if err := b.Run(m.ctx); err != nil {
				fmt.Fprintf(m.w, "%s: the command builds them again and reports what fails\n", m.label)
			}
		}()
	})
}

// wait waits for a begun compile to end, or stops the listing if the
// compile never began (the main build failed). The command must not start
// before: its go build of the same packages would compile them a second
// time beside this one.
func (m *warm) wait() {
	m.once.Do(func() { close(m.done) })
	<-m.done
	m.cancel()
}

// nonMainDeps are the packages with Go files that mains import, in the
// module at dir, without main packages (go build compiles them into the
// build cache and links nothing).
func nonMainDeps(ctx context.Context, dir string, mains []string) ([]string, error) {
	args := append([]string{"-C", dir, "-deps", "-f", `{{if and (ne .Name "main") (or .GoFiles .CgoFiles)}}{{.ImportPath}}{{end}}`}, mains...)
	return goList(ctx, args)
}
