// Package gomodule writes tiny Go modules for tests of code that runs the
// go command (builds, go test, go list). It imports only the standard
// library, so a test of a program that must build fast on a cold cache
// can use it.
package gomodule

import (
	"os"
	"path/filepath"
	"testing"
)

// Write writes a module with the given path (go 1.26) and files (slash
// paths relative to the module's root, to their text) into a new
// temporary directory of t, and returns that directory.
func Write(t testing.TB, path string, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	write := func(name, text string) {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module "+path+"\n\ngo 1.26\n")
	for name, text := range files {
		write(name, text)
	}
	return dir
}
