package csi

import (
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// IsFinalError reports whether err means the driver has finished handling
// the call, so that its outcome is known (an error here means "not done,
// and nothing is in progress").
//
// It returns false, "the operation may still be running in the driver or
// the storage backend", for:
//   - errors that are not gRPC statuses: the call failed before or while
//     reaching the driver (for example a local context deadline), so it is
//     unknown whether the driver received it;
//   - Canceled and DeadlineExceeded: the caller gave up, the driver may not
//     have;
//   - Unavailable: the connection broke; the request may have been
//     delivered;
//   - ResourceExhausted and Aborted: the CSI spec uses them for "busy, an
//     operation on this volume is pending"; retry later.
//
// Everything else, including nil (the call succeeded), is final. A caller
// must never assume a volume is detached after a non-final error; it keeps
// its finalizer and retries. The same classification is used by upstream
// external-attacher.
func IsFinalError(err error) bool {
	if err == nil {
		return true
	}
	st, ok := status.FromError(err)
	if !ok {
		return false
	}
	switch st.Code() {
	case codes.Canceled, codes.DeadlineExceeded, codes.Unavailable, codes.ResourceExhausted, codes.Aborted:
		return false
	}
	return true
}
