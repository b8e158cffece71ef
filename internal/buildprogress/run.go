package buildprogress

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"
)

// Build describes one go build whose progress is shown.
type Build struct {
	// Label starts every progress line.
	Label string
	// Dir is where the go command runs ("" = the current directory).
	Dir string
	// Flags go to both go list and go build (e.g. "-tags", "grpcnotrace").
	Flags []string
	// Output is go build's -o ("" = none: the packages are compiled and
	// the results kept in the Go build cache only).
	Output string
	// Packages to build (import paths or patterns).
	Packages []string
	// What the first line says is built ("" = the go build command line).
	What string
	// Mains are the main packages among them, by import path (see
	// Progress.Mains).
	Mains []string
	// Progress receives the progress lines; Passthrough everything else go
	// build printed (errors, module downloads).
	Progress, Passthrough io.Writer
	// Every and Heartbeat: see Progress.
	Every, Heartbeat time.Duration
	// Linking, if set, is called once when go build has reported every
	// package of Mains: every other package is compiled, and only their
	// links remain (go build -v prints nothing while linking). A caller
	// can use the link's time, in which the go command leaves cores idle,
	// for another build's compiles.
	Linking func()
}

// Run runs go build -v with the packages and prints progress until it
// ends. The package total comes from go list -deps, run at the same time
// (the count shows alone until it answers). The error names the command.
func (b Build) Run(ctx context.Context) error {
	p := &Progress{Label: b.Label, Every: b.Every, Heartbeat: b.Heartbeat, Mains: b.Mains}
	what := b.What
	if what == "" {
		what = "go build " + strings.Join(b.Packages, " ")
	}
	fmt.Fprintln(b.Progress, p.Start(time.Now(), what))

	totals := make(chan int, 1)
	listCtx, cancelList := context.WithCancel(ctx)
	defer cancelList()
	go func() { totals <- countDeps(listCtx, b.Dir, b.Flags, b.Packages) }()

	args := append([]string{"build", "-v"}, b.Flags...)
	if b.Output != "" {
		args = append(args, "-o", b.Output)
	}
	args = append(args, b.Packages...)
	mainsLeft := map[string]bool{}
	for _, m := range b.Mains {
		mainsLeft[m] = true
	}
	err := watchLines(ctx, b.Dir, args, nil, func(line string) {
		if IsPackageLine(line) {
			if mainsLeft[line] {
				delete(mainsLeft, line)
				if len(mainsLeft) == 0 && b.Linking != nil {
					b.Linking()
				}
			}
			if l, ok := p.Package(time.Now(), line); ok {
				fmt.Fprintln(b.Progress, l)
			}
			return
		}
		fmt.Fprintln(b.Passthrough, line)
	}, func() {
		select {
		case n := <-totals:
			p.SetTotal(n)
		default:
		}
		if l, ok := p.Tick(time.Now()); ok {
			fmt.Fprintln(b.Progress, l)
		}
	})
	if err != nil {
		err = fmt.Errorf("go %s (in %q): %w", shorten(args), b.Dir, err)
	}
	fmt.Fprintln(b.Progress, p.Done(time.Now(), err))
	return err
}

// countDeps is the number of packages go list -deps finds for pkgs (0 if
// it fails: the progress lines then show the count alone).
func countDeps(ctx context.Context, dir string, flags, pkgs []string) int {
	args := append(append([]string{"list", "-deps"}, flags...), pkgs...)
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		return 0
	}
	return strings.Count(string(out), "\n")
}

// watchLines runs go with args, hands each line of its stderr (without
// its newline) to line (stdout goes to stdout, or is discarded if nil),
// and calls tick about once a second until the command ends.
func watchLines(ctx context.Context, dir string, args []string, stdout io.Writer, line func(string), tick func()) error {
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = dir
	cmd.Env = BuildEnv(os.Environ())
	cmd.Stdout = stdout
	interruptOnCancel(cmd)
	pipe, err := cmd.StderrPipe()
	if err != nil {
		return err
	}
	return follow(cmd, pipe, func(l string) { line(strings.TrimSuffix(l, "\n")) }, tick)
}

// follow starts cmd, hands each line read from pipe (one of cmd's output
// pipes, with its newline if it had one) to line, calls tick about once a
// second, and returns cmd's exit error once pipe is drained.
func follow(cmd *exec.Cmd, pipe io.Reader, line func(string), tick func()) error {
	if err := cmd.Start(); err != nil {
		return err
	}
	lines := make(chan string)
	go func() {
		defer close(lines)
		rd := bufio.NewReader(pipe)
		for {
			l, err := rd.ReadString('\n')
			if l != "" {
				lines <- l
			}
			if err != nil {
				return
			}
		}
	}()
	ticker := time.NewTicker(time.Second)
	defer ticker.Stop()
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				return cmd.Wait()
			}
			line(l)
		case <-ticker.C:
			tick()
		}
	}
}

// shorten is a command line for an error message: at most 8 arguments,
// then how many more (a test build passes thousands of packages).
func shorten(args []string) string {
	if len(args) <= 8 {
		return strings.Join(args, " ")
	}
	return fmt.Sprintf("%s ... (%d more)", strings.Join(args[:8], " "), len(args)-8)
}

// interruptOnCancel makes a cancelled context interrupt the command, as
// Ctrl-C would (go test passes it on to the test binary, which ends its
// tests), and kill it only if it has not ended 30 s later.
func interruptOnCancel(cmd *exec.Cmd) {
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 30 * time.Second
}

// The garbage collector settings BuildEnv gives the go command's compiles
// and links. A cold make demo is bound by the CPU of about 2,650
// compiles, and the compiler's collector is a part of it: five
// interleaved cold builds of k8s.io/client-go/kubernetes (576 packages,
// empty GOCACHE) on the 2-core machine took 112-129 s of user CPU and
// 71-82 s with GOGC=400, against 129-137 s and 80-83 s at Go's default
// (a sixth, the first of all at the default, took 176 s and 110 s with
// the disk cache cold). GOMEMLIMIT
// bounds what the larger heap costs: a compile collects as often as it
// must to stay near 2 GiB (its largest heap in those builds was 0.67 GB;
// at the default 0.48 GB). Neither setting is part of the Go build
// cache's keys: packages compiled with them are the ones go test and go
// build find later.
const (
	buildGOGC       = "400"
	buildGOMEMLIMIT = "2GiB"
)

// BuildEnv is env for a go build whose compiles and links are to collect
// less often (buildGOGC, buildGOMEMLIMIT), unless env sets GOGC or
// GOMEMLIMIT itself. Only the builds get it: the programs that run after
// them (latch-local, the tests) keep the environment they were given.
func BuildEnv(env []string) []string {
	set := func(name string) bool {
		for _, kv := range env {
			if strings.HasPrefix(kv, name+"=") {
				return true
			}
		}
		return false
	}
	out := slices.Clone(env)
	if !set("GOGC") {
		out = append(out, "GOGC="+buildGOGC)
	}
	if !set("GOMEMLIMIT") {
		out = append(out, "GOMEMLIMIT="+buildGOMEMLIMIT)
	}
	return out
}
