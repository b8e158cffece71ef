// Command buildprogress shows progress while the Makefile's demo, up and
// test targets compile, so a first run on an empty Go build cache (tens of
// minutes on two cores) is never silent for more than about ten seconds.
// It imports only the standard library and internal/buildprogress, so it
// compiles in seconds even on a cold cache.
//
//	buildprogress build [-label L] [-tags T] [-o FILE] PKG... [-- CMD ARG...]
//	    go build -v the packages with "[n/N packages] compiling <pkg>, <elapsed>"
//	    lines, then, if given, replace itself with CMD (e.g. the built binary).
//	    -warm-dir D -warm "P..." compiles what the main packages P of the
//	    module in D import, while the build links (warm.go).
//	buildprogress test [-label L] [-pkgs P] -- CMD ARG...
//	    compile every non-test package the tests of P (default ./...) import
//	    with progress (go build -v: no test binary is linked), then run CMD
//	    (a go test command line), its standard output passed through line by
//	    line and a heartbeat on standard error while it prints nothing.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"

	"github.com/latchcsi/latch/internal/buildprogress"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || (args[0] != "build" && args[0] != "test") {
		fmt.Fprintln(stderr, "usage: buildprogress build|test [flags] ... [-- command ...]")
		return 2
	}
	mode := args[0]
	fs := flag.NewFlagSet("buildprogress "+mode, flag.ContinueOnError)
	fs.SetOutput(stderr)
	label := fs.String("label", "build", "Starts every progress line.")
	tags := fs.String("tags", "", "go build -tags.")
	output := fs.String("o", "", "go build -o (build only).")
	pkgs := fs.String("pkgs", "./...", "Packages whose tests run (test only; space-separated).")
	warmDir := fs.String("warm-dir", "", "The module directory of -warm's packages (build only).")
	warmPkgs := fs.String("warm", "", "Main packages (space-separated) of the module in -warm-dir that the command builds when it starts: what they import is compiled into the Go build cache while the build links, and the command runs once that is done (build only).")
	own, then := splitCommand(args[1:])
	if err := fs.Parse(own); err != nil {
		return 2
	}
	var flags []string
	if *tags != "" {
		flags = []string{"-tags", *tags}
	}
	// Ctrl-C reaches the whole process group: the go command stops by
	// itself, and so does the command run after it; this program waits for
	// them. (Caught, not ignored: an ignored signal would stay ignored in
	// the children.) SIGTERM sent to this program alone is passed on as an
	// interrupt (buildprogress.Build, RunTest).
	interrupts := make(chan os.Signal, 1)
	signal.Notify(interrupts, os.Interrupt)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()

	switch mode {
	case "build":
		if fs.NArg() == 0 {
			fmt.Fprintln(stderr, "buildprogress build: no package to build")
			return 2
		}
		var w *warm
		if *warmPkgs != "" {
			// Listed first: its module downloads overlap this build's.
			w = startWarm(ctx, *label+" (upstream)", *warmDir, strings.Fields(*warmPkgs), stderr)
		}
		b := buildprogress.Build{Label: *label, Flags: flags, Output: *output, Packages: fs.Args(), Mains: mains(ctx, flags, fs.Args()), Progress: stderr, Passthrough: stderr}
		if w != nil {
			b.Linking = w.begin
		}
		err := b.Run(ctx)
		if w != nil {
			w.wait()
		}
		if err != nil {
			return 1
		}
		if len(then) == 0 {
			return 0
		}
		path, err := exec.LookPath(then[0])
		if err == nil {
			err = replaceWith(path, then, os.Environ())
		}
		fmt.Fprintf(stderr, "%s: run %s: %v\n", *label, strings.Join(then, " "), err)
		return 1
	default:
		if len(then) == 0 {
			fmt.Fprintln(stderr, "buildprogress test: no command after --")
			return 2
		}
		// A package that does not compile must not hide the others' test
		// results: go test runs anyway and reports it as it always did.
		patterns := strings.Fields(*pkgs)
		deps, err := testDeps(ctx, flags, patterns)
		if err != nil {
			fmt.Fprintf(stderr, "%s: %v\n%s: go test runs without the compile step\n", *label, err, *label)
		} else {
			b := buildprogress.Build{Label: *label, What: fmt.Sprintf("compiling the %d packages the tests of %s import (no test binary linked yet)", len(deps), *pkgs), Flags: flags, Packages: deps, Progress: stderr, Passthrough: stderr}
			if err := b.Run(ctx); err != nil {
				fmt.Fprintf(stderr, "%s: some packages did not compile (above); go test runs anyway and reports them\n", *label)
			}
		}
		fmt.Fprintf(stderr, "%s: %s\n", *label, strings.Join(then, " "))
		if err := buildprogress.RunTest(ctx, *label, then, patterns, stdout, stderr); err != nil {
			var exit *exec.ExitError
			if errors.As(err, &exit) && exit.ExitCode() > 0 {
				return exit.ExitCode()
			}
			fmt.Fprintf(stderr, "%s: %v\n", *label, err)
			return 1
		}
		return 0
	}
}

// replaceWith replaces this program with the command (tests record it
// instead).
var replaceWith = syscall.Exec

// splitCommand splits args at the first "--".
func splitCommand(args []string) (own, then []string) {
	for i, a := range args {
		if a == "--" {
			return args[:i], args[i+1:]
		}
	}
	return args, nil
}
