package server

import (
	"context"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvtier/kvtier/offload"
)

// TestToStatus maps every sentinel to its documented gRPC code (see the
// header of api/kvtier/v1/kvtier.proto) and keeps the wrapped message,
// which names the problem.
func TestToStatus(t *testing.T) {
	for _, tc := range []struct {
		err  error
		code codes.Code
	}{
		{ErrUnknownRequest, codes.NotFound},
		{ErrUnknownNamespace, codes.NotFound},
		{ErrRequestExists, codes.AlreadyExists},
		{ErrLimit, codes.ResourceExhausted},
		{ErrNoSpace, codes.ResourceExhausted},
		{ErrInvalidArgument, codes.InvalidArgument},
		{offload.ErrInvalidFilter, codes.InvalidArgument},
		{offload.ErrInvalidParams, codes.InvalidArgument},
		{offload.ErrInvalidKey, codes.InvalidArgument},
		{offload.ErrSlotOutOfRange, codes.OutOfRange},
		{ErrProtocol, codes.FailedPrecondition},
		{ErrArenaNotShared, codes.FailedPrecondition},
		{ErrClosed, codes.Unavailable},
		{context.DeadlineExceeded, codes.DeadlineExceeded},
		{context.Canceled, codes.Canceled},
	} {
		err := toStatus(fmt.Errorf("slot 99 of 64: %w", tc.err))
		st, _ := status.FromError(err)
		if st.Code() != tc.code || st.Message() != "slot 99 of 64: "+tc.err.Error() {
			t.Errorf("%v: got %v %q, want %v", tc.err, st.Code(), st.Message(), tc.code)
		}
	}
	if toStatus(nil) != nil {
		t.Error("toStatus(nil) != nil")
	}
}
