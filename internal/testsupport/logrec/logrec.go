// Package logrec records what a logr.Logger writes, one line per call,
// for tests that assert log lines (funcr's key="value" format).
package logrec

import (
	"sync"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
)

// Recorder holds the lines its Logger wrote; safe for concurrent use.
type Recorder struct {
	mu    sync.Mutex
	lines []string
}

// New returns a Logger that writes every line up to verbosity into the
// Recorder.
func New(verbosity int) (logr.Logger, *Recorder) {
	r := &Recorder{}
	return funcr.New(func(_, args string) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.lines = append(r.lines, args)
	}, funcr.Options{Verbosity: verbosity}), r
}

// Lines returns a copy of the lines written so far.
func (r *Recorder) Lines() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.lines...)
}
