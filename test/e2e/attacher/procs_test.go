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
			e := newEnv(t, envOptions{noAttacher: true})
			att := e.startBinary(tc.name, append([]string{"-v=2"}, tc.args...)...)
			e.attachOne(time.Minute)
			att.signal(syscall.SIGTERM)
			if code := att.exitCode(time.Minute); code != 0 {
				t.Errorf("exit code %d after SIGTERM, want 0", code)
			}
			if out := att.out.String(); !strings.Contains(out, tc.want) {
				t.Errorf("log does not contain %s:\n%s", tc.want, tail(out, 3000))
			}
		})
	}
}
