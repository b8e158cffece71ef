package csi

import (
	"context"
	"fmt"
	"time"

	"github.com/kubernetes-csi/csi-lib-utils/protosanitizer"
	"k8s.io/klog/v2"
)

// callLogLevel is the verbosity of per-call logs. They are the only logs
// of a call: dial adds no gRPC logging interceptor (csi-lib-utils'
// connection.Connect would log every call a second time at level 5).
const callLogLevel = 4

// logCall logs one RPC before and after it runs, with secrets stripped by
// protosanitizer: request and response are only ever logged through it,
// never with %v of the raw message, and cut at maxLen characters when
// maxLen > 0. It returns the function to call with the outcome.
func logCall(ctx context.Context, method string, req any, maxLen int) func(rsp any, err error) {
	logger := klog.FromContext(ctx)
	if !logger.V(callLogLevel).Enabled() {
		return func(any, error) {}
	}
	start := time.Now()
	logger.V(callLogLevel).Info("Calling CSI driver", "method", method, "request", capped(protosanitizer.StripSecrets(req).String(), maxLen))
	return func(rsp any, err error) {
		if err != nil {
			logger.V(callLogLevel).Info("CSI call failed", "method", method, "duration", time.Since(start), "err", err, "final", IsFinalError(err))
			return
		}
		logger.V(callLogLevel).Info("CSI call succeeded", "method", method, "duration", time.Since(start), "response", capped(protosanitizer.StripSecrets(rsp).String(), maxLen))
	}
}

// capped cuts s to maxLen characters (bytes) when maxLen > 0 and says so.
func capped(s string, maxLen int) string {
	if maxLen <= 0 || len(s) <= maxLen {
		return s
	}
	return s[:maxLen] + fmt.Sprintf(" [%d characters, log capped to %d characters]", len(s), maxLen)
}
