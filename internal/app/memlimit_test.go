package app

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/klog/v2/textlogger"
)

// memlimitWorld points the cgroup root at a directory with files, records
// what the limit would be set to and captures the log.
func memlimitWorld(t *testing.T, files map[string]string) (set *int64) {
	t.Helper()
	root := t.TempDir()
	for name, content := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	oldRoot, oldSet := cgroupRoot, setMemoryLimit
	t.Cleanup(func() { cgroupRoot, setMemoryLimit = oldRoot, oldSet })
	cgroupRoot = root
	var got int64 = -1
	setMemoryLimit = func(n int64) int64 { got = n; return 0 }
	return &got
}

func TestApplyMemoryLimit_ninetyPercentOfTheContainersLimit(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files map[string]string
		env   *string
		want  int64 // -1: not set
		log   string
	}{
		{"cgroup v2 limit", map[string]string{"memory.max": "536870912\n"}, nil, 483183820, "goMemoryLimitBytes=483183820"},
		{"cgroup v2 without limit", map[string]string{"memory.max": "max\n"}, nil, -1, ""},
		{"cgroup v1 limit", map[string]string{"memory/memory.limit_in_bytes": "1073741824\n"}, nil, 966367641, filepath.Join("memory", "memory.limit_in_bytes") + "\""},
		{"cgroup v1 without limit", map[string]string{"memory/memory.limit_in_bytes": "9223372036854771712\n"}, nil, -1, ""},
		{"no cgroup files", nil, nil, -1, ""},
		{"unreadable value", map[string]string{"memory.max": "lots\n"}, nil, -1, "cannot read the container's memory limit"},
		{"GOMEMLIMIT set", map[string]string{"memory.max": "536870912\n"}, strPtr("300MiB"), -1, "Go memory limit from GOMEMLIMIT"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := memlimitWorld(t, tc.files)
			if tc.env != nil {
				t.Setenv("GOMEMLIMIT", *tc.env)
			} else {
				// t.Setenv restores the variable; unset it for the test.
				t.Setenv("GOMEMLIMIT", "")
				os.Unsetenv("GOMEMLIMIT")
			}
			var buf strings.Builder
			applyMemoryLimit(textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(&buf), textlogger.Verbosity(2))))
			if *got != tc.want {
				t.Errorf("soft limit set to %d, want %d", *got, tc.want)
			}
			if tc.log != "" && !strings.Contains(buf.String(), tc.log) {
				t.Errorf("log %q lacks %q", buf.String(), tc.log)
			}
		})
	}
}

func strPtr(s string) *string { return &s }
