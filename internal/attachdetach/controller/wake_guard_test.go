package controller

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// TestOnlyWakeEnqueues keeps the queue graph in one file: every Enqueue
// call of the controller's production code is in wake.go.
func TestOnlyWakeEnqueues(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, name := range files {
		if name == "wake.go" || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if sel, ok := n.(*ast.SelectorExpr); ok && (sel.Sel.Name == "Enqueue" || sel.Sel.Name == "EnqueueLater") {
				t.Errorf("%s: Enqueue outside wake.go; add a named wake method instead", fset.Position(sel.Pos()))
			}
			return true
		})
	}
}
