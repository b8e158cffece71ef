package attacher_test

import (
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestBinaryRunsOnOneProcUnlessTold checks the csi-attacher binary's
// GOMAXPROCS decision: 1 by default (--max-procs), Go's own default with
// --max-procs=0, and that it attaches either way.
func TestBinaryRunsOnOneProcUnlessTold(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"default", nil, `"Set GOMAXPROCS" gomaxprocs=1 from="--max-procs"`},
		{"go-default", []string{"--max-procs=0"}, `"Kept GOMAXPROCS"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			attachThroughBinaryAndCheckLog(t, tc.name, tc.args, tc.want)
		})
	}
}

// attachThroughBinaryAndCheckLog starts the csi-attacher binary with -v=2
// and args, attaches a volume through it, stops it with SIGTERM, and
// fails unless it exits 0 and its log contains want.
func attachThroughBinaryAndCheckLog(t *testing.T, name string, args []string, want string) {
	t.Helper()
	e := newEnv(t, envOptions{noAttacher: true})
	att := e.startBinary(name, append([]string{"-v=2"}, args...)...)
	e.attachOne(time.Minute)
	att.signal(syscall.SIGTERM)
	if code := att.exitCode(time.Minute); code != 0 {
		t.Errorf("exit code %d after SIGTERM, want 0", code)
	}
	if out := att.out.String(); !strings.Contains(out, want) {
		t.Errorf("log does not contain %s:\n%s", want, tail(out, 3000))
	}
}
