package kubelet_test

import (
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/latchcsi/latch/internal/csimock"
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

// callTable prints the call log one call a line.
func callTable(calls []csimock.Call) string {
	var b strings.Builder
	for _, c := range calls {
		fmt.Fprintf(&b, "  #%d %s vol=%s node=%s endpoint=%s %s–%s %s %s\n", c.ID, c.Method, c.VolumeID, c.NodeID, c.Endpoint,
			c.Start.Format("15:04:05.000"), c.End.Format("15:04:05.000"), c.CodeName, c.Message)
	}
	return b.String()
}

// findNodeCall is the first call of method for volume on node (its
// ControllerPublish/Unpublish target, or the node endpoint a Node call
// reached) that ended with code.
func findNodeCall(calls []csimock.Call, method, volume, nodeID string, code codes.Code) (csimock.Call, bool) {
	for _, c := range calls {
		if c.Method == method && c.VolumeID == volume && c.NodeID == nodeID && c.Done() && c.Code == code {
			return c, true
		}
	}
	return csimock.Call{}, false
}

// volumeCalls are the calls of volume on node, oldest first.
func volumeCalls(calls []csimock.Call, volume, nodeID string) []csimock.Call {
	var out []csimock.Call
	for _, c := range calls {
		if c.VolumeID == volume && c.NodeID == nodeID {
			out = append(out, c)
		}
	}
	return out
}

// isNodeMethod: a Node-service call (the kubelet's).
func isNodeMethod(m string) bool {
	switch m {
	case "NodeStageVolume", "NodeUnstageVolume", "NodePublishVolume", "NodeUnpublishVolume":
		return true
	}
	return false
}
