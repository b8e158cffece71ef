package csimock

import (
	"context"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/kubernetes-csi/csi-lib-utils/protosanitizer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
)

// instance is what every call of one serving instance (between a Start or
// Restart and the next Crash or Stop) shares.
type instance struct {
	epoch  uint64
	down   <-chan struct{}
	logger klog.Logger
	// nodeID is the node whose Node service this instance serves (the
	// node ID of Node-service calls); endpoint is set on a node endpoint's
	// socket (StartNode) and empty on the driver's own socket.
	nodeID   string
	endpoint string
}

type callRefKey struct{}

// nodeServicePrefix starts the full method name of every Node RPC.
const nodeServicePrefix = "/csi.v1.Node/"

// callRefFrom returns the call a handler runs for; in-process calls that
// did not come through gRPC get the unfenced zero value.
func callRefFrom(ctx context.Context) callRef {
	ref, _ := ctx.Value(callRefKey{}).(callRef)
	return ref
}

// interceptor is the one place where calls are logged, counted and
// faulted, so every RPC of every service gets the same treatment.
func (d *Driver) interceptor(inst instance) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		call := &Call{Method: normalizeMethod(info.FullMethod), Endpoint: inst.endpoint, Start: d.clock.Now()}
		describeRequest(call, req)
		if call.NodeID == "" && strings.HasPrefix(info.FullMethod, nodeServicePrefix) {
			// Node RPCs carry no node ID: they act on the node whose
			// socket got them, so that is what logs and fault rules see.
			call.NodeID = inst.nodeID
		}
		d.calls.begin(call)

		logger := klog.LoggerWithValues(inst.logger, "method", call.Method, "call", call.ID)
		ctx = klog.NewContext(ctx, logger)
		ctx = context.WithValue(ctx, callRefKey{}, callRef{id: call.ID, epoch: inst.epoch, fenced: true})
		if loggerV := logger.V(5); loggerV.Enabled() {
			// Secrets never reach the log: the request is sanitized.
			loggerV.Info("CSI call", "request", protosanitizer.StripSecrets(req))
		}

		resp, fired, err := d.runWithFaults(ctx, inst, call, req, handler)

		d.state.callDone(call.ID)
		st := status.Convert(err)
		d.calls.end(call, d.clock.Now(), st.Code(), st.Message(), fired)
		logger.V(4).Info("CSI call done", "volumeID", call.VolumeID, "nodeID", call.NodeID, "code", st.Code(), "message", st.Message())
		return resp, err
	}
}

// runWithFaults runs the before-phase faults, the handler, and the
// after-phase faults. An after-phase fault replaces a successful reply:
// the state change stays, the caller only sees the fault.
func (d *Driver) runWithFaults(ctx context.Context, inst instance, call *Call, req any, handler grpc.UnaryHandler) (any, []string, error) {
	before := d.faults.evaluate(PhaseBefore, call.Method, call.VolumeID, call.NodeID)
	fired := before.ruleIDs
	if err := d.act(ctx, inst, before); err != nil {
		return nil, fired, err
	}
	req = d.endlessListRequest(req)
	resp, err := d.throughBackend(ctx, inst, call.Method, func() (any, error) { return handler(ctx, req) })
	if err != nil {
		return nil, fired, err
	}
	d.endlessListReply(resp, before.nextToken)
	after := d.faults.evaluate(PhaseAfter, call.Method, call.VolumeID, call.NodeID)
	fired = append(fired, after.ruleIDs...)
	if err := d.act(ctx, inst, after); err != nil {
		return nil, fired, err
	}
	return resp, fired, nil
}

// act performs a fault action: latency first, then a hang or an error.
// Waiting ends early when the caller gives up or the instance goes down,
// the way a real call would fail at that point.
func (d *Driver) act(ctx context.Context, inst instance, a faultAction) error {
	if a.none() {
		return nil
	}
	if a.latency > 0 {
		t := d.clock.NewTimer(a.latency)
		select {
		case <-t.C():
		case <-ctx.Done():
			t.Stop()
			return status.FromContextError(ctx.Err()).Err()
		case <-inst.down:
			t.Stop()
			return errCrashed
		}
	}
	if a.hang {
		select {
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case <-inst.down:
			return errCrashed
		case <-a.release:
			// Released: the rule's code, if any, else the call goes on.
		}
	}
	if a.code != codes.OK {
		return status.Error(a.code, a.message)
	}
	return nil
}

// describeRequest copies the fields the call log and fault matching use.
// It reads getters only, so secrets and contexts are never copied.
func describeRequest(c *Call, req any) {
	if r, ok := req.(interface{ GetVolumeId() string }); ok {
		c.VolumeID = r.GetVolumeId()
	}
	if r, ok := req.(interface{ GetNodeId() string }); ok {
		c.NodeID = r.GetNodeId()
	}
	if r, ok := req.(interface{ GetReadonly() bool }); ok {
		c.Readonly = r.GetReadonly()
	}
	if r, ok := req.(*csi.CreateVolumeRequest); ok {
		c.Name = r.GetName()
	}
}
