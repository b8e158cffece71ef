package kubelet_test

import (
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/latchcsi/latch/internal/csimock"
	"github.com/latchcsi/latch/internal/testsupport/kubeletorder"
)

// findCall is the first call of method for volume that ended with code.
func findCall(calls []csimock.Call, method, volume string, code codes.Code) (csimock.Call, bool) {
	for _, c := range calls {
		if c.Method == method && c.VolumeID == volume && c.Done() && c.Code == code {
			return c, true
		}
	}
	return csimock.Call{}, false
}

// mustCall is findCall that fails the test with the call log.
func mustCall(t *testing.T, calls []csimock.Call, method, volume string, code codes.Code) csimock.Call {
	t.Helper()
	c, ok := findCall(calls, method, volume, code)
	if !ok {
		t.Fatalf("no %s of %s ending %s; calls:\n%s", method, volume, code, callTable(calls))
	}
	return c
}

// lastCall is the last call of method.
func lastCall(calls []csimock.Call, method string) (csimock.Call, bool) {
	for i := len(calls) - 1; i >= 0; i-- {
		if calls[i].Method == method {
			return calls[i], true
		}
	}
	return csimock.Call{}, false
}

// The call-log helpers the ordering checks use, shared with
// test/e2e/attachdetach (kubeletorder).
var (
	// callTable prints the call log one call a line.
	callTable = kubeletorder.CallTable
	// findNodeCall is the first call of method for volume on node (its
	// ControllerPublish/Unpublish target, or the node endpoint a Node
	// call reached) that ended with code.
	findNodeCall = kubeletorder.FindNodeCall
)
