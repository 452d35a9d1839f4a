"""Python client of the kvtier daemon (api/kvtier/v1).

Needs grpcio and protobuf (Debian: python3-grpcio python3-protobuf). The
generated stubs live in kvtier.v1; regenerate them with api/gen.sh.

    from kvtier import Client, make_key
    c = Client("./kvtier.sock")
    c.put_blocks([(make_key(b"h1", 0), data)])
    got = c.get_blocks([make_key(b"h1", 0)], params={"kv_load_tiers": [{"medium": "storage"}]}, wait_ms=1000)

Every method raises grpc.RpcError on failure; its .code() and .details()
name the problem (NOT_FOUND for an unknown request id, INVALID_ARGUMENT
for a malformed key or a strict-mode filter error, ...).
"""

from __future__ import annotations

import json
import mmap
import os
import socket
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Protocol, TypedDict, TypeVar, Union, cast

import grpc
from google.protobuf.message import Message

from kvtier.v1 import kvtier_pb2 as pb
from kvtier.v1 import kvtier_pb2_grpc as pb_grpc

# A key: an engine block hash followed by its 4-byte KV group (make_key).
KeyLike = Union[bytes, bytearray, memoryview]
# kv_transfer_params: a JSON object, its text, or None for none.
Params = Union[Mapping[str, object], str, bytes, None]

_Resp = TypeVar("_Resp", bound=Message)
_T_co = TypeVar("_T_co", covariant=True)


class Pending(Protocol[_T_co]):
    """A call in flight (a grpc.Future): its answer, or what it raised."""

    def result(self, timeout: float | None = None) -> _T_co: ...
    def cancelled(self) -> bool: ...
    def exception(self, timeout: float | None = None) -> BaseException | None: ...
    def add_done_callback(self, fn: Callable[[Pending[_T_co]], object]) -> None: ...


class Results(Protocol):
    """The stream of a region's job results; cancel() ends it."""

    def __iter__(self) -> Iterator[pb.RegionResultsResponse]: ...
    def cancel(self) -> bool: ...

# Lookup results (kvtier.v1.LookupResult).
NOT_LOOKED_UP = pb.LOOKUP_RESULT_UNSPECIFIED
MISS = pb.LOOKUP_RESULT_MISS
HIT = pb.LOOKUP_RESULT_HIT
HIT_PENDING = pb.LOOKUP_RESULT_HIT_PENDING
RETRY = pb.LOOKUP_RESULT_RETRY

DEFAULT_MAX_MESSAGE_BYTES = 64 << 20


def rpc_message(e: BaseException) -> str:
    """A failed call's error as one line: the gRPC status code and details
    for an RpcError, else the exception's text."""
    if isinstance(e, grpc.RpcError):
        try:
            return "%s: %s" % (e.code().name, e.details())
        except Exception:  # noqa: BLE001 - an RpcError without a status
            pass
    return str(e)


def make_key(block_hash: KeyLike | int, group: int = 0) -> bytes:
    """Returns the offload key of an engine block hash in a KV group: the
    hash bytes followed by the 4-byte big-endian group index (docs/semantics.md §1.1)."""
    if isinstance(block_hash, int):
        block_hash = block_hash.to_bytes(8, "big", signed=False)
    return bytes(block_hash) + struct.pack(">I", group)


def _params(params: Params) -> str:
    if params is None:
        return ""
    if isinstance(params, (bytes, str)):
        return params.decode() if isinstance(params, bytes) else params
    return json.dumps(params)


_Req = TypeVar("_Req", bound=Message)


def _with_keys(req: _Req, keys: Iterable[KeyLike]) -> _Req:
    """Sets a request's keys in their cheapest form: packed_keys + key_size
    when every key has the same length, else the repeated keys field."""
    ks = [bytes(k) for k in keys]
    if ks and all(len(k) == len(ks[0]) for k in ks):
        setattr(req, "packed_keys", b"".join(ks))
        setattr(req, "key_size", len(ks[0]))
    else:
        getattr(req, "keys").extend(ks)
    return req


def _unix_path(target: str) -> str | None:
    if target.startswith("unix://"):
        return target[len("unix://"):]
    if target.startswith("unix:"):
        return target[len("unix:"):]
    if "/" in target or target.endswith(".sock"):
        return target
    return None


class Arena:
    """The daemon's slot memory mapped into this process (same host only).

    Write only the slots prepare_store returned (until complete_store) and
    read only the slots prepare_load returned (until complete_load)."""

    def __init__(self, mm: mmap.mmap, slot_size: int, num_slots: int) -> None:
        self._mm = mm
        self.slot_size = slot_size
        self.num_slots = num_slots

    def slot(self, i: int) -> memoryview:
        """A writable memoryview of slot i (no copy)."""
        if not 0 <= i < self.num_slots:
            raise IndexError("slot %d out of range (arena has %d slots)" % (i, self.num_slots))
        off = i * self.slot_size
        return memoryview(self._mm)[off:off + self.slot_size]

    def close(self) -> None:
        self._mm.close()

    def __enter__(self) -> Arena:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ArenaReply(TypedDict, total=False):
    """The side channel's description of the arena it sends."""

    namespace: str
    slot_size: int
    num_slots: int
    size: int
    kind: str
    epoch: int
    error: str


def receive_arena_fd(path: str, namespace: str = "", ticket: str = "") -> tuple[int, ArenaReply]:
    """Receives the arena's file descriptor from the daemon's side channel
    (SCM_RIGHTS). Returns (fd, description dict). ticket comes from the
    GetArena or EngineAttach answer; a daemon with tokens wants one (each
    opens the namespace's arena once), a daemon without tokens none."""
    line = namespace.encode() + b"\n"
    if ticket or namespace.startswith("{"):
        line = json.dumps({"namespace": namespace, "ticket": ticket}).encode() + b"\n"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(path)
        try:
            s.sendall(line)
        except (BrokenPipeError, ConnectionResetError):
            pass  # a refusal (too many in flight) answers without reading: read why
        msg, fds, _flags, _addr = socket.recv_fds(s, 4096, 1)
    reply = cast(ArenaReply, json.loads(msg.decode() or "{}"))
    if reply.get("error") or len(fds) != 1:
        for fd in fds:
            os.close(fd)
        raise RuntimeError("kvtier arena side channel: %s" % (reply.get("error") or "no descriptor received"))
    return fds[0], reply


def _read(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ValueError("kvtier: %s %s: %s" % (what, path, e.strerror)) from None


def token_of(token: str | None, token_file: str | None, who: str) -> str | None:
    """The auth token an integration's config gives, inline or as a file
    (its first line, surrounding whitespace trimmed; kept out of process
    listings and config dumps). A file its group or others may read is
    refused, as the daemon and the CLI refuse one."""
    if token is not None and token_file is not None:
        raise ValueError(f"{who}: set token or token_file, not both")
    if token_file is None:
        return token
    try:
        st = os.stat(token_file)
    except OSError as e:
        raise ValueError(f"{who}: token_file {token_file}: {e.strerror}") from None
    if st.st_mode & 0o077:
        raise ValueError(f"{who}: token_file {token_file} is mode {st.st_mode & 0o777:o}: its group or others may "
                         f"read the token (chmod 600 it)")
    lines = _read(token_file, "token_file").decode().strip().splitlines()
    if not lines or not lines[0].strip():
        raise ValueError(f"{who}: token_file {token_file} is empty")
    return lines[0].strip()


def tls_credentials(ca_file: str | None = None, cert_file: str | None = None,
                    key_file: str | None = None) -> grpc.ChannelCredentials:
    """gRPC channel credentials for a daemon whose TCP API serves TLS
    (server.tls): trusting ca_file (default: the system's roots) and, with
    cert_file and key_file, presenting that client certificate."""
    if (cert_file is None) != (key_file is None):
        raise ValueError("kvtier: tls_cert and tls_key go together")
    return grpc.ssl_channel_credentials(
        root_certificates=_read(ca_file, "tls_ca") if ca_file else None,
        private_key=_read(key_file, "tls_key") if key_file else None,
        certificate_chain=_read(cert_file, "tls_cert") if cert_file else None)


def tls_trouble(e: BaseException) -> str | None:
    """What a failed call's TLS handshake says went wrong, in an
    operator's terms, or None when it was not a TLS failure."""
    if not isinstance(e, grpc.RpcError):
        return None
    try:
        msg = (e.details() or "").lower()
    except Exception:  # noqa: BLE001
        return None
    if "certificate_verify_failed" in msg or "unknown authority" in msg or "unable to get local issuer" in msg:
        return "the daemon's TLS certificate is not signed by a CA this client trusts (tls_ca names the daemon's CA)"
    if "hostname" in msg or "peer name" in msg or "does not match" in msg:
        return "the daemon's TLS certificate is not for the name dialled (tls_server_name sets the name to check)"
    if "certificate required" in msg or "certificate_required" in msg or "bad certificate" in msg:
        return "the daemon wants a TLS client certificate signed by its server.tls.client_ca_file (tls_cert and tls_key)"
    if "tsi_data_corrupted" in msg or "unwrap failed" in msg:
        # gRPC's C core reports the daemon's alert (certificate required,
        # unknown CA) only in its own log; the call sees a broken record.
        return ("the daemon broke off the TLS session after the handshake: it wants a client certificate signed by its "
                "server.tls.client_ca_file (tls_cert and tls_key), or does not trust the one sent")
    if "wrong_version_number" in msg or "wrong version number" in msg or "handshake" in msg:
        return "the TLS handshake failed: does the daemon serve TLS on this address (server.tls)?"
    return None


class Client:
    """A connection to a kvtier daemon.

    target is a Unix socket path ("./kvtier.sock", "unix:/run/kvtier.sock")
    or a TCP "host:port". token is the daemon's TCP auth token, if any.
    A TCP daemon that serves TLS (server.tls) takes tls=True (the system's
    roots) or tls_ca (its CA's PEM file), with tls_cert and tls_key for
    mutual TLS and tls_server_name to check another name than the host
    dialled. A failed handshake raises grpc.RpcError (UNAVAILABLE) on the
    first call; kvtier.tls_trouble(e) names the cause."""

    def __init__(self, target: str = "./kvtier.sock", token: str | None = None, namespace: str = "",
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, tls: bool = False, tls_ca: str | None = None,
                 tls_cert: str | None = None, tls_key: str | None = None, tls_server_name: str | None = None) -> None:
        options: list[tuple[str, str | int]] = [
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max_message_bytes),
            # A connection of its own: the daemon's sessions are
            # connections (requests, pins and leased slots belong to one),
            # and gRPC otherwise shares one connection among every channel
            # of the process to the same address, so that two engines, or
            # an engine's old and new attach, would be one session.
            ("grpc.use_local_subchannel_pool", 1),
        ]
        path = _unix_path(target)
        address = "unix:" + os.path.abspath(path) if path is not None else target
        use_tls = tls or tls_ca or tls_cert or tls_key or tls_server_name
        if use_tls and path is not None:
            raise ValueError("kvtier: target %r is a Unix socket: TLS applies to a TCP daemon (host:port)" % target)
        if use_tls:
            if tls_server_name:
                options.append(("grpc.ssl_target_name_override", tls_server_name))
            self._channel = grpc.secure_channel(address, tls_credentials(tls_ca, tls_cert, tls_key), options=options)
        else:
            self._channel = grpc.insecure_channel(address, options=options)
        self._stub = pb_grpc.KVTierStub(self._channel)
        self._md: tuple[tuple[str, str], ...] | None = (("authorization", "Bearer " + token),) if token else None
        self.namespace = namespace

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def stub(self) -> pb_grpc.KVTierStub:
        """The generated stub, for calls this class does not wrap."""
        return self._stub

    @property
    def metadata(self) -> tuple[tuple[str, str], ...] | None:
        """The call metadata (the bearer token) for calls made on stub."""
        return self._md

    def _call(self, name: str, req: Message, resp: type[_Resp], timeout: float | None = None) -> _Resp:
        return cast(_Resp, getattr(self._stub, name)(req, metadata=self._md, timeout=timeout))

    def _start(self, name: str, req: Message, resp: type[_Resp], timeout: float | None = None) -> Pending[_Resp]:
        return cast("Pending[_Resp]", getattr(self._stub, name).future(req, metadata=self._md, timeout=timeout))

    # Engines (kvtier.vllm manager mode, kvtier.sglang) ------------------

    def engine_attach(self, layout: Mapping[str, object], timeout: float | None = None) -> pb.EngineAttachResponse:
        """Attaches an engine's layout (the daemon creates its namespace if
        it has none): the namespace, its epoch, slots and arena."""
        return self._call("EngineAttach", pb.EngineAttachRequest(layout=json.dumps(layout)), pb.EngineAttachResponse,
                          timeout)

    def engine_step(self, req: pb.EngineStepRequest, timeout: float | None = None) -> pb.EngineStepResponse:
        """One engine step: new requests, lookups, stores, releases."""
        return self._call("EngineStep", req, pb.EngineStepResponse, timeout)

    def engine_step_async(self, req: pb.EngineStepRequest, timeout: float | None = None) -> Pending[pb.EngineStepResponse]:
        """engine_step, not waited for."""
        return self._start("EngineStep", req, pb.EngineStepResponse, timeout)

    def engine_reserve_async(self, req: pb.EngineReserveRequest,
                             timeout: float | None = None) -> Pending[pb.EngineReserveResponse]:
        """Leases free slots for a store the engine's pool is too small
        for, not waited for."""
        return self._start("EngineReserve", req, pb.EngineReserveResponse, timeout)

    # Regions (kvtier.vllm tier mode) -------------------------------------

    def region_lookup(self, req: pb.RegionLookupRequest, timeout: float | None = None) -> pb.RegionLookupResponse:
        return self._call("RegionLookup", req, pb.RegionLookupResponse, timeout)

    def region_lookups(self, req: pb.RegionLookupsRequest, timeout: float | None = None) -> pb.RegionLookupsResponse:
        return self._call("RegionLookups", req, pb.RegionLookupsResponse, timeout)

    def region_submit(self, req: pb.RegionSubmitRequest, timeout: float | None = None) -> pb.RegionSubmitResponse:
        return self._call("RegionSubmit", req, pb.RegionSubmitResponse, timeout)

    def region_step(self, req: pb.RegionStepRequest, timeout: float | None = None) -> pb.RegionStepResponse:
        return self._call("RegionStep", req, pb.RegionStepResponse, timeout)

    def region_results(self, region_id: str) -> Results:
        """The stream of the region's job results, until cancelled."""
        return cast(Results, self._stub.RegionResults(pb.RegionResultsRequest(region_id=region_id), metadata=self._md))

    # Request lifecycle -------------------------------------------------

    def new_request(self, request_id: str, params: Params = None) -> pb.NewRequestResponse:
        """Registers a request; params is kv_transfer_params (dict, JSON
        text or None). Returns NewRequestResponse (policy, parsed filters,
        warnings)."""
        return self._call("NewRequest", pb.NewRequestRequest(
            namespace=self.namespace, request_id=request_id, kv_transfer_params=_params(params)), pb.NewRequestResponse)

    def finish_request(self, request_id: str) -> None:
        self._call("FinishRequest", pb.FinishRequestRequest(namespace=self.namespace, request_id=request_id), pb.FinishRequestResponse)

    def schedule_end(self, new_request_ids: Iterable[str] = (), preempted_request_ids: Iterable[str] = ()) -> bool:
        """Ends one engine step; returns True while transfers are in flight."""
        resp = self._call("ScheduleEnd", pb.ScheduleEndRequest(
            namespace=self.namespace, new_request_ids=list(new_request_ids),
            preempted_request_ids=list(preempted_request_ids)), pb.ScheduleEndResponse)
        return resp.has_pending_work

    # Manager calls -----------------------------------------------------

    def lookup(self, request_id: str, keys: Iterable[KeyLike], prefix_scan: bool = False) -> tuple[list[int], int]:
        """Returns (results, hits): one LookupResult per key and the number
        of leading HIT/HIT_PENDING keys."""
        resp = self._call("Lookup", _with_keys(pb.LookupRequest(
            namespace=self.namespace, request_id=request_id, prefix_scan=prefix_scan), keys), pb.LookupResponse)
        return list(resp.results), resp.hits

    def prepare_load(self, request_id: str, keys: Iterable[KeyLike], allow_missing: bool = False) -> list[int]:
        """Pins keys; returns their arena slots. A key evicted since the
        lookup that answered HIT (other clients' stores) fails the call,
        which then pins nothing; with allow_missing it answers slot -1 (a
        miss: nothing to read or to complete) and the rest are pinned."""
        return list(self._call("PrepareLoad", _with_keys(pb.PrepareLoadRequest(
            namespace=self.namespace, request_id=request_id, allow_missing=allow_missing), keys), pb.PrepareLoadResponse).slots)

    def complete_load(self, request_id: str, keys: Iterable[KeyLike]) -> None:
        self._call("CompleteLoad", _with_keys(pb.CompleteLoadRequest(
            namespace=self.namespace, request_id=request_id), keys), pb.CompleteLoadResponse)

    def touch(self, request_id: str, keys: Iterable[KeyLike]) -> None:
        self._call("Touch", _with_keys(pb.TouchRequest(namespace=self.namespace, request_id=request_id), keys), pb.TouchResponse)

    def prepare_store(self, request_id: str, keys: Iterable[KeyLike],
                      metadata: Sequence[pb.BlockMetadata] | None = None) -> pb.PrepareStoreResponse:
        """Reserves slots; returns PrepareStoreResponse (ok, keys_to_store,
        slots, evicted). metadata: None or one pb.BlockMetadata per key."""
        return self._call("PrepareStore", _with_keys(pb.PrepareStoreRequest(
            namespace=self.namespace, request_id=request_id, metadata=metadata or []), keys), pb.PrepareStoreResponse)

    def complete_store(self, request_id: str, keys: Iterable[KeyLike], success: bool = True) -> None:
        self._call("CompleteStore", _with_keys(pb.CompleteStoreRequest(
            namespace=self.namespace, request_id=request_id, success=success), keys), pb.CompleteStoreResponse)

    def reset(self) -> None:
        self._call("Reset", pb.ResetRequest(namespace=self.namespace), pb.ResetResponse)

    def stats(self) -> pb.StatsResponse:
        return self._call("Stats", pb.StatsRequest(namespace=self.namespace), pb.StatsResponse)

    def explain(self, params: Params = None) -> pb.ExplainResponse:
        return self._call("Explain", pb.ExplainRequest(namespace=self.namespace, kv_transfer_params=_params(params)), pb.ExplainResponse)

    # Routers and agents -----------------------------------------------

    def residency(self, keys: Iterable[KeyLike], params: Params = None) -> pb.ResidencyResponse:
        """How many leading keys of a prefix each tier holds, for the load
        filter of params (kv_transfer_params as a dict or JSON; None: the
        daemon's default), changing nothing: ResidencyResponse (primary,
        tiers: name/medium/locality/allowed/known/run, loadable, warnings).
        kvtier.keys.keys_from_tokens gives the keys of a prompt."""
        return self._call("Residency", _with_keys(pb.ResidencyRequest(
            namespace=self.namespace, kv_transfer_params=_params(params)), keys), pb.ResidencyResponse)

    def prefetch(self, keys: Iterable[KeyLike], params: Params = None, deadline_ms: int = 0) -> pb.PrefetchResponse:
        """Promotes the leading run of keys that params' load filter allows
        toward the daemon's primary, ahead of a request the caller knows is
        coming; the daemon keeps trying tiers that are not sure yet for up
        to deadline_ms (0: 10 s). PrefetchResponse (present, started,
        queued, warnings). Bounded by the operator's prefetch.share;
        idempotent."""
        return self._call("Prefetch", _with_keys(pb.PrefetchRequest(
            namespace=self.namespace, kv_transfer_params=_params(params),
            deadline_ms=deadline_ms), keys), pb.PrefetchResponse)

    def pin(self, keys: Iterable[KeyLike], ttl_ms: int) -> pb.PinResponse:
        """Keeps the keys' blocks that are ready in the daemon's primary
        there for ttl_ms (pinning again extends it). PinResponse (pinned,
        missing: not ready, prefetch them first; refused: over the
        operator's pins.share)."""
        return self._call("Pin", _with_keys(pb.PinRequest(namespace=self.namespace, ttl_ms=ttl_ms), keys), pb.PinResponse)

    def unpin(self, keys: Iterable[KeyLike]) -> int:
        """Releases pins before their TTL; returns how many it released."""
        return self._call("Unpin", _with_keys(pb.UnpinRequest(namespace=self.namespace), keys), pb.UnpinResponse).unpinned

    def delete(self, keys: Iterable[KeyLike]) -> pb.DeleteResponse:
        """Removes the keys' blocks from the daemon's primary and from every
        tier that removes blocks on request (fs, memory, redis, s3), with removal
        events per medium. DeleteResponse (primary, held: left because
        something holds them, tiers: name/supported/removed/error)."""
        return self._call("Delete", _with_keys(pb.DeleteRequest(namespace=self.namespace), keys), pb.DeleteResponse)

    def delete_all(self, tenant: str = "") -> pb.DeleteResponse:
        """Removes every block of a key space from the primary and from
        every tier that lists what it holds (fs, memory): with a tenant's
        token its own; with the admin's, tenant's (required)."""
        return self._call("Delete", pb.DeleteRequest(namespace=self.namespace, all=True, tenant=tenant), pb.DeleteResponse)

    # By value ----------------------------------------------------------

    def put_blocks(self, blocks: Iterable[tuple[KeyLike, KeyLike]], request_id: str = "", params: Params = None,
                   metadata: Sequence[pb.BlockMetadata | None] | None = None) -> list[bool]:
        """Stores (key, data) pairs, each data exactly the slot size.
        metadata: None, or one pb.BlockMetadata (or None) per block — the
        block's tokens, for self-describing KV events (a tenant gives its
        engine's hashes, without its key space's tag). Returns one bool per
        block: True when written, False when it was already present."""
        blocks = list(blocks)
        if metadata is not None and len(metadata) != len(blocks):
            raise ValueError(f"put_blocks: {len(metadata)} metadata entries for {len(blocks)} blocks")
        metas = metadata or [None] * len(blocks)
        resp = self._call("PutBlocks", pb.PutBlocksRequest(
            namespace=self.namespace, request_id=request_id, kv_transfer_params=_params(params),
            blocks=[pb.Block(key=bytes(k), data=bytes(d), metadata=m) for (k, d), m in zip(blocks, metas)]),
            pb.PutBlocksResponse)
        return [s == pb.PUT_STATUS_STORED for s in resp.statuses]

    def get_blocks(self, keys: Iterable[KeyLike], request_id: str = "", params: Params = None, wait_ms: int = 0,
                   prefix_only: bool = False) -> tuple[list[int], list[bytes | None], int]:
        """Loads blocks. Returns (results, data, hits): data[i] is the bytes
        of keys[i] when results[i] is HIT, else None. wait_ms lets the
        daemon drive steps until promotions from secondary tiers land."""
        resp = self._call("GetBlocks", pb.GetBlocksRequest(
            namespace=self.namespace, request_id=request_id, kv_transfer_params=_params(params),
            keys=[bytes(k) for k in keys], wait_ms=wait_ms, prefix_only=prefix_only), pb.GetBlocksResponse)
        data = [b.data if r == HIT else None for b, r in zip(resp.blocks, resp.results)]
        return list(resp.results), data, resp.hits

    # Shared memory -----------------------------------------------------

    def arena_info(self, namespace: str | None = None, timeout: float | None = None) -> pb.GetArenaResponse:
        """The arena of namespace (default: the client's), with a ticket
        for the side channel when the daemon wants one."""
        ns = self.namespace if namespace is None else namespace
        return self._call("GetArena", pb.GetArenaRequest(namespace=ns), pb.GetArenaResponse, timeout)

    def map_arena(self) -> Arena:
        """Maps the daemon's arena (memfd or shared file) with mmap.
        Raises RuntimeError when the arena is private memory."""
        info = self.arena_info()
        if info.kind in (pb.ARENA_KIND_UNSPECIFIED, pb.ARENA_KIND_ANONYMOUS):
            raise RuntimeError("kvtier: the daemon's arena is anonymous memory; use put_blocks/get_blocks")
        if info.fd_socket:
            fd, _ = receive_arena_fd(info.fd_socket, self.namespace, info.ticket)
        elif info.kind == pb.ARENA_KIND_FILE and info.path:
            fd = os.open(info.path, os.O_RDWR)
        else:
            raise RuntimeError("kvtier: the daemon offers no way to reach its arena")
        try:
            mm = mmap.mmap(fd, info.size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        return Arena(mm, info.slot_size, info.num_slots)
