package server

// Request bytes in flight.
//
// gRPC reads a unary call's whole request (up to max_message_bytes)
// before any interceptor runs, and nothing in gRPC bounds the requests
// being read at once over all connections. So every method is served as a
// stream (serviceDesc): its handler reserves max_message_bytes of the
// daemon's receive budget before it asks gRPC for the request, and gives
// the reservation back once the request is decoded. Before that, HTTP/2
// flow control holds a call to its stream window (receiveWindow): gRPC
// opens the window to a message's size only when the handler reads it.
// So the request bytes the daemon holds at once are at most
// max_receive_bytes plus receiveWindow per call that is waiting for a
// reservation or has not reached its handler, and the waiting calls are
// bounded (maxReceiveWaiters; beyond, a call is refused at once).
//
// A principal (the admin, a tenant) holds at most half of the budget when
// tenants are configured, so that a tenant trickling its requests cannot
// take the reservations another needs; a call whose request has not
// arrived receive_timeout after its reservation is cancelled.

import (
	"context"
	"errors"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvtier/kvtier/api/wire"
	"github.com/kvtier/kvtier/budget"
)

const (
	// receiveWindow is the API's HTTP/2 stream window: what a call may
	// send before its handler reads its request.
	receiveWindow = 64 << 10
	// maxReceiveWaiters bounds the calls waiting for a reservation.
	maxReceiveWaiters = 4096
)

// errReceiveTimeout cancels a call whose request did not arrive in time.
var errReceiveTimeout = errors.New("request not received within the receive timeout")

// receiveCtl is the call context the tap gives gRPC (the reader of the
// call's request stops when it is cancelled), and what it hands the
// call's handler: who reserves, and how to cancel the reading. One
// allocation beside the cancelable context, on every call.
type receiveCtl struct {
	context.Context
	holder string
	cancel context.CancelCauseFunc
}

type receiveKey struct{}

func (c *receiveCtl) Value(key any) any {
	if key == (receiveKey{}) {
		return c
	}
	return c.Context.Value(key)
}

func withReceiveCtl(ctx context.Context, holder string) context.Context {
	ctx, cancel := context.WithCancelCause(ctx)
	return &receiveCtl{Context: ctx, holder: holder, cancel: cancel}
}

// holderOf names a principal for the receive budget.
func holderOf(p principal) string {
	if p.t != nil {
		return "tenant " + p.t.name
	}
	return "admin"
}

// newReceiveBudget returns the daemon's receive budget.
func newReceiveBudget(l Limits, tenants bool) (*budget.Budget, error) {
	share := l.MaxReceiveBytes
	if tenants {
		share = max(l.MaxReceiveBytes/2, int64(l.MaxMessageBytes))
	}
	return budget.New(l.MaxReceiveBytes, share, maxReceiveWaiters)
}

// receive reads one request message of ss into v within the receive
// budget, and fails a request that does not decode with INVALID_ARGUMENT.
func (s *Server) receive(ss grpc.ServerStream, codec wire.ServerCodec, v any) error {
	ctx := ss.Context()
	ctl, _ := ctx.Value(receiveKey{}).(*receiveCtl)
	holder := "admin"
	if ctl != nil {
		holder = ctl.holder
	}
	grant, err := s.recvBudget.Acquire(ctx, holder, int64(s.limits.MaxMessageBytes))
	if err != nil {
		if ctx.Err() != nil {
			return status.FromContextError(ctx.Err()).Err()
		}
		s.metrics.receiveRefusals.WithLabelValues("busy").Inc()
		s.sideLogs.Warn(s.log, "receive-busy", "API call refused before its request was read: too many calls waiting for the receive budget",
			"max_receive_bytes", s.limits.MaxReceiveBytes, "waiting", maxReceiveWaiters)
		return status.Errorf(codes.ResourceExhausted, "the daemon is receiving max_receive_bytes (%d) of requests and %d calls wait: retry later", s.limits.MaxReceiveBytes, maxReceiveWaiters)
	}
	defer grant.Release()
	if ctl != nil {
		t := time.AfterFunc(s.limits.ReceiveTimeout, func() { ctl.cancel(errReceiveTimeout) })
		defer t.Stop()
	}
	if err := ss.RecvMsg(v); err != nil {
		if ctl != nil && errors.Is(context.Cause(ctx), errReceiveTimeout) {
			s.metrics.receiveRefusals.WithLabelValues("timeout").Inc()
			s.sideLogs.Warn(s.log, "receive-timeout", "API call cancelled: its request did not arrive within receive_timeout", "holder", holder, "receive_timeout", s.limits.ReceiveTimeout)
			return status.Errorf(codes.DeadlineExceeded, "request not received within receive_timeout (%v)", s.limits.ReceiveTimeout)
		}
		return err
	}
	if err := codec.DecodeError(v); err != nil {
		return status.Error(codes.InvalidArgument, "malformed request message: "+err.Error())
	}
	return nil
}

// serviceDesc returns desc with every unary method served as a stream
// whose request is read through receive, and chain run around the
// method as gRPC would run its unary interceptors; streaming methods read
// their messages through receive too.
func (s *Server) serviceDesc(desc *grpc.ServiceDesc, codec wire.ServerCodec, chain grpc.UnaryServerInterceptor) *grpc.ServiceDesc {
	d := *desc
	d.Methods = nil
	d.Streams = make([]grpc.StreamDesc, 0, len(desc.Methods)+len(desc.Streams))
	for _, m := range desc.Methods {
		h := m.Handler
		d.Streams = append(d.Streams, grpc.StreamDesc{
			StreamName: m.MethodName,
			Handler: func(srv any, ss grpc.ServerStream) error {
				resp, err := h(srv, ss.Context(), func(v any) error { return s.receive(ss, codec, v) }, chain)
				if err != nil {
					return err
				}
				return ss.SendMsg(resp)
			},
		})
	}
	for _, sd := range desc.Streams {
		h := sd.Handler
		sd.Handler = func(srv any, ss grpc.ServerStream) error {
			return h(srv, &receivingStream{ss, s, codec})
		}
		d.Streams = append(d.Streams, sd)
	}
	return &d
}

// receivingStream reads every message through receive.
type receivingStream struct {
	grpc.ServerStream
	s     *Server
	codec wire.ServerCodec
}

func (r *receivingStream) RecvMsg(m any) error { return r.s.receive(r.ServerStream, r.codec, m) }

// unaryMethod reports whether a stream handler serves a unary method
// (serviceDesc): gRPC runs stream interceptors on it, which must pass it
// through to the unary chain.
func unaryMethod(info *grpc.StreamServerInfo) bool {
	return !info.IsClientStream && !info.IsServerStream
}

// chainUnary runs outer around inner around a handler, as
// grpc.ChainUnaryInterceptor does.
func chainUnary(outer, inner grpc.UnaryServerInterceptor) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		return outer(ctx, req, info, func(ctx context.Context, req any) (any, error) { return inner(ctx, req, info, h) })
	}
}
