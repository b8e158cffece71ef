package diagnose

import (
	"fmt"
	"time"
)

// CheckPendingTooLong is the check of PendingFindings.
const CheckPendingTooLong = "status.pendingTooLong"

// PendingFindings returns one problem per row whose attach has not
// completed (pending or failing) for longer than older since the
// VolumeAttachment was created, or whose detach has not completed for
// longer than older since its deletion was requested: the rows behind
// `latchctl status --fail-pending-older`. The order is the rows'.
func PendingFindings(rows []Row, older time.Duration) []Finding {
	var out []Finding
	for _, r := range rows {
		op := "attach to"
		switch r.State {
		case StatePending, StateFailing:
		case StateDetaching:
			op = "detach from"
		default:
			continue
		}
		if r.Age() <= older {
			continue
		}
		msg := fmt.Sprintf("%s node %s (driver %s) pending for %s, longer than %s", op, r.Node, r.Driver, HumanDuration(r.Age()), HumanDuration(older))
		if r.Error != "" {
			msg += fmt.Sprintf("; last error %s ago: %s", HumanDuration(time.Duration(r.ErrorAgeSeconds)*time.Second), r.Error)
		}
		out = append(out, Finding{Check: CheckPendingTooLong, Object: "VolumeAttachment " + r.Name, Status: StatusProblem,
			Message: msg, Hint: "latchctl explain va " + r.Name})
	}
	return out
}
