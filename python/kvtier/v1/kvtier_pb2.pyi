from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

ARENA_KIND_ANONYMOUS: ArenaKind
ARENA_KIND_FILE: ArenaKind
ARENA_KIND_MEMFD: ArenaKind
ARENA_KIND_UNSPECIFIED: ArenaKind
DESCRIPTOR: _descriptor.FileDescriptor
LOCALITY_LOCAL: Locality
LOCALITY_REMOTE: Locality
LOCALITY_UNSPECIFIED: Locality
LOOKUP_RESULT_HIT: LookupResult
LOOKUP_RESULT_HIT_PENDING: LookupResult
LOOKUP_RESULT_MISS: LookupResult
LOOKUP_RESULT_RETRY: LookupResult
LOOKUP_RESULT_UNSPECIFIED: LookupResult
MEDIUM_CPU: Medium
MEDIUM_STORAGE: Medium
MEDIUM_UNSPECIFIED: Medium
OFFLOAD_POLICY_BLOCK_LEVEL: OffloadPolicy
OFFLOAD_POLICY_REQUEST_LEVEL: OffloadPolicy
PUT_STATUS_ALREADY_PRESENT: PutStatus
PUT_STATUS_STORED: PutStatus
PUT_STATUS_UNSPECIFIED: PutStatus
REGION_FOUND_HIT: RegionFound
REGION_FOUND_MISS: RegionFound
REGION_FOUND_UNKNOWN: RegionFound

class Block(_message.Message):
    __slots__ = ["data", "key", "metadata"]
    DATA_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    key: bytes
    metadata: BlockMetadata
    def __init__(self, key: _Optional[bytes] = ..., data: _Optional[bytes] = ..., metadata: _Optional[_Union[BlockMetadata, _Mapping]] = ...) -> None: ...

class BlockMetadata(_message.Message):
    __slots__ = ["block_hashes", "block_size", "kv_cache_spec_kind", "kv_cache_spec_sliding_window", "lora_id", "lora_name", "parent_block_hash", "token_ids"]
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_SPEC_KIND_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_SPEC_SLIDING_WINDOW_FIELD_NUMBER: _ClassVar[int]
    LORA_ID_FIELD_NUMBER: _ClassVar[int]
    LORA_NAME_FIELD_NUMBER: _ClassVar[int]
    PARENT_BLOCK_HASH_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    block_hashes: _containers.RepeatedScalarFieldContainer[bytes]
    block_size: int
    kv_cache_spec_kind: str
    kv_cache_spec_sliding_window: int
    lora_id: int
    lora_name: str
    parent_block_hash: bytes
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, block_hashes: _Optional[_Iterable[bytes]] = ..., parent_block_hash: _Optional[bytes] = ..., token_ids: _Optional[_Iterable[int]] = ..., block_size: _Optional[int] = ..., lora_id: _Optional[int] = ..., lora_name: _Optional[str] = ..., kv_cache_spec_kind: _Optional[str] = ..., kv_cache_spec_sliding_window: _Optional[int] = ...) -> None: ...

class CompleteLoadRequest(_message.Message):
    __slots__ = ["key_size", "keys", "namespace", "packed_keys", "request_id"]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    KEY_SIZE_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    PACKED_KEYS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    key_size: int
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    namespace: str
    packed_keys: bytes
    request_id: str
    def __init__(self, namespace: _Optional[str] = ..., request_id: _Optional[str] = ..., keys: _Optional[_Iterable[bytes]] = ..., packed_keys: _Optional[bytes] = ..., key_size: _Optional[int] = ...) -> None: ...

class CompleteLoadResponse(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class CompleteStoreRequest(_message.Message):
    __slots__ = ["key_size", "keys", "namespace", "packed_keys", "request_id", "success"]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    KEY_SIZE_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    PACKED_KEYS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    key_size: int
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    namespace: str
    packed_keys: bytes
    request_id: str
    success: bool
    def __init__(self, namespace: _Optional[str] = ..., request_id: _Optional[str] = ..., keys: _Optional[_Iterable[bytes]] = ..., success: bool = ..., packed_keys: _Optional[bytes] = ..., key_size: _Optional[int] = ...) -> None: ...

class CompleteStoreResponse(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class DeleteRequest(_message.Message):
    __slots__ = ["all", "key_size", "keys", "namespace", "packed_keys", "tenant"]
    ALL_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    KEY_SIZE_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    PACKED_KEYS_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    all: bool
    key_size: int
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    namespace: str
    packed_keys: bytes
    tenant: str
    def __init__(self, namespace: _Optional[str] = ..., keys: _Optional[_Iterable[bytes]] = ..., packed_keys: _Optional[bytes] = ..., key_size: _Optional[int] = ..., all: bool = ..., tenant: _Optional[str] = ...) -> None: ...

class DeleteResponse(_message.Message):
    __slots__ = ["held", "primary", "tiers"]
    HELD_FIELD_NUMBER: _ClassVar[int]
    PRIMARY_FIELD_NUMBER: _ClassVar[int]
    TIERS_FIELD_NUMBER: _ClassVar[int]
    held: int
    primary: int
    tiers: _containers.RepeatedCompositeFieldContainer[TierDeleteResult]
    def __init__(self, primary: _Optional[int] = ..., held: _Optional[int] = ..., tiers: _Optional[_Iterable[_Union[TierDeleteResult, _Mapping]]] = ...) -> None: ...

class EngineAttachRequest(_message.Message):
    __slots__ = ["layout"]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    layout: str
    def __init__(self, layout: _Optional[str] = ...) -> None: ...

class EngineAttachResponse(_message.Message):
    __slots__ = ["epoch", "fd_socket", "namespace", "num_slots", "slot_size", "ticket"]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    FD_SOCKET_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NUM_SLOTS_FIELD_NUMBER: _ClassVar[int]
    SLOT_SIZE_FIELD_NUMBER: _ClassVar[int]
    TICKET_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    fd_socket: str
    namespace: str
    num_slots: int
    slot_size: int
    ticket: str
    def __init__(self, namespace: _Optional[str] = ..., slot_size: _Optional[int] = ..., num_slots: _Optional[int] = ..., fd_socket: _Optional[str] = ..., epoch: _Optional[int] = ..., ticket: _Optional[str] = ...) -> None: ...

class EngineKeys(_message.Message):
    __slots__ = ["key_size", "packed_keys", "request_id"]
    KEY_SIZE_FIELD_NUMBER: _ClassVar[int]
    PACKED_KEYS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    key_size: int
    packed_keys: bytes
    request_id: str
    def __init__(self, request_id: _Optional[str] = ..., packed_keys: _Optional[bytes] = ..., key_size: _Optional[int] = ...) -> None: ...

class EngineLookupResult(_message.Message):
    __slots__ = ["found", "request_id", "slots"]
    FOUND_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    found: bytes
    request_id: str
    slots: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, request_id: _Optional[str] = ..., found: _Optional[bytes] = ..., slots: _Optional[_Iterable[int]] = ...) -> None: ...

class EngineNewRequest(_message.Message):
    __slots__ = ["kv_transfer_params", "request_id"]
    KV_TRANSFER_PARAMS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    kv_transfer_params: str
    request_id: str
    def __init__(self, request_id: _Optional[str] = ..., kv_transfer_params: _Optional[str] = ...) -> None: ...

class EngineReserveRequest(_message.Message):
    __slots__ = ["epoch", "free_slots", "key_size", "more_slots", "namespace", "packed_keys"]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    FREE_SLOTS_FIELD_NUMBER: _ClassVar[int]
    KEY_SIZE_FIELD_NUMBER: _ClassVar[int]
    MORE_SLOTS_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    PACKED_KEYS_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    free_slots: int
    key_size: int
    more_slots: int
    namespace: str
    packed_keys: bytes
    def __init__(self, namespace: _Optional[str] = ..., epoch: _Optional[int] = ..., packed_keys: _Optional[bytes] = ..., key_size: _Optional[int] = ..., more_slots: _Optional[int] = ..., free_slots: _Optional[int] = ...) -> None: ...

class EngineReserveResponse(_message.Message):
    __slots__ = ["found", "granted_slots"]
    FOUND_FIELD_NUMBER: _ClassVar[int]
    GRANTED_SLOTS_FIELD_NUMBER: _ClassVar[int]
    found: bytes
    granted_slots: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, found: _Optional[bytes] = ..., granted_slots: _Optional[_Iterable[int]] = ...) -> None: ...

class EngineStepRequest(_message.Message):
    __slots__ = ["epoch", "finished_request_ids", "keep_events", "lookups", "namespace", "new_requests", "preempted_request_ids", "reset_cache", "return_slots", "scheduled_request_ids", "stores", "touches", "unpins", "want_free_slots"]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    FINISHED_REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    KEEP_EVENTS_FIELD_NUMBER: _ClassVar[int]
    LOOKUPS_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NEW_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    PREEMPTED_REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    RESET_CACHE_FIELD_NUMBER: _ClassVar[int]
    RETURN_SLOTS_FIELD_NUMBER: _ClassVar[int]
    SCHEDULED_REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    STORES_FIELD_NUMBER: _ClassVar[int]
    TOUCHES_FIELD_NUMBER: _ClassVar[int]
    UNPINS_FIELD_NUMBER: _ClassVar[int]
    WANT_FREE_SLOTS_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    finished_request_ids: _containers.RepeatedScalarFieldContainer[str]
    keep_events: bool
    lookups: _containers.RepeatedCompositeFieldContainer[EngineKeys]
    namespace: str
    new_requests: _containers.RepeatedCompositeFieldContainer[EngineNewRequest]
    preempted_request_ids: _containers.RepeatedScalarFieldContainer[str]
    reset_cache: bool
    return_slots: _containers.RepeatedScalarFieldContainer[int]
    scheduled_request_ids: _containers.RepeatedScalarFieldContainer[str]
    stores: _containers.RepeatedCompositeFieldContainer[EngineStore]
    touches: _containers.RepeatedCompositeFieldContainer[EngineKeys]
    unpins: _containers.RepeatedCompositeFieldContainer[EngineKeys]
    want_free_slots: int
    def __init__(self, namespace: _Optional[str] = ..., new_requests: _Optional[_Iterable[_Union[EngineNewRequest, _Mapping]]] = ..., unpins: _Optional[_Iterable[_Union[EngineKeys, _Mapping]]] = ..., stores: _Optional[_Iterable[_Union[EngineStore, _Mapping]]] = ..., touches: _Optional[_Iterable[_Union[EngineKeys, _Mapping]]] = ..., lookups: _Optional[_Iterable[_Union[EngineKeys, _Mapping]]] = ..., finished_request_ids: _Optional[_Iterable[str]] = ..., return_slots: _Optional[_Iterable[int]] = ..., want_free_slots: _Optional[int] = ..., reset_cache: bool = ..., scheduled_request_ids: _Optional[_Iterable[str]] = ..., preempted_request_ids: _Optional[_Iterable[str]] = ..., epoch: _Optional[int] = ..., keep_events: bool = ...) -> None: ...

class EngineStepResponse(_message.Message):
    __slots__ = ["events", "granted_slots", "lookups", "warnings"]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    GRANTED_SLOTS_FIELD_NUMBER: _ClassVar[int]
    LOOKUPS_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[RegionEvent]
    granted_slots: _containers.RepeatedScalarFieldContainer[int]
    lookups: _containers.RepeatedCompositeFieldContainer[EngineLookupResult]
    warnings: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, lookups: _Optional[_Iterable[_Union[EngineLookupResult, _Mapping]]] = ..., granted_slots: _Optional[_Iterable[int]] = ..., events: _Optional[_Iterable[_Union[RegionEvent, _Mapping]]] = ..., warnings: _Optional[_Iterable[str]] = ...) -> None: ...

class EngineStore(_message.Message):
    __slots__ = ["key_size", "packed_keys", "request_id", "slots", "success"]
    KEY_SIZE_FIELD_NUMBER: _ClassVar[int]
    PACKED_KEYS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    key_size: int
    packed_keys: bytes
    request_id: str
    slots: _containers.RepeatedScalarFieldContainer[int]
    success: bool
    def __init__(self, request_id: _Optional[str] = ..., packed_keys: _Optional[bytes] = ..., key_size: _Optional[int] = ..., slots: _Optional[_Iterable[int]] = ..., success: bool = ...) -> None: ...

class ExplainRequest(_message.Message):
    __slots__ = ["kv_transfer_params", "namespace"]
    KV_TRANSFER_PARAMS_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    kv_transfer_params: str
    namespace: str
    def __init__(self, namespace: _Optional[str] = ..., kv_transfer_params: _Optional[str] = ...) -> None: ...

class ExplainResponse(_message.Message):
    __slots__ = ["load_filter", "load_from_request", "store_filter", "store_from_request", "strict_error", "tiers", "validation_mode", "warnings"]
    LOAD_FILTER_FIELD_NUMBER: _ClassVar[int]
    LOAD_FROM_REQUEST_FIELD_NUMBER: _ClassVar[int]
    STORE_FILTER_FIELD_NUMBER: _ClassVar[int]
    STORE_FROM_REQUEST_FIELD_NUMBER: _ClassVar[int]
    STRICT_ERROR_FIELD_NUMBER: _ClassVar[int]
    TIERS_FIELD_NUMBER: _ClassVar[int]
    VALIDATION_MODE_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    load_filter: TierFilter
    load_from_request: bool
    store_filter: TierFilter
    store_from_request: bool
    strict_error: str
    tiers: _containers.RepeatedCompositeFieldContainer[TierDecision]
    validation_mode: str
    warnings: _containers.RepeatedCompositeFieldContainer[FilterWarning]
    def __init__(self, load_filter: _Optional[_Union[TierFilter, _Mapping]] = ..., store_filter: _Optional[_Union[TierFilter, _Mapping]] = ..., load_from_request: bool = ..., store_from_request: bool = ..., warnings: _Optional[_Iterable[_Union[FilterWarning, _Mapping]]] = ..., tiers: _Optional[_Iterable[_Union[TierDecision, _Mapping]]] = ..., strict_error: _Optional[str] = ..., validation_mode: _Optional[str] = ...) -> None: ...

class FilterWarning(_message.Message):
    __slots__ = ["entry", "field", "message", "reason", "value"]
    ENTRY_FIELD_NUMBER: _ClassVar[int]
    FIELD_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    entry: int
    field: str
    message: str
    reason: str
    value: str
    def __init__(self, field: _Optional[str] = ..., reason: _Optional[str] = ..., entry: _Optional[int] = ..., value: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class FinishRequestRequest(_message.Message):
    __slots__ = ["namespace", "request_id"]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    request_id: str
    def __init__(self, namespace: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class FinishRequestResponse(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class GetArenaRequest(_message.Message):
    __slots__ = ["namespace"]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    def __init__(self, namespace: _Optional[str] = ...) -> None: ...

class GetArenaResponse(_message.Message):
    __slots__ = ["fd_socket", "kind", "num_slots", "path", "size", "slot_size", "ticket"]
    FD_SOCKET_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    NUM_SLOTS_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    SLOT_SIZE_FIELD_NUMBER: _ClassVar[int]
    TICKET_FIELD_NUMBER: _ClassVar[int]
    fd_socket: str
    kind: ArenaKind
    num_slots: int
    path: str
    size: int
    slot_size: int
    ticket: str
    def __init__(self, kind: _Optional[_Union[ArenaKind, str]] = ..., slot_size: _Optional[int] = ..., num_slots: _Optional[int] = ..., size: _Optional[int] = ..., path: _Optional[str] = ..., fd_socket: _Optional[str] = ..., ticket: _Optional[str] = ...) -> None: ...

class GetBlocksRequest(_message.Message):
    __slots__ = ["keys", "kv_transfer_params", "namespace", "prefix_only", "request_id", "wait_ms", "want_checksums"]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    KV_TRANSFER_PARAMS_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    PREFIX_ONLY_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    WANT_CHECKSUMS_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    kv_transfer_params: str
    namespace: str
    prefix_only: bool
    request_id: str
    wait_ms: int
    want_checksums: bool
    def __init__(self, namespace: _Optional[str] = ..., request_id: _Optional[str] = ..., kv_transfer_params: _Optional[str] = ..., keys: _Optional[_Iterable[bytes]] = ..., wait_ms: _Optional[int] = ..., prefix_only: bool = ..., want_checksums: bool = ...) -> None: ...

class GetBlocksResponse(_message.Message):
    __slots__ = ["blocks", "checksums", "hits", "results"]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    CHECKSUMS_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    blocks: _containers.RepeatedCompositeFieldContainer[Block]
    checksums: _containers.RepeatedScalarFieldContainer[int]
    hits: int
    results: _containers.RepeatedScalarFieldContainer[LookupResult]
    def __init__(self, blocks: _Optional[_Iterable[_Union[Block, _Mapping]]] = ..., results: _Optional[_Iterable[_Union[LookupResult, str]]] = ..., hits: _Optional[int] = ..., checksums: _Optional[_Iterable[int]] = ...) -> None: ...

class ListBlocksRequest(_message.Message):
    __slots__ = ["cursor", "limit", "namespace"]
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    cursor: int
    limit: int
    namespace: str
    def __init__(self, namespace: _Optional[str] = ..., cursor: _Optional[int] = ..., limit: _Optional[int] = ...) -> None: ...

class ListBlocksResponse(_message.Message):
    __slots__ = ["events_cpu_medium", "events_next_seq", "events_port", "events_replay_port", "events_topic", "keys", "next_cursor"]
    EVENTS_CPU_MEDIUM_FIELD_NUMBER: _ClassVar[int]
    EVENTS_NEXT_SEQ_FIELD_NUMBER: _ClassVar[int]
    EVENTS_PORT_FIELD_NUMBER: _ClassVar[int]
    EVENTS_REPLAY_PORT_FIELD_NUMBER: _ClassVar[int]
    EVENTS_TOPIC_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    NEXT_CURSOR_FIELD_NUMBER: _ClassVar[int]
    events_cpu_medium: str
    events_next_seq: int
    events_port: int
    events_replay_port: int
    events_topic: str
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    next_cursor: int
    def __init__(self, keys: _Optional[_Iterable[bytes]] = ..., next_cursor: _Optional[int] = ..., events_next_seq: _Optional[int] = ..., events_port: _Optional[int] = ..., events_replay_port: _Optional[int] = ..., events_topic: _Optional[str] = ..., events_cpu_medium: _Optional[str] = ...) -> None: ...

class LookupRequest(_message.Message):
    __slots__ = ["key_size", "keys", "namespace", "packed_keys", "prefix_scan", "request_id", "want_sources"]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    KEY_SIZE_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    PACKED_KEYS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_SCAN_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    WANT_SOURCES_FIELD_NUMBER: _ClassVar[int]
    key_size: int
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    namespace: str
    packed_keys: bytes
    prefix_scan: bool
    request_id: str
    want_sources: bool
    def __init__(self, namespace: _Optional[str] = ..., request_id: _Optional[str] = ..., keys: _Optional[_Iterable[bytes]] = ..., prefix_scan: bool = ..., packed_keys: _Optional[bytes] = ..., key_size: _Optional[int] = ..., want_sources: bool = ...) -> None: ...

class LookupResponse(_message.Message):
    __slots__ = ["hits", "results", "sources"]
    HITS_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    SOURCES_FIELD_NUMBER: _ClassVar[int]
    hits: int
    results: _containers.RepeatedScalarFieldContainer[LookupResult]
    sources: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, results: _Optional[_Iterable[_Union[LookupResult, str]]] = ..., hits: _Optional[int] = ..., sources: _Optional[_Iterable[str]] = ...) -> None: ...

class NewRequestRequest(_message.Message):
    __slots__ = ["kv_transfer_params", "namespace", "request_id"]
    KV_TRANSFER_PARAMS_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    kv_transfer_params: str
    namespace: str
    request_id: str
    def __init__(self, namespace: _Optional[str] = ..., request_id: _Optional[str] = ..., kv_transfer_params: _Optional[str] = ...) -> None: ...

class NewRequestResponse(_message.Message):
    __slots__ = ["load_filter", "load_from_request", "policy", "store_filter", "store_from_request", "warnings"]
    LOAD_FILTER_FIELD_NUMBER: _ClassVar[int]
    LOAD_FROM_REQUEST_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    STORE_FILTER_FIELD_NUMBER: _ClassVar[int]
    STORE_FROM_REQUEST_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    load_filter: TierFilter
    load_from_request: bool
    policy: OffloadPolicy
    store_filter: TierFilter
    store_from_request: bool
    warnings: _containers.RepeatedCompositeFieldContainer[FilterWarning]
    def __init__(self, policy: _Optional[_Union[OffloadPolicy, str]] = ..., load_filter: _Optional[_Union[TierFilter, _Mapping]] = ..., store_filter: _Optional[_Union[TierFilter, _Mapping]] = ..., load_from_request: bool = ..., store_from_request: bool = ..., warnings: _Optional[_Iterable[_Union[FilterWarning, _Mapping]]] = ...) -> None: ...

class PinRequest(_message.Message):
    __slots__ = ["key_size", "keys", "namespace", "packed_keys", "ttl_ms"]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    KEY_SIZE_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    PACKED_KEYS_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    key_size: int
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    namespace: str
    packed_keys: bytes
    ttl_ms: int
    def __init__(self, namespace: _Optional[str] = ..., keys: _Optional[_Iterable[bytes]] = ..., packed_keys: _Optional[bytes] = ..., key_size: _Optional[int] = ..., ttl_ms: _Optional[int] = ...) -> None: ...

class PinResponse(_message.Message):
    __slots__ = ["missing", "pinned", "refused"]
    MISSING_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    missing: int
    pinned: int
    refused: int
    def __init__(self, pinned: _Optional[int] = ..., missing: _Optional[int] = ..., refused: _Optional[int] = ...) -> None: ...

class PrefetchRequest(_message.Message):
    __slots__ = ["deadline_ms", "key_size", "keys", "kv_transfer_params", "namespace", "packed_keys"]
    DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    KEY_SIZE_FIELD_NUMBER: _ClassVar[int]
    KV_TRANSFER_PARAMS_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    PACKED_KEYS_FIELD_NUMBER: _ClassVar[int]
    deadline_ms: int
    key_size: int
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    kv_transfer_params: str
    namespace: str
    packed_keys: bytes
    def __init__(self, namespace: _Optional[str] = ..., keys: _Optional[_Iterable[bytes]] = ..., packed_keys: _Optional[bytes] = ..., key_size: _Optional[int] = ..., kv_transfer_params: _Optional[str] = ..., deadline_ms: _Optional[int] = ...) -> None: ...

class PrefetchResponse(_message.Message):
    __slots__ = ["present", "queued", "started", "warnings"]
    PRESENT_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    STARTED_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    present: int
    queued: bool
    started: int
    warnings: _containers.RepeatedCompositeFieldContainer[FilterWarning]
    def __init__(self, present: _Optional[int] = ..., started: _Optional[int] = ..., queued: bool = ..., warnings: _Optional[_Iterable[_Union[FilterWarning, _Mapping]]] = ...) -> None: ...

class PrepareLoadRequest(_message.Message):
    __slots__ = ["allow_missing", "key_size", "keys", "namespace", "packed_keys", "request_id"]
    ALLOW_MISSING_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    KEY_SIZE_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    PACKED_KEYS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    allow_missing: bool
    key_size: int
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    namespace: str
    packed_keys: bytes
    request_id: str
    def __init__(self, namespace: _Optional[str] = ..., request_id: _Optional[str] = ..., keys: _Optional[_Iterable[bytes]] = ..., packed_keys: _Optional[bytes] = ..., key_size: _Optional[int] = ..., allow_missing: bool = ...) -> None: ...

class PrepareLoadResponse(_message.Message):
    __slots__ = ["missing", "slots"]
    MISSING_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    missing: int
    slots: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, slots: _Optional[_Iterable[int]] = ..., missing: _Optional[int] = ...) -> None: ...

class PrepareStoreRequest(_message.Message):
    __slots__ = ["key_size", "keys", "metadata", "namespace", "packed_keys", "request_id"]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    KEY_SIZE_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    PACKED_KEYS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    key_size: int
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    metadata: _containers.RepeatedCompositeFieldContainer[BlockMetadata]
    namespace: str
    packed_keys: bytes
    request_id: str
    def __init__(self, namespace: _Optional[str] = ..., request_id: _Optional[str] = ..., keys: _Optional[_Iterable[bytes]] = ..., metadata: _Optional[_Iterable[_Union[BlockMetadata, _Mapping]]] = ..., packed_keys: _Optional[bytes] = ..., key_size: _Optional[int] = ...) -> None: ...

class PrepareStoreResponse(_message.Message):
    __slots__ = ["evicted", "keys_to_store", "ok", "slots"]
    EVICTED_FIELD_NUMBER: _ClassVar[int]
    KEYS_TO_STORE_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    evicted: _containers.RepeatedScalarFieldContainer[bytes]
    keys_to_store: _containers.RepeatedScalarFieldContainer[bytes]
    ok: bool
    slots: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ok: bool = ..., keys_to_store: _Optional[_Iterable[bytes]] = ..., slots: _Optional[_Iterable[int]] = ..., evicted: _Optional[_Iterable[bytes]] = ...) -> None: ...

class PrimaryStats(_message.Message):
    __slots__ = ["evictions", "hits", "leased_slots", "lookups", "misses", "num_slots", "pending_slots", "pinned_slots", "revocable_slots", "slot_size", "stores_rejected", "used_slots"]
    EVICTIONS_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    LEASED_SLOTS_FIELD_NUMBER: _ClassVar[int]
    LOOKUPS_FIELD_NUMBER: _ClassVar[int]
    MISSES_FIELD_NUMBER: _ClassVar[int]
    NUM_SLOTS_FIELD_NUMBER: _ClassVar[int]
    PENDING_SLOTS_FIELD_NUMBER: _ClassVar[int]
    PINNED_SLOTS_FIELD_NUMBER: _ClassVar[int]
    REVOCABLE_SLOTS_FIELD_NUMBER: _ClassVar[int]
    SLOT_SIZE_FIELD_NUMBER: _ClassVar[int]
    STORES_REJECTED_FIELD_NUMBER: _ClassVar[int]
    USED_SLOTS_FIELD_NUMBER: _ClassVar[int]
    evictions: int
    hits: int
    leased_slots: int
    lookups: int
    misses: int
    num_slots: int
    pending_slots: int
    pinned_slots: int
    revocable_slots: int
    slot_size: int
    stores_rejected: int
    used_slots: int
    def __init__(self, slot_size: _Optional[int] = ..., num_slots: _Optional[int] = ..., used_slots: _Optional[int] = ..., pending_slots: _Optional[int] = ..., pinned_slots: _Optional[int] = ..., lookups: _Optional[int] = ..., hits: _Optional[int] = ..., misses: _Optional[int] = ..., evictions: _Optional[int] = ..., stores_rejected: _Optional[int] = ..., revocable_slots: _Optional[int] = ..., leased_slots: _Optional[int] = ...) -> None: ...

class PutBlocksRequest(_message.Message):
    __slots__ = ["blocks", "kv_transfer_params", "namespace", "request_id"]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    KV_TRANSFER_PARAMS_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    blocks: _containers.RepeatedCompositeFieldContainer[Block]
    kv_transfer_params: str
    namespace: str
    request_id: str
    def __init__(self, namespace: _Optional[str] = ..., request_id: _Optional[str] = ..., kv_transfer_params: _Optional[str] = ..., blocks: _Optional[_Iterable[_Union[Block, _Mapping]]] = ...) -> None: ...

class PutBlocksResponse(_message.Message):
    __slots__ = ["evicted", "statuses"]
    EVICTED_FIELD_NUMBER: _ClassVar[int]
    STATUSES_FIELD_NUMBER: _ClassVar[int]
    evicted: _containers.RepeatedScalarFieldContainer[bytes]
    statuses: _containers.RepeatedScalarFieldContainer[PutStatus]
    def __init__(self, statuses: _Optional[_Iterable[_Union[PutStatus, str]]] = ..., evicted: _Optional[_Iterable[bytes]] = ...) -> None: ...

class RegionDrainRequest(_message.Message):
    __slots__ = ["region_id", "timeout_ms"]
    REGION_ID_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    region_id: str
    timeout_ms: int
    def __init__(self, region_id: _Optional[str] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class RegionDrainResponse(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class RegionEvent(_message.Message):
    __slots__ = ["key_size", "locality", "medium", "packed_keys", "removed", "tier"]
    KEY_SIZE_FIELD_NUMBER: _ClassVar[int]
    LOCALITY_FIELD_NUMBER: _ClassVar[int]
    MEDIUM_FIELD_NUMBER: _ClassVar[int]
    PACKED_KEYS_FIELD_NUMBER: _ClassVar[int]
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    key_size: int
    locality: Locality
    medium: Medium
    packed_keys: bytes
    removed: bool
    tier: str
    def __init__(self, packed_keys: _Optional[bytes] = ..., key_size: _Optional[int] = ..., medium: _Optional[_Union[Medium, str]] = ..., locality: _Optional[_Union[Locality, str]] = ..., removed: bool = ..., tier: _Optional[str] = ...) -> None: ...

class RegionJob(_message.Message):
    __slots__ = ["job_id", "key_size", "kv_transfer_params", "packed_keys", "promotion", "request_id", "slots"]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_SIZE_FIELD_NUMBER: _ClassVar[int]
    KV_TRANSFER_PARAMS_FIELD_NUMBER: _ClassVar[int]
    PACKED_KEYS_FIELD_NUMBER: _ClassVar[int]
    PROMOTION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    key_size: int
    kv_transfer_params: str
    packed_keys: bytes
    promotion: bool
    request_id: str
    slots: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, job_id: _Optional[int] = ..., request_id: _Optional[str] = ..., kv_transfer_params: _Optional[str] = ..., promotion: bool = ..., packed_keys: _Optional[bytes] = ..., key_size: _Optional[int] = ..., slots: _Optional[_Iterable[int]] = ...) -> None: ...

class RegionJobResult(_message.Message):
    __slots__ = ["job_id", "success", "successful_indexes"]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    SUCCESSFUL_INDEXES_FIELD_NUMBER: _ClassVar[int]
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    success: bool
    successful_indexes: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, job_id: _Optional[int] = ..., success: bool = ..., successful_indexes: _Optional[_Iterable[int]] = ...) -> None: ...

class RegionLookupRequest(_message.Message):
    __slots__ = ["key_size", "kv_transfer_params", "packed_keys", "region_id", "request_id", "wait_us"]
    KEY_SIZE_FIELD_NUMBER: _ClassVar[int]
    KV_TRANSFER_PARAMS_FIELD_NUMBER: _ClassVar[int]
    PACKED_KEYS_FIELD_NUMBER: _ClassVar[int]
    REGION_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    WAIT_US_FIELD_NUMBER: _ClassVar[int]
    key_size: int
    kv_transfer_params: str
    packed_keys: bytes
    region_id: str
    request_id: str
    wait_us: int
    def __init__(self, region_id: _Optional[str] = ..., request_id: _Optional[str] = ..., kv_transfer_params: _Optional[str] = ..., packed_keys: _Optional[bytes] = ..., key_size: _Optional[int] = ..., wait_us: _Optional[int] = ...) -> None: ...

class RegionLookupResponse(_message.Message):
    __slots__ = ["error", "found"]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    FOUND_FIELD_NUMBER: _ClassVar[int]
    error: str
    found: bytes
    def __init__(self, found: _Optional[bytes] = ..., error: _Optional[str] = ...) -> None: ...

class RegionLookupsRequest(_message.Message):
    __slots__ = ["lookups", "region_id"]
    LOOKUPS_FIELD_NUMBER: _ClassVar[int]
    REGION_ID_FIELD_NUMBER: _ClassVar[int]
    lookups: _containers.RepeatedCompositeFieldContainer[RegionLookupRequest]
    region_id: str
    def __init__(self, region_id: _Optional[str] = ..., lookups: _Optional[_Iterable[_Union[RegionLookupRequest, _Mapping]]] = ...) -> None: ...

class RegionLookupsResponse(_message.Message):
    __slots__ = ["lookups"]
    LOOKUPS_FIELD_NUMBER: _ClassVar[int]
    lookups: _containers.RepeatedCompositeFieldContainer[RegionLookupResponse]
    def __init__(self, lookups: _Optional[_Iterable[_Union[RegionLookupResponse, _Mapping]]] = ...) -> None: ...

class RegionRegistration(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class RegionResultsRequest(_message.Message):
    __slots__ = ["region_id"]
    REGION_ID_FIELD_NUMBER: _ClassVar[int]
    region_id: str
    def __init__(self, region_id: _Optional[str] = ...) -> None: ...

class RegionResultsResponse(_message.Message):
    __slots__ = ["results"]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[RegionJobResult]
    def __init__(self, results: _Optional[_Iterable[_Union[RegionJobResult, _Mapping]]] = ...) -> None: ...

class RegionStepRequest(_message.Message):
    __slots__ = ["finished_request_ids", "region_id", "touches"]
    FINISHED_REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    REGION_ID_FIELD_NUMBER: _ClassVar[int]
    TOUCHES_FIELD_NUMBER: _ClassVar[int]
    finished_request_ids: _containers.RepeatedScalarFieldContainer[str]
    region_id: str
    touches: _containers.RepeatedCompositeFieldContainer[RegionTouch]
    def __init__(self, region_id: _Optional[str] = ..., finished_request_ids: _Optional[_Iterable[str]] = ..., touches: _Optional[_Iterable[_Union[RegionTouch, _Mapping]]] = ...) -> None: ...

class RegionStepResponse(_message.Message):
    __slots__ = ["events"]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[RegionEvent]
    def __init__(self, events: _Optional[_Iterable[_Union[RegionEvent, _Mapping]]] = ...) -> None: ...

class RegionSubmitRequest(_message.Message):
    __slots__ = ["jobs", "region_id"]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    REGION_ID_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[RegionJob]
    region_id: str
    def __init__(self, region_id: _Optional[str] = ..., jobs: _Optional[_Iterable[_Union[RegionJob, _Mapping]]] = ...) -> None: ...

class RegionSubmitResponse(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class RegionTouch(_message.Message):
    __slots__ = ["key_size", "packed_keys", "request_id"]
    KEY_SIZE_FIELD_NUMBER: _ClassVar[int]
    PACKED_KEYS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    key_size: int
    packed_keys: bytes
    request_id: str
    def __init__(self, request_id: _Optional[str] = ..., packed_keys: _Optional[bytes] = ..., key_size: _Optional[int] = ...) -> None: ...

class ResetRequest(_message.Message):
    __slots__ = ["namespace"]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    def __init__(self, namespace: _Optional[str] = ...) -> None: ...

class ResetResponse(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class ResidencyRequest(_message.Message):
    __slots__ = ["key_size", "keys", "kv_transfer_params", "namespace", "packed_keys"]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    KEY_SIZE_FIELD_NUMBER: _ClassVar[int]
    KV_TRANSFER_PARAMS_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    PACKED_KEYS_FIELD_NUMBER: _ClassVar[int]
    key_size: int
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    kv_transfer_params: str
    namespace: str
    packed_keys: bytes
    def __init__(self, namespace: _Optional[str] = ..., keys: _Optional[_Iterable[bytes]] = ..., packed_keys: _Optional[bytes] = ..., key_size: _Optional[int] = ..., kv_transfer_params: _Optional[str] = ...) -> None: ...

class ResidencyResponse(_message.Message):
    __slots__ = ["loadable", "primary", "tiers", "warnings"]
    LOADABLE_FIELD_NUMBER: _ClassVar[int]
    PRIMARY_FIELD_NUMBER: _ClassVar[int]
    TIERS_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    loadable: int
    primary: int
    tiers: _containers.RepeatedCompositeFieldContainer[TierResidency]
    warnings: _containers.RepeatedCompositeFieldContainer[FilterWarning]
    def __init__(self, primary: _Optional[int] = ..., tiers: _Optional[_Iterable[_Union[TierResidency, _Mapping]]] = ..., loadable: _Optional[int] = ..., warnings: _Optional[_Iterable[_Union[FilterWarning, _Mapping]]] = ...) -> None: ...

class ScheduleEndRequest(_message.Message):
    __slots__ = ["namespace", "new_request_ids", "preempted_request_ids"]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NEW_REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    PREEMPTED_REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    new_request_ids: _containers.RepeatedScalarFieldContainer[str]
    preempted_request_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, namespace: _Optional[str] = ..., new_request_ids: _Optional[_Iterable[str]] = ..., preempted_request_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class ScheduleEndResponse(_message.Message):
    __slots__ = ["events_published", "has_pending_work"]
    EVENTS_PUBLISHED_FIELD_NUMBER: _ClassVar[int]
    HAS_PENDING_WORK_FIELD_NUMBER: _ClassVar[int]
    events_published: int
    has_pending_work: bool
    def __init__(self, has_pending_work: bool = ..., events_published: _Optional[int] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ["namespace"]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    def __init__(self, namespace: _Optional[str] = ...) -> None: ...

class StatsResponse(_message.Message):
    __slots__ = ["active_requests", "auto_steps", "cascade_pin_budget", "cascade_pinned_slots", "cascade_revocations", "expired_requests", "namespace", "primary", "released_requests", "router_pinned_blocks", "sessions", "stream_addr", "tenants", "tiers"]
    ACTIVE_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    AUTO_STEPS_FIELD_NUMBER: _ClassVar[int]
    CASCADE_PINNED_SLOTS_FIELD_NUMBER: _ClassVar[int]
    CASCADE_PIN_BUDGET_FIELD_NUMBER: _ClassVar[int]
    CASCADE_REVOCATIONS_FIELD_NUMBER: _ClassVar[int]
    EXPIRED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    PRIMARY_FIELD_NUMBER: _ClassVar[int]
    RELEASED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    ROUTER_PINNED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    STREAM_ADDR_FIELD_NUMBER: _ClassVar[int]
    TENANTS_FIELD_NUMBER: _ClassVar[int]
    TIERS_FIELD_NUMBER: _ClassVar[int]
    active_requests: int
    auto_steps: int
    cascade_pin_budget: int
    cascade_pinned_slots: int
    cascade_revocations: int
    expired_requests: int
    namespace: str
    primary: PrimaryStats
    released_requests: int
    router_pinned_blocks: int
    sessions: int
    stream_addr: str
    tenants: _containers.RepeatedCompositeFieldContainer[TenantStats]
    tiers: _containers.RepeatedCompositeFieldContainer[TierStats]
    def __init__(self, namespace: _Optional[str] = ..., primary: _Optional[_Union[PrimaryStats, _Mapping]] = ..., tiers: _Optional[_Iterable[_Union[TierStats, _Mapping]]] = ..., active_requests: _Optional[int] = ..., cascade_pinned_slots: _Optional[int] = ..., cascade_pin_budget: _Optional[int] = ..., cascade_revocations: _Optional[int] = ..., sessions: _Optional[int] = ..., expired_requests: _Optional[int] = ..., released_requests: _Optional[int] = ..., auto_steps: _Optional[int] = ..., stream_addr: _Optional[str] = ..., tenants: _Optional[_Iterable[_Union[TenantStats, _Mapping]]] = ..., router_pinned_blocks: _Optional[int] = ...) -> None: ...

class TenantStats(_message.Message):
    __slots__ = ["evicted", "evicted_by_others", "hits", "misses", "name", "primary_bytes", "primary_quota_bytes", "refusals", "shared", "stored", "tiers"]
    EVICTED_BY_OTHERS_FIELD_NUMBER: _ClassVar[int]
    EVICTED_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    MISSES_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PRIMARY_BYTES_FIELD_NUMBER: _ClassVar[int]
    PRIMARY_QUOTA_BYTES_FIELD_NUMBER: _ClassVar[int]
    REFUSALS_FIELD_NUMBER: _ClassVar[int]
    SHARED_FIELD_NUMBER: _ClassVar[int]
    STORED_FIELD_NUMBER: _ClassVar[int]
    TIERS_FIELD_NUMBER: _ClassVar[int]
    evicted: int
    evicted_by_others: int
    hits: int
    misses: int
    name: str
    primary_bytes: int
    primary_quota_bytes: int
    refusals: int
    shared: bool
    stored: int
    tiers: _containers.RepeatedCompositeFieldContainer[TenantTierStats]
    def __init__(self, name: _Optional[str] = ..., shared: bool = ..., primary_bytes: _Optional[int] = ..., primary_quota_bytes: _Optional[int] = ..., evicted: _Optional[int] = ..., evicted_by_others: _Optional[int] = ..., hits: _Optional[int] = ..., misses: _Optional[int] = ..., stored: _Optional[int] = ..., refusals: _Optional[int] = ..., tiers: _Optional[_Iterable[_Union[TenantTierStats, _Mapping]]] = ...) -> None: ...

class TenantTierStats(_message.Message):
    __slots__ = ["bytes", "quota_bytes", "tier"]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    QUOTA_BYTES_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    bytes: int
    quota_bytes: int
    tier: str
    def __init__(self, tier: _Optional[str] = ..., bytes: _Optional[int] = ..., quota_bytes: _Optional[int] = ...) -> None: ...

class TierDecision(_message.Message):
    __slots__ = ["load", "load_reason", "locality", "medium", "name", "store", "store_reason", "type"]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    LOAD_REASON_FIELD_NUMBER: _ClassVar[int]
    LOCALITY_FIELD_NUMBER: _ClassVar[int]
    MEDIUM_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    STORE_FIELD_NUMBER: _ClassVar[int]
    STORE_REASON_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    load: bool
    load_reason: str
    locality: Locality
    medium: Medium
    name: str
    store: bool
    store_reason: str
    type: str
    def __init__(self, name: _Optional[str] = ..., type: _Optional[str] = ..., medium: _Optional[_Union[Medium, str]] = ..., locality: _Optional[_Union[Locality, str]] = ..., load: bool = ..., load_reason: _Optional[str] = ..., store: bool = ..., store_reason: _Optional[str] = ...) -> None: ...

class TierDeleteResult(_message.Message):
    __slots__ = ["error", "name", "removed", "supported"]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    SUPPORTED_FIELD_NUMBER: _ClassVar[int]
    error: str
    name: str
    removed: int
    supported: bool
    def __init__(self, name: _Optional[str] = ..., supported: bool = ..., removed: _Optional[int] = ..., error: _Optional[str] = ...) -> None: ...

class TierFilter(_message.Message):
    __slots__ = ["all", "matchers", "text"]
    ALL_FIELD_NUMBER: _ClassVar[int]
    MATCHERS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    all: bool
    matchers: _containers.RepeatedCompositeFieldContainer[TierMatcher]
    text: str
    def __init__(self, all: bool = ..., matchers: _Optional[_Iterable[_Union[TierMatcher, _Mapping]]] = ..., text: _Optional[str] = ...) -> None: ...

class TierMatcher(_message.Message):
    __slots__ = ["locality", "medium"]
    LOCALITY_FIELD_NUMBER: _ClassVar[int]
    MEDIUM_FIELD_NUMBER: _ClassVar[int]
    locality: Locality
    medium: Medium
    def __init__(self, medium: _Optional[_Union[Medium, str]] = ..., locality: _Optional[_Union[Locality, str]] = ...) -> None: ...

class TierResidency(_message.Message):
    __slots__ = ["allowed", "known", "locality", "medium", "name", "run"]
    ALLOWED_FIELD_NUMBER: _ClassVar[int]
    KNOWN_FIELD_NUMBER: _ClassVar[int]
    LOCALITY_FIELD_NUMBER: _ClassVar[int]
    MEDIUM_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    allowed: bool
    known: bool
    locality: Locality
    medium: Medium
    name: str
    run: int
    def __init__(self, name: _Optional[str] = ..., medium: _Optional[_Union[Medium, str]] = ..., locality: _Optional[_Union[Locality, str]] = ..., allowed: bool = ..., known: bool = ..., run: _Optional[int] = ...) -> None: ...

class TierStats(_message.Message):
    __slots__ = ["blocks", "bytes", "bytes_in", "bytes_out", "cascade_blocks_revoked", "cascade_latency_ema_seconds", "cascade_pin_budget", "cascade_pinned_slots", "cascades_dropped", "cascades_dropped_by_reason", "cascades_failed", "cascades_filtered", "cascades_ok", "corrupt_blocks", "evictions", "healthy", "hits", "locality", "medium", "misses", "name", "promotions_failed", "promotions_ok", "queue_capacity", "queued_jobs", "retries", "skipped_by_filter", "type", "under_pressure"]
    class CascadesDroppedByReasonEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    BYTES_IN_FIELD_NUMBER: _ClassVar[int]
    BYTES_OUT_FIELD_NUMBER: _ClassVar[int]
    CASCADES_DROPPED_BY_REASON_FIELD_NUMBER: _ClassVar[int]
    CASCADES_DROPPED_FIELD_NUMBER: _ClassVar[int]
    CASCADES_FAILED_FIELD_NUMBER: _ClassVar[int]
    CASCADES_FILTERED_FIELD_NUMBER: _ClassVar[int]
    CASCADES_OK_FIELD_NUMBER: _ClassVar[int]
    CASCADE_BLOCKS_REVOKED_FIELD_NUMBER: _ClassVar[int]
    CASCADE_LATENCY_EMA_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CASCADE_PINNED_SLOTS_FIELD_NUMBER: _ClassVar[int]
    CASCADE_PIN_BUDGET_FIELD_NUMBER: _ClassVar[int]
    CORRUPT_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    EVICTIONS_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    LOCALITY_FIELD_NUMBER: _ClassVar[int]
    MEDIUM_FIELD_NUMBER: _ClassVar[int]
    MISSES_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PROMOTIONS_FAILED_FIELD_NUMBER: _ClassVar[int]
    PROMOTIONS_OK_FIELD_NUMBER: _ClassVar[int]
    QUEUED_JOBS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_CAPACITY_FIELD_NUMBER: _ClassVar[int]
    RETRIES_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_BY_FILTER_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    UNDER_PRESSURE_FIELD_NUMBER: _ClassVar[int]
    blocks: int
    bytes: int
    bytes_in: int
    bytes_out: int
    cascade_blocks_revoked: int
    cascade_latency_ema_seconds: float
    cascade_pin_budget: int
    cascade_pinned_slots: int
    cascades_dropped: int
    cascades_dropped_by_reason: _containers.ScalarMap[str, int]
    cascades_failed: int
    cascades_filtered: int
    cascades_ok: int
    corrupt_blocks: int
    evictions: int
    healthy: bool
    hits: int
    locality: Locality
    medium: Medium
    misses: int
    name: str
    promotions_failed: int
    promotions_ok: int
    queue_capacity: int
    queued_jobs: int
    retries: int
    skipped_by_filter: int
    type: str
    under_pressure: bool
    def __init__(self, name: _Optional[str] = ..., type: _Optional[str] = ..., medium: _Optional[_Union[Medium, str]] = ..., locality: _Optional[_Union[Locality, str]] = ..., hits: _Optional[int] = ..., misses: _Optional[int] = ..., retries: _Optional[int] = ..., skipped_by_filter: _Optional[int] = ..., promotions_ok: _Optional[int] = ..., promotions_failed: _Optional[int] = ..., cascades_ok: _Optional[int] = ..., cascades_failed: _Optional[int] = ..., cascades_dropped: _Optional[int] = ..., cascades_filtered: _Optional[int] = ..., bytes_in: _Optional[int] = ..., bytes_out: _Optional[int] = ..., under_pressure: bool = ..., cascades_dropped_by_reason: _Optional[_Mapping[str, int]] = ..., cascade_pinned_slots: _Optional[int] = ..., cascade_pin_budget: _Optional[int] = ..., queued_jobs: _Optional[int] = ..., queue_capacity: _Optional[int] = ..., cascade_latency_ema_seconds: _Optional[float] = ..., healthy: bool = ..., blocks: _Optional[int] = ..., evictions: _Optional[int] = ..., corrupt_blocks: _Optional[int] = ..., bytes: _Optional[int] = ..., cascade_blocks_revoked: _Optional[int] = ...) -> None: ...

class TouchRequest(_message.Message):
    __slots__ = ["key_size", "keys", "namespace", "packed_keys", "request_id"]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    KEY_SIZE_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    PACKED_KEYS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    key_size: int
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    namespace: str
    packed_keys: bytes
    request_id: str
    def __init__(self, namespace: _Optional[str] = ..., request_id: _Optional[str] = ..., keys: _Optional[_Iterable[bytes]] = ..., packed_keys: _Optional[bytes] = ..., key_size: _Optional[int] = ...) -> None: ...

class TouchResponse(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class UnpinRequest(_message.Message):
    __slots__ = ["key_size", "keys", "namespace", "packed_keys"]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    KEY_SIZE_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    PACKED_KEYS_FIELD_NUMBER: _ClassVar[int]
    key_size: int
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    namespace: str
    packed_keys: bytes
    def __init__(self, namespace: _Optional[str] = ..., keys: _Optional[_Iterable[bytes]] = ..., packed_keys: _Optional[bytes] = ..., key_size: _Optional[int] = ...) -> None: ...

class UnpinResponse(_message.Message):
    __slots__ = ["unpinned"]
    UNPINNED_FIELD_NUMBER: _ClassVar[int]
    unpinned: int
    def __init__(self, unpinned: _Optional[int] = ...) -> None: ...

class LookupResult(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class OffloadPolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class Medium(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class Locality(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class PutStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class ArenaKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class RegionFound(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []
