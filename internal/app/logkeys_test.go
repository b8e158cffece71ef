package app

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// kindKeys are the log keys named after a Kubernetes kind: their value is
// always klog.KObj or klog.KRef (an object {name, namespace} in JSON
// logs). Plain names go under other keys (nodeID, volumeHandle, volume,
// driver).
var kindKeys = []string{"node", "pod", "persistentVolume", "persistentVolumeClaim", "volumeAttachment", "csiNode", "lease", "event", "secret"}

// logKeyUse is one key/value pair given to a logger call.
type logKeyUse struct {
	key    string
	object bool // the value is klog.KObj/KRef(...)
	pos    string
}

// logKeyUses returns the literal keys of the key/value pairs passed to
// Info, Error, WithValues (and klog's InfoS/ErrorS) in the non-test Go
// files under dirs.
func logKeyUses(t *testing.T, dirs ...string) []logKeyUse {
	t.Helper()
	var uses []logKeyUse
	fset := token.NewFileSet()
	for _, dir := range dirs {
		err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			f, err := parser.ParseFile(fset, path, nil, 0)
			if err != nil {
				return err
			}
			ast.Inspect(f, func(n ast.Node) bool {
				call, sel, ok := methodCall(n)
				if !ok {
					return true
				}
				first := map[string]int{"Info": 1, "InfoS": 1, "Error": 2, "ErrorS": 2, "WithValues": 0}
				start, ok := first[sel.Sel.Name]
				if !ok || len(call.Args) <= start {
					return true
				}
				args := call.Args[start:]
				for i := 0; i+1 < len(args); i += 2 {
					lit, ok := args[i].(*ast.BasicLit)
					if !ok || lit.Kind != token.STRING {
						continue
					}
					key, _ := strconv.Unquote(lit.Value)
					uses = append(uses, logKeyUse{key: key, object: isObjectRef(args[i+1]), pos: fset.Position(lit.Pos()).String()})
				}
				return true
			})
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return uses
}

// methodCall is n as a call of a selector (x.Name(...)): the call and its
// selector; ok is false for any other node.
func methodCall(n ast.Node) (*ast.CallExpr, *ast.SelectorExpr, bool) {
	call, ok := n.(*ast.CallExpr)
	if !ok {
		return nil, nil, false
	}
	sel, ok := call.Fun.(*ast.SelectorExpr)
	return call, sel, ok
}

func isObjectRef(e ast.Expr) bool {
	_, sel, ok := methodCall(e)
	if !ok {
		return false
	}
	pkg, ok := sel.X.(*ast.Ident)
	return ok && pkg.Name == "klog" && (sel.Sel.Name == "KObj" || sel.Sel.Name == "KRef")
}

// The log call sites of both binaries give each key one kind of value: a
// key with klog.KObj/KRef in one place never has a plain value in another
// (JSON log pipelines type a field from the first value they see), and
// keys named after a kind always carry an object. The JSON logs of a real
// run are checked by test/e2e/reliability's
// TestJSONLogsOneTypePerKeyAndOneLinePerCSICall_bothBinariesAtVerbosity5;
// this covers the lines that run does not reach.
func TestLogKeys_oneKindOfValuePerKeyInBothBinaries(t *testing.T) {
	uses := logKeyUses(t, "../attacher", "../attachdetach", "../csi", "../runner", "../kube", ".",
		"../../cmd/csi-attacher", "../../cmd/attachdetach-controller")
	if len(uses) < 50 {
		t.Fatalf("found only %d key/value pairs in log calls: the scan does not see the code", len(uses))
	}
	byKey := map[string][]logKeyUse{}
	for _, u := range uses {
		byKey[u.key] = append(byKey[u.key], u)
	}
	for key, us := range byKey {
		var objects, plain []string
		for _, u := range us {
			if u.object {
				objects = append(objects, u.pos)
			} else {
				plain = append(plain, u.pos)
			}
		}
		switch {
		case slices.Contains(kindKeys, key) && len(plain) > 0:
			t.Errorf("log key %q is named after a kind but has a plain value (use klog.KObj/KRef, or a key such as %sName): %s", key, key, strings.Join(plain, ", "))
		case len(objects) > 0 && len(plain) > 0:
			t.Errorf("log key %q is an object (klog.KObj/KRef) at %s but a plain value at %s", key, strings.Join(objects, ", "), strings.Join(plain, ", "))
		}
	}
	t.Logf("checked %d key/value pairs under %d keys", len(uses), len(byKey))
}
