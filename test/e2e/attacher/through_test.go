package attacher_test

import "github.com/latchcsi/latch/internal/testsupport"

// startAttacherThrough runs the test's attacher replica (options o, the
// given identity, any Lease in "default") with every API request going
// through tr, which records it and injects tr's faults; the env stops it
// when the test ends.
func (e *env) startAttacherThrough(tr *testsupport.APITransport, identity string, o envOptions) {
	cfg := cluster.RESTConfig()
	cfg.WrapTransport = tr.Wrap
	e.stopAtt = e.startAttacherAs(cfg, o, identity, "default")
}
