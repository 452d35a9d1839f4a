package server

import (
	"fmt"
	"time"

	"github.com/kvtier/kvtier/offload"
)

// Defaults of Limits.
const (
	DefaultMaxKeysPerCall  = 1 << 16
	DefaultMaxMessageBytes = 64 << 20
	DefaultMaxRequests     = 1 << 16
	DefaultMaxParamsBytes  = 64 << 10
	DefaultMaxWait         = 10 * time.Second
	// DefaultMaxSessionParamsBytes and DefaultMaxParamsBytesTotal bound
	// the kv_transfer_params the active requests hold, per session and in
	// all: a request costs about its params' size (kept as JSON), so the
	// daemon's request memory stays under a few hundred MiB whatever the
	// clients send.
	DefaultMaxSessionParamsBytes = 64 << 20
	DefaultMaxParamsBytesTotal   = 256 << 20
	// DefaultRequestIdleTimeout releases a request no call has named for
	// this long: a client that forgot to finish it, or whose process hangs
	// while its connection stays open.
	DefaultRequestIdleTimeout = 10 * time.Minute
	// DefaultAutoStepInterval: when no engine has ended a step for this
	// long and tier work is pending, the daemon ends one itself.
	DefaultAutoStepInterval = 100 * time.Millisecond
	// DefaultEngineLookupSettle: a manager-mode step's answer waits up to
	// this long for the lookups it left unsure.
	DefaultEngineLookupSettle = 3 * time.Millisecond
	// DefaultMaxConnections bounds each listener's connections; beyond it
	// new connections wait in the kernel's backlog. It is lowered to fit
	// the process's file descriptor limit.
	DefaultMaxConnections = 1024
	// DefaultConnectionIdleTimeout closes a connection that carried no
	// call for this long (its session, if any request is left, ends).
	DefaultConnectionIdleTimeout = 15 * time.Minute
	// DefaultKeepaliveTime and DefaultKeepaliveTimeout: the daemon pings a
	// connection that is quiet for KeepaliveTime and closes it (ending its
	// session) if the ping is not answered within KeepaliveTimeout, so a
	// client whose host vanished is noticed.
	DefaultKeepaliveTime    = 30 * time.Second
	DefaultKeepaliveTimeout = 10 * time.Second
	// DefaultSideChannelTimeout: an arena side-channel client sends its
	// namespace line as it connects; one that sends nothing for this long
	// is dropped.
	DefaultSideChannelTimeout = 2 * time.Second
	// DefaultAuthTimeout: a TCP connection of the API that has carried no
	// call with a valid token for this long is closed, and a block-stream
	// connection must send its hello within it.
	DefaultAuthTimeout = 3 * time.Second
	// DefaultStreamRequestTimeout and DefaultStreamMinRate bound a block-
	// stream request as a whole: its blocks must move within the timeout
	// plus their bytes at the minimum rate, so that a peer reading or
	// writing a trickle cannot hold the slots it pins or reserves for long.
	DefaultStreamRequestTimeout = 30 * time.Second
	DefaultStreamMinRate        = 4 << 20 // bytes per second
	// DefaultReceiveTimeout bounds the time from a call's reservation of
	// receive budget to its whole request.
	DefaultReceiveTimeout = 30 * time.Second
	// DefaultMaxStreamsPerConnection bounds the calls in flight on one
	// API connection (HTTP/2 streams); further calls wait in the client.
	DefaultMaxStreamsPerConnection = 128
)

// Limits bound what one client can ask of the daemon (docs/design.md §7). A zero
// field takes its default.
type Limits struct {
	// MaxKeysPerCall bounds the keys (or blocks, or request ids) of one
	// call.
	MaxKeysPerCall int
	// MaxKeyBytes bounds the length of one key; at most offload.MaxKeyLen.
	MaxKeyBytes int
	// MaxMessageBytes bounds a request or response message; gRPC rejects
	// larger ones with RESOURCE_EXHAUSTED.
	MaxMessageBytes int
	// MaxReceiveBytes bounds the request bytes being received at once,
	// over all connections (default 16 × MaxMessageBytes): a call
	// reserves MaxMessageBytes before gRPC reads its request and gives
	// it back once the request is decoded (receive.go).
	MaxReceiveBytes int64
	// ReceiveTimeout bounds the time from a call's reservation to its
	// whole request; the call is cancelled past it.
	ReceiveTimeout time.Duration
	// MaxRequests bounds the active requests of one namespace.
	MaxRequests int
	// MaxSessionRequests bounds the active requests one session (a client
	// connection) holds in one namespace, so that no single client can
	// take the whole request table (default MaxRequests / 4).
	MaxSessionRequests int
	// MaxTenantRequests bounds the active requests one tenant holds in one
	// namespace over all its connections, so that no tenant can take the
	// request table by opening more connections (default MaxRequests / 4).
	MaxTenantRequests int
	// MaxParamsBytes bounds a kv_transfer_params document.
	MaxParamsBytes int
	// MaxWait caps GetBlocks' wait_ms.
	MaxWait time.Duration
	// MaxSessionParamsBytes and MaxParamsBytesTotal bound the
	// kv_transfer_params bytes the active requests hold, per session and
	// in all namespaces together.
	MaxSessionParamsBytes int64
	MaxParamsBytesTotal   int64
	// RequestIdleTimeout releases a request after this long without a call
	// naming it.
	RequestIdleTimeout time.Duration
	// AutoStepInterval: the daemon ends a step itself when no engine has
	// for this long and tier work is pending; negative disables it.
	AutoStepInterval time.Duration
	// EngineLookupSettle: how long EngineStep may wait, without the
	// namespace's lock, for lookups it answered "not sure yet" (a tier's
	// existence check, a promotion) and ask them again before it answers;
	// negative never waits.
	EngineLookupSettle time.Duration
	// MaxConnections bounds each listener's concurrent connections.
	MaxConnections int
	// MaxConnectionsPerPeer bounds the TCP API's connections from one
	// address (default: a quarter of the connection bound; negative: no
	// bound but that one), so that one host's clients, with tokens or
	// without, cannot take every connection.
	MaxConnectionsPerPeer int
	// ConnectionIdleTimeout closes connections without calls; keep-alive
	// pings (KeepaliveTime, KeepaliveTimeout) find dead peers.
	ConnectionIdleTimeout time.Duration
	KeepaliveTime         time.Duration
	KeepaliveTimeout      time.Duration
	// SideChannelTimeout bounds how long an arena side-channel connection
	// may take to send its request line.
	SideChannelTimeout time.Duration
	// AuthTimeout closes a TCP API connection that has not authenticated
	// (carried a call with a valid token) for this long, and bounds a
	// block-stream hello; negative never closes one.
	AuthTimeout time.Duration
	// MaxStreamsPerConnection bounds the calls in flight on one API
	// connection.
	MaxStreamsPerConnection int
	// StreamRequestTimeout and StreamMinRate (bytes/s) bound a block-stream
	// get or put as a whole: StreamRequestTimeout plus its bytes at
	// StreamMinRate.
	StreamRequestTimeout time.Duration
	StreamMinRate        int64
}

// withDefaults returns l with zero fields set to their defaults, or an
// error naming the first invalid field.
func (l Limits) withDefaults() (Limits, error) {
	if l.MaxKeysPerCall == 0 {
		l.MaxKeysPerCall = DefaultMaxKeysPerCall
	}
	if l.MaxKeyBytes == 0 {
		l.MaxKeyBytes = offload.MaxKeyLen
	}
	if l.MaxMessageBytes == 0 {
		l.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if l.MaxReceiveBytes == 0 {
		l.MaxReceiveBytes = 16 * int64(l.MaxMessageBytes)
	}
	if l.ReceiveTimeout == 0 {
		l.ReceiveTimeout = DefaultReceiveTimeout
	}
	if l.MaxRequests == 0 {
		l.MaxRequests = DefaultMaxRequests
	}
	if l.MaxSessionRequests == 0 {
		l.MaxSessionRequests = max(1, l.MaxRequests/4)
	}
	if l.MaxTenantRequests == 0 {
		l.MaxTenantRequests = max(1, l.MaxRequests/4)
	}
	if l.MaxParamsBytes == 0 {
		l.MaxParamsBytes = DefaultMaxParamsBytes
	}
	if l.MaxWait == 0 {
		l.MaxWait = DefaultMaxWait
	}
	if l.MaxSessionParamsBytes == 0 {
		l.MaxSessionParamsBytes = DefaultMaxSessionParamsBytes
	}
	if l.MaxParamsBytesTotal == 0 {
		l.MaxParamsBytesTotal = DefaultMaxParamsBytesTotal
	}
	if l.RequestIdleTimeout == 0 {
		l.RequestIdleTimeout = DefaultRequestIdleTimeout
	}
	if l.AutoStepInterval == 0 {
		l.AutoStepInterval = DefaultAutoStepInterval
	}
	if l.EngineLookupSettle == 0 {
		l.EngineLookupSettle = DefaultEngineLookupSettle
	}
	if l.MaxConnections == 0 {
		l.MaxConnections = DefaultMaxConnections
	}
	if l.ConnectionIdleTimeout == 0 {
		l.ConnectionIdleTimeout = DefaultConnectionIdleTimeout
	}
	if l.SideChannelTimeout == 0 {
		l.SideChannelTimeout = DefaultSideChannelTimeout
	}
	if l.KeepaliveTime == 0 {
		l.KeepaliveTime = DefaultKeepaliveTime
	}
	if l.AuthTimeout == 0 {
		l.AuthTimeout = DefaultAuthTimeout
	}
	if l.MaxStreamsPerConnection == 0 {
		l.MaxStreamsPerConnection = DefaultMaxStreamsPerConnection
	}
	if l.StreamRequestTimeout == 0 {
		l.StreamRequestTimeout = DefaultStreamRequestTimeout
	}
	if l.StreamMinRate == 0 {
		l.StreamMinRate = DefaultStreamMinRate
	}
	if l.KeepaliveTimeout == 0 {
		l.KeepaliveTimeout = DefaultKeepaliveTimeout
	}
	switch {
	case l.MaxKeysPerCall < 0:
		return l, fmt.Errorf("limits: max_keys_per_call %d: must be positive", l.MaxKeysPerCall)
	case l.MaxKeyBytes <= offload.GroupSuffixLen || l.MaxKeyBytes > offload.MaxKeyLen:
		return l, fmt.Errorf("limits: max_key_bytes %d: want %d..%d", l.MaxKeyBytes, offload.GroupSuffixLen+1, offload.MaxKeyLen)
	case l.MaxMessageBytes < 1<<16:
		return l, fmt.Errorf("limits: max_message_bytes %d: want at least 65536", l.MaxMessageBytes)
	case l.MaxReceiveBytes < int64(l.MaxMessageBytes):
		return l, fmt.Errorf("limits: max_receive_bytes %d: want at least max_message_bytes (%d), or every large call would wait forever", l.MaxReceiveBytes, l.MaxMessageBytes)
	case l.ReceiveTimeout < 0:
		return l, fmt.Errorf("limits: receive_timeout %v: must be positive", l.ReceiveTimeout)
	case l.MaxRequests < 0:
		return l, fmt.Errorf("limits: max_requests %d: must be positive", l.MaxRequests)
	case l.MaxTenantRequests < 0:
		return l, fmt.Errorf("limits: max_tenant_requests %d: must be positive", l.MaxTenantRequests)
	case l.MaxSessionRequests < 0:
		return l, fmt.Errorf("limits: max_session_requests %d: must be positive", l.MaxSessionRequests)
	case l.MaxParamsBytes < 0:
		return l, fmt.Errorf("limits: max_params_bytes %d: must be positive", l.MaxParamsBytes)
	case l.MaxWait < 0:
		return l, fmt.Errorf("limits: max_wait %v: must be positive", l.MaxWait)
	case l.MaxSessionParamsBytes < 0 || l.MaxParamsBytesTotal < 0:
		return l, fmt.Errorf("limits: max_session_params_bytes %d, max_params_bytes_total %d: must be positive", l.MaxSessionParamsBytes, l.MaxParamsBytesTotal)
	case l.RequestIdleTimeout < 0:
		return l, fmt.Errorf("server: request_idle_timeout %v: must be positive", l.RequestIdleTimeout)
	case l.StreamRequestTimeout < 0 || l.StreamMinRate < 0:
		return l, fmt.Errorf("limits: stream_request_timeout %v, stream_min_rate %d: must be positive", l.StreamRequestTimeout, l.StreamMinRate)
	case l.MaxStreamsPerConnection < 0:
		return l, fmt.Errorf("server: max_streams_per_connection %d: must be positive", l.MaxStreamsPerConnection)
	case l.MaxConnections < 0:
		return l, fmt.Errorf("server: max_connections %d: must be positive", l.MaxConnections)
	case l.MaxConnectionsPerPeer < -1:
		return l, fmt.Errorf("server: max_connections_per_peer %d: want a count, or -1 for none", l.MaxConnectionsPerPeer)
	case l.ConnectionIdleTimeout < 0 || l.KeepaliveTime < 0 || l.KeepaliveTimeout < 0:
		return l, fmt.Errorf("server: connection_idle_timeout %v, keepalive_time %v, keepalive_timeout %v: must be positive", l.ConnectionIdleTimeout, l.KeepaliveTime, l.KeepaliveTimeout)
	}
	return l, nil
}
