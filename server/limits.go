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
)

// Limits bound what one client can ask of the daemon (DESIGN.md §7). A zero
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
	// MaxRequests bounds the active requests of one namespace.
	MaxRequests int
	// MaxParamsBytes bounds a kv_transfer_params document.
	MaxParamsBytes int
	// MaxWait caps GetBlocks' wait_ms.
	MaxWait time.Duration
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
	if l.MaxRequests == 0 {
		l.MaxRequests = DefaultMaxRequests
	}
	if l.MaxParamsBytes == 0 {
		l.MaxParamsBytes = DefaultMaxParamsBytes
	}
	if l.MaxWait == 0 {
		l.MaxWait = DefaultMaxWait
	}
	switch {
	case l.MaxKeysPerCall < 0:
		return l, fmt.Errorf("limits: max_keys_per_call %d: must be positive", l.MaxKeysPerCall)
	case l.MaxKeyBytes <= offload.GroupSuffixLen || l.MaxKeyBytes > offload.MaxKeyLen:
		return l, fmt.Errorf("limits: max_key_bytes %d: want %d..%d", l.MaxKeyBytes, offload.GroupSuffixLen+1, offload.MaxKeyLen)
	case l.MaxMessageBytes < 1<<16:
		return l, fmt.Errorf("limits: max_message_bytes %d: want at least 65536", l.MaxMessageBytes)
	case l.MaxRequests < 0:
		return l, fmt.Errorf("limits: max_requests %d: must be positive", l.MaxRequests)
	case l.MaxParamsBytes < 0:
		return l, fmt.Errorf("limits: max_params_bytes %d: must be positive", l.MaxParamsBytes)
	case l.MaxWait < 0:
		return l, fmt.Errorf("limits: max_wait %v: must be positive", l.MaxWait)
	}
	return l, nil
}
