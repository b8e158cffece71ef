package app

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"

	"k8s.io/klog/v2"
)

// MemoryLimitRatio is the share of the container's memory limit that
// both binaries give Go as its soft memory limit when GOMEMLIMIT is not
// set: the garbage collector then works harder as the heap nears the
// container's limit instead of letting the heap reach twice the live data
// (GOGC=100) and the container be OOM-killed. The tenth left is for what
// is not Go heap (goroutine stacks, the runtime, the binary's pages).
const MemoryLimitRatio = 0.9

// cgroupRoot is where the container's cgroup is mounted (tests point it
// at a directory of their own).
var cgroupRoot = "/sys/fs/cgroup"

// setMemoryLimit is debug.SetMemoryLimit (tests replace it).
var setMemoryLimit = debug.SetMemoryLimit

// applyMemoryLimit sets Go's soft memory limit to MemoryLimitRatio of the
// cgroup's memory limit, unless GOMEMLIMIT is set (Go applied it already;
// GOMEMLIMIT=off leaves no limit) or the cgroup has none. It logs what it
// did; a cgroup file it cannot read or parse is logged and changes
// nothing.
func applyMemoryLimit(logger klog.Logger) {
	if v := os.Getenv("GOMEMLIMIT"); v != "" {
		logger.Info("Go memory limit from GOMEMLIMIT", "GOMEMLIMIT", v)
		return
	}
	limit, source, err := cgroupMemoryLimit(cgroupRoot)
	switch {
	case err != nil:
		logger.Info("No Go memory limit set: cannot read the container's memory limit", "err", err)
	case limit == 0:
		logger.V(2).Info("No Go memory limit set: the container has no memory limit", "source", source)
	default:
		soft := int64(float64(limit) * MemoryLimitRatio)
		setMemoryLimit(soft)
		logger.Info("Go memory limit set from the container's memory limit (set GOMEMLIMIT to choose another, GOMEMLIMIT=off for none)",
			"limitBytes", limit, "goMemoryLimitBytes", soft, "ratio", MemoryLimitRatio, "source", source)
	}
}

// cgroupMemoryLimit reads the memory limit of the process's cgroup under
// root: cgroup v2's memory.max, else v1's memory/memory.limit_in_bytes.
// It returns 0 when there is no limit ("max", or v1's huge sentinel), and
// an error only when a file exists but cannot be read or parsed (no file
// at all: not in a container with a memory controller, 0).
func cgroupMemoryLimit(root string) (limit uint64, source string, err error) {
	for _, f := range []string{"memory.max", filepath.Join("memory", "memory.limit_in_bytes")} {
		path := filepath.Join(root, f)
		data, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return 0, path, err
		}
		s := strings.TrimSpace(string(data))
		if s == "max" {
			return 0, path, nil
		}
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return 0, path, fmt.Errorf("%s: %q is not a byte count", path, s)
		}
		// cgroup v1 reports "no limit" as a page-rounded MaxInt64.
		if n >= math.MaxInt64/2 {
			return 0, path, nil
		}
		return n, path, nil
	}
	return 0, "", nil
}
