package csi

import (
	"context"
	"time"

	"github.com/kubernetes-csi/csi-lib-utils/protosanitizer"
	"k8s.io/klog/v2"
)

// callLogLevel is the verbosity of per-call logs. csi-lib-utils' own
// interceptor adds full request/response dumps at level 5.
const callLogLevel = 4

// logCall logs one RPC before and after it runs, with secrets stripped by
// protosanitizer: request and response are only ever logged through it,
// never with %v of the raw message. It returns the function to call with
// the outcome.
func logCall(ctx context.Context, method string, req any) func(rsp any, err error) {
	logger := klog.FromContext(ctx)
	if !logger.V(callLogLevel).Enabled() {
		return func(any, error) {}
	}
	start := time.Now()
	logger.V(callLogLevel).Info("Calling CSI driver", "method", method, "request", protosanitizer.StripSecrets(req))
	return func(rsp any, err error) {
		if err != nil {
			logger.V(callLogLevel).Info("CSI call failed", "method", method, "duration", time.Since(start), "err", err, "final", IsFinalError(err))
			return
		}
		logger.V(callLogLevel).Info("CSI call succeeded", "method", method, "duration", time.Since(start), "response", protosanitizer.StripSecrets(rsp))
	}
}
