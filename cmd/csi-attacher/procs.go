package main

// DefaultMaxProcs is --max-procs' default. The sidecar spends its time
// waiting for the API server and the driver: one core runs well over a
// thousand attaches a second of its Go code, and a second P only adds
// idle threads spinning for work and a parallel garbage collector that
// compete with whatever shares the node (docs/performance.md measures it
// next to the API server).
const DefaultMaxProcs = 1

// Where the sidecar's GOMAXPROCS comes from.
const (
	procsFromEnv   = "GOMAXPROCS environment variable"
	procsFromQuota = "--automaxprocs"
	procsFromFlag  = "--max-procs"
	procsFromGo    = "Go's default"
)

// procsFor decides the sidecar's GOMAXPROCS: an explicit GOMAXPROCS
// environment variable (already applied by the Go runtime) wins, then
// --automaxprocs (the container's CPU quota), then --max-procs; 0 keeps
// Go's own default. It returns the value to set (0: set nothing) and where
// the decision came from.
func procsFor(env string, automaxprocs bool, maxProcs int) (int, string) {
	switch {
	case env != "":
		return 0, procsFromEnv
	case automaxprocs:
		return 0, procsFromQuota
	case maxProcs > 0:
		return maxProcs, procsFromFlag
	}
	return 0, procsFromGo
}
