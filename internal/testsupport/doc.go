// Package testsupport is what the end-to-end suites, bench and latch-local
// share to observe and break the stack they run: an API transport that
// records writes and injects faults (the API-side counterpart of
// csimock's rules), Eventually, Prometheus text scrapes and builds of the
// cmd/ binaries. Only tests and test rigs import it: test/boundaries keeps
// it out of the production binaries.
package testsupport
