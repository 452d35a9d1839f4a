package server

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvtier/kvtier/offload"
)

// Errors returned by Namespace methods; the API maps each to a gRPC code.
var (
	// ErrUnknownRequest: no active request has the id (NOT_FOUND).
	ErrUnknownRequest = errors.New("unknown request id")
	// ErrUnknownNamespace: no namespace has the name (NOT_FOUND).
	ErrUnknownNamespace = errors.New("unknown namespace")
	// ErrRequestExists: NewRequest for an id that is still active
	// (ALREADY_EXISTS).
	ErrRequestExists = errors.New("request id already active")
	// ErrLimit: a call exceeds a configured limit (RESOURCE_EXHAUSTED).
	ErrLimit = errors.New("limit exceeded")
	// ErrNoSpace: the primary tier cannot make room (RESOURCE_EXHAUSTED).
	ErrNoSpace = errors.New("primary tier full")
	// ErrInvalidArgument: malformed input (INVALID_ARGUMENT).
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrProtocol: a call that violates the pin protocol, e.g. loading a key
	// that is not readable (FAILED_PRECONDITION).
	ErrProtocol = errors.New("protocol violation")
	// ErrArenaNotShared: the arena cannot be mapped by another process
	// (FAILED_PRECONDITION).
	ErrArenaNotShared = errors.New("arena cannot be shared")
	// ErrStaleEpoch: an engine step whose slots and pins belong to an
	// earlier instance of the namespace (the daemon restarted, or the
	// namespace was created anew): the engine must attach again
	// (FAILED_PRECONDITION).
	ErrStaleEpoch = errors.New("stale namespace epoch")
	// ErrPermissionDenied: a tenant named a namespace or a call that is
	// not its own (PERMISSION_DENIED).
	ErrPermissionDenied = errors.New("permission denied")
	// ErrClosed: the namespace is shutting down (UNAVAILABLE).
	ErrClosed = errors.New("daemon shutting down")
)

// toStatus maps an error of a Namespace method to a gRPC status error. The
// message is the error's text, which names the problem.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	code := codes.Internal
	switch {
	case errors.Is(err, ErrUnknownRequest), errors.Is(err, ErrUnknownNamespace):
		code = codes.NotFound
	case errors.Is(err, ErrRequestExists):
		code = codes.AlreadyExists
	case errors.Is(err, ErrLimit), errors.Is(err, ErrNoSpace):
		code = codes.ResourceExhausted
	case errors.Is(err, ErrInvalidArgument), errors.Is(err, offload.ErrInvalidFilter),
		errors.Is(err, offload.ErrInvalidParams), errors.Is(err, offload.ErrInvalidKey):
		code = codes.InvalidArgument
	case errors.Is(err, offload.ErrSlotOutOfRange):
		code = codes.OutOfRange
	case errors.Is(err, ErrProtocol), errors.Is(err, ErrArenaNotShared), errors.Is(err, ErrStaleEpoch):
		code = codes.FailedPrecondition
	case errors.Is(err, ErrPermissionDenied):
		code = codes.PermissionDenied
	case errors.Is(err, ErrClosed):
		code = codes.Unavailable
	case errors.Is(err, context.DeadlineExceeded):
		code = codes.DeadlineExceeded
	case errors.Is(err, context.Canceled):
		code = codes.Canceled
	}
	return status.Error(code, err.Error())
}
