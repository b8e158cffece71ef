package attacher_test

import (
	"os"
	"testing"
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
			attachThroughBinaryAndCheckLog(t, tc.name, tc.args, tc.want)
		})
	}
}
