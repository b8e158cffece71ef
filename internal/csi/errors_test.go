package csi

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestIsFinalError(t *testing.T) {
	tests := []struct {
		name  string
		err   error
		final bool
	}{
		{"nil: the call succeeded", nil, true},
		{"non-gRPC error", errors.New("dial failed"), false},
		{"local context deadline", context.DeadlineExceeded, false},
		{"wrapped non-gRPC", fmt.Errorf("publish: %w", context.Canceled), false},
		{"Canceled", status.Error(codes.Canceled, ""), false},
		{"DeadlineExceeded", status.Error(codes.DeadlineExceeded, ""), false},
		{"Unavailable", status.Error(codes.Unavailable, ""), false},
		{"ResourceExhausted", status.Error(codes.ResourceExhausted, ""), false},
		{"Aborted", status.Error(codes.Aborted, ""), false},
		{"wrapped Unavailable", fmt.Errorf("ControllerPublishVolume volume %q: %w", "v", status.Error(codes.Unavailable, "")), false},
		{"Unknown", status.Error(codes.Unknown, ""), true},
		{"InvalidArgument", status.Error(codes.InvalidArgument, ""), true},
		{"NotFound", status.Error(codes.NotFound, ""), true},
		{"AlreadyExists", status.Error(codes.AlreadyExists, ""), true},
		{"PermissionDenied", status.Error(codes.PermissionDenied, ""), true},
		{"FailedPrecondition", status.Error(codes.FailedPrecondition, ""), true},
		{"OutOfRange", status.Error(codes.OutOfRange, ""), true},
		{"Unimplemented", status.Error(codes.Unimplemented, ""), true},
		{"Internal", status.Error(codes.Internal, ""), true},
		{"DataLoss", status.Error(codes.DataLoss, ""), true},
		{"Unauthenticated", status.Error(codes.Unauthenticated, ""), true},
		{"wrapped Internal", fmt.Errorf("op: %w", status.Error(codes.Internal, "")), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := IsFinalError(tt.err); got != tt.final {
				t.Fatalf("IsFinalError(%v) = %v, want %v", tt.err, got, tt.final)
			}
		})
	}
}
