package diagnose

import (
	"strings"

	storagev1 "k8s.io/api/storage/v1"
)

// grpcCodeNames are the gRPC status codes' names, by number, as a
// driver's error message carries them ("rpc error: code = Unavailable
// desc = …").
var grpcCodeNames = [...]string{"OK", "Canceled", "Unknown", "InvalidArgument", "DeadlineExceeded", "NotFound",
	"AlreadyExists", "PermissionDenied", "ResourceExhausted", "FailedPrecondition", "Aborted", "OutOfRange",
	"Unimplemented", "Internal", "Unavailable", "DataLoss", "Unauthenticated"}

// volumeErrorCode is e's gRPC code: its errorCode, else the code its
// message names. csi-attacher, as upstream's, sets errorCode on
// attachError only; a detachError names the code in its message.
func volumeErrorCode(e *storagev1.VolumeError) *int32 {
	if e.ErrorCode != nil {
		return e.ErrorCode
	}
	_, rest, ok := strings.Cut(e.Message, "code = ")
	if !ok {
		return nil
	}
	name, _, _ := strings.Cut(rest, " ")
	for i, n := range grpcCodeNames {
		if n == name {
			c := int32(i)
			return &c
		}
	}
	return nil
}
