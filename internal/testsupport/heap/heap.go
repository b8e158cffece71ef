// Package heap measures the live heap for the memory benchmarks.
package heap

import "runtime"

// Live is the live heap in bytes after two collections (the second frees
// what the first's finalizers released).
func Live() uint64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}
