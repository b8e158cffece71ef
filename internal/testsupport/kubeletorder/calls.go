package kubeletorder

import (
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/latchcsi/latch/internal/csimock"
)

// CallTable prints the call log one call a line.
func CallTable(calls []csimock.Call) string {
	var b strings.Builder
	for _, c := range calls {
		fmt.Fprintf(&b, "  #%d %s vol=%s node=%s endpoint=%s %s–%s %s %s\n", c.ID, c.Method, c.VolumeID, c.NodeID, c.Endpoint,
			c.Start.Format("15:04:05.000"), c.End.Format("15:04:05.000"), c.CodeName, c.Message)
	}
	return b.String()
}

// FindNodeCall is the first call of method for volume on node (its
// ControllerPublish/Unpublish target, or the node endpoint a Node call
// reached) that ended with code.
func FindNodeCall(calls []csimock.Call, method, volume, nodeID string, code codes.Code) (csimock.Call, bool) {
	for _, c := range calls {
		if c.Method == method && c.VolumeID == volume && c.NodeID == nodeID && c.Done() && c.Code == code {
			return c, true
		}
	}
	return csimock.Call{}, false
}

// VolumeCalls are the calls of volume on node, oldest first.
func VolumeCalls(calls []csimock.Call, volume, nodeID string) []csimock.Call {
	var out []csimock.Call
	for _, c := range calls {
		if c.VolumeID == volume && c.NodeID == nodeID {
			out = append(out, c)
		}
	}
	return out
}

// IsNodeMethod reports a Node-service call (the kubelet's).
func IsNodeMethod(m string) bool {
	switch m {
	case "NodeStageVolume", "NodeUnstageVolume", "NodePublishVolume", "NodeUnpublishVolume":
		return true
	}
	return false
}

// Stamp formats a call's start or end for a message.
func Stamp(t time.Time) string { return t.Format("15:04:05.000") }
