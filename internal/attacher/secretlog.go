package attacher

import (
	"context"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
)

// apiDumpVerbosity is the first verbosity at which client-go logs request
// details (6: URLs, 7: headers, 8 and up: request and response bodies).
const apiDumpVerbosity = 6

// withoutAPIDumps returns ctx with a logger that never logs at
// apiDumpVerbosity or above. getSecret uses it so that, with contextual
// logging on, not even the URL and headers of a Secret read are logged.
// It is not what keeps the Secret's data out of the log: with the
// ContextualLogging feature gate off client-go logs through the global
// logger and this cap does not apply; getSecret never lets client-go see
// the response body at all (see getSecret in executor_steps.go).
func withoutAPIDumps(ctx context.Context) context.Context {
	logger := klog.FromContext(ctx)
	sink := logger.GetSink()
	if sink == nil {
		return ctx
	}
	if cd, ok := sink.(logr.CallDepthLogSink); ok {
		sink = cd.WithCallDepth(1) // our Info and Error are one more frame
	}
	return klog.NewContext(ctx, logr.New(cappedSink{LogSink: sink, max: apiDumpVerbosity - 1}))
}

// cappedSink drops every message above verbosity max.
type cappedSink struct {
	logr.LogSink
	max int
}

var _ logr.CallDepthLogSink = cappedSink{}

// Init does nothing: the wrapped sink was initialised by its own logger,
// and initialising it again would change that logger's call depth too.
func (s cappedSink) Init(logr.RuntimeInfo) {}

func (s cappedSink) Enabled(level int) bool { return level <= s.max && s.LogSink.Enabled(level) }

func (s cappedSink) Info(level int, msg string, kv ...any) {
	if level <= s.max {
		s.LogSink.Info(level, msg, kv...)
	}
}

func (s cappedSink) WithValues(kv ...any) logr.LogSink {
	return cappedSink{LogSink: s.LogSink.WithValues(kv...), max: s.max}
}

func (s cappedSink) WithName(name string) logr.LogSink {
	return cappedSink{LogSink: s.LogSink.WithName(name), max: s.max}
}

func (s cappedSink) WithCallDepth(depth int) logr.LogSink {
	if cd, ok := s.LogSink.(logr.CallDepthLogSink); ok {
		return cappedSink{LogSink: cd.WithCallDepth(depth), max: s.max}
	}
	return s
}
