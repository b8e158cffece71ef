package attacher_test

import (
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestBinaryRaisesTheCollectorsMinimumHeapOnlyWhenAskedTo checks the
// csi-attacher binary's garbage collector decision: Go's pace by default,
// the floor with --gc-min-heap-mib=32, Go's pace again when GOGC is in the
// environment, and that it attaches in each case.
func TestBinaryRaisesTheCollectorsMinimumHeapOnlyWhenAskedTo(t *testing.T) {
	for _, tc := range []struct {
		name string
		gogc string // "": unset
		args []string
		want string
	}{
		{"default", "", nil, `"Kept Go's garbage collector pace" from="--gc-min-heap-mib=0"`},
		{"flag-32", "", []string{"--gc-min-heap-mib=32"}, `"Raised the garbage collector's minimum heap" minHeapMiB=32 gogc=100 from="--gc-min-heap-mib"`},
		{"gogc-env", "200", []string{"--gc-min-heap-mib=32"}, `"Kept Go's garbage collector pace" from="GOGC environment variable"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The child inherits this process's environment.
			t.Setenv("GOGC", tc.gogc)
			if tc.gogc == "" {
				os.Unsetenv("GOGC")
			}
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
