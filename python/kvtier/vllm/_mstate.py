"""The state of ``KvtierProxyManager`` (kvtier.vllm.manager), shared by the
modules its methods live in: the manager's own (the OffloadingManager
calls), ``_answers`` (the daemon's answers and link switches, applied
between steps) and ``_calls`` (the bounded calls the scheduler thread
waits on). Everything here is touched by the scheduler thread only; the
sending thread (``_steps``) shares nothing with it but its queues.
"""

from __future__ import annotations

import queue
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kvtier.vllm import _compat as vc

if TYPE_CHECKING:
    from kvtier._daemon import Users
    from kvtier.client import Client
    from kvtier.v1 import kvtier_pb2 as pb
    from kvtier.vllm._steps import Answer, Attached, Late, Sender
    from kvtier.vllm.spec import KvtierOffloadingSpec

_HIT, _MISS, _RETRY = vc.LookupResult.HIT, vc.LookupResult.MISS, vc.LookupResult.RETRY
_MAX_FREE = 4096  # the daemon's bound on one engine's leased free slots
_HELD_STEPS = 4  # steps a reserve's "the daemon holds it" is trusted
_CALL_BOUND = 0.1  # seconds, the most a first sight or a reserve may hold the scheduler
_FIRST_SIGHT_KEYS = 4096  # keys one first-sight lookup asks about


class KvtierSlotSpec(vc.CPULoadStoreSpec):
    """Slots of the daemon's arena, and the epoch of the arena they belong
    to: a worker copies through that epoch's mapping or not at all."""

    def __init__(self, block_ids: list[int], epoch: int) -> None:  # noqa: D107
        super().__init__(block_ids)
        self.epoch = epoch


@dataclass
class Req:
    ctx: vc.ReqContext
    params: str
    # key -> the settled answer (HIT or MISS): what lookup returns, in
    # one dict lookup
    answer: dict[bytes, vc.LookupResult] = field(default_factory=dict)
    # key -> the slot of a HIT (a lookup lease); its keys answer HIT
    slot: dict[bytes, int] = field(default_factory=dict)
    # key -> monotonic deadline of a lookup in flight (pending: neither in
    # answer nor in slot): past it, a MISS
    asked: dict[bytes, float] = field(default_factory=dict)
    # key -> the deadline of a key the daemon was not sure of yet (a
    # promotion in flight): it is asked again, and the bound still runs
    # from its first ask
    retry_by: dict[bytes, float] = field(default_factory=dict)
    # HITs not loaded yet: key -> the step count when the lease came
    lease_at: dict[bytes, int] = field(default_factory=dict)
    loading: dict[bytes, int] = field(default_factory=dict)    # key -> pins loaded, not completed
    storing: dict[bytes, int] = field(default_factory=dict)    # key -> leased slot being written
    # Jobs of a link that went down, not completed yet: key -> the
    # generation of each. Their completions commit nothing.
    stale_loading: dict[bytes, list[int]] = field(default_factory=dict)
    stale_storing: dict[bytes, list[int]] = field(default_factory=dict)
    # Announced in the batch being built and never asked about: its first
    # lookup may ask the daemon at once (first sight).
    fresh: bool = False
    finished: bool = False


@dataclass
class Batch:
    """A step's work for the daemon, built by the scheduler thread until
    its step-end call (or dropped with a link that went down)."""

    new: list[tuple[str, str]] = field(default_factory=list)  # (request id, params) announced
    unpins: dict[str, list[bytes]] = field(default_factory=dict)
    stores: list[tuple[str, list[bytes], list[int], bool]] = field(default_factory=list)
    touches: dict[str, list[bytes]] = field(default_factory=dict)
    lookups: dict[str, list[bytes]] = field(default_factory=dict)
    finished: list[str] = field(default_factory=list)
    returns: list[int] = field(default_factory=list)  # leased slots given back
    scheduled: list[str] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)

    def pending(self) -> bool:
        """Whether it holds anything the daemon must hear of."""
        return bool(self.lookups or self.stores or self.unpins or self.finished or self.new or self.returns)

    def stored_keys(self) -> list[bytes]:
        """The keys of its successful stores."""
        return [k for _, ks, _, ok in self.stores if ok for k in ks]

    def request(self, namespace: str, epoch: int, want: int, reset: bool) -> pb.EngineStepRequest:
        """Its EngineStepRequest."""
        from kvtier.v1 import kvtier_pb2 as pb

        req = pb.EngineStepRequest(
            namespace=namespace, epoch=epoch, want_free_slots=want, finished_request_ids=self.finished,
            return_slots=self.returns, reset_cache=reset,
            scheduled_request_ids=self.scheduled, preempted_request_ids=self.preempted,
        )
        for rid, params in self.new:
            req.new_requests.add(request_id=rid, kv_transfer_params=params)
        for rid, keys in self.unpins.items():
            req.unpins.add(request_id=rid, packed_keys=b"".join(keys), key_size=len(keys[0]))
        for rid, keys, slots, ok in self.stores:
            req.stores.add(request_id=rid, packed_keys=b"".join(keys), key_size=len(keys[0]), slots=slots, success=ok)
        for rid, keys in self.touches.items():
            req.touches.add(request_id=rid, packed_keys=b"".join(keys), key_size=len(keys[0]))
        for rid, keys in self.lookups.items():
            req.lookups.add(request_id=rid, packed_keys=b"".join(keys), key_size=len(keys[0]))
        return req


class State:
    """The manager's attributes, declared once for the modules its methods
    live in (KvtierProxyManager.__init__ sets them, with what each is)."""

    _pb: Any
    _spec: KvtierOffloadingSpec
    _lease_steps: int
    _max_free: int
    _max_burst: int
    _call_bound: float
    _reserve_ok: bool
    _sync_budget: float
    _sync_left: float
    _sync_ok: bool
    _unbound: dict[bytes, int]
    _batch_stores: deque[list[bytes]]
    _held: dict[bytes, int]
    _held_q: deque[tuple[int, bytes]]
    _min_free: int
    _timeout: float
    _lookup_timeout: float
    _reconnect_interval: float
    _target: str
    _reqs: dict[str, Req]
    _pool: list[int]
    _stored_recent: deque[int]
    _step_stores: int
    _events: list[vc.OffloadingEvent]
    _events_on: bool
    _reset: bool
    _gen: int
    _epoch: int
    _ns: str
    _client: Client
    _up: bool
    _invalidated: bool
    _attached: Attached | None
    _in_step: bool
    _steps: int
    _lease_q: deque[tuple[int, str, bytes]]
    _lk_ctx: vc.ReqContext | None
    _lk_answer: dict[bytes, vc.LookupResult]
    _now: float
    _users: dict[int, Users]
    _old_clients: dict[int, Client]
    _fenced: list[tuple[int, str, dict[bytes, int], dict[bytes, int]]]
    _fenced_stale: list[int]
    _flush_in: int
    _b: Batch
    _sender: Sender
    _answers: queue.SimpleQueue[Answer | Attached | Late]
    _in_flight: int
    late_lookups: int
    outages: int
    reattaches: int
    store_shortfalls: int
    reserves: int
    reserve_failures: int
    first_sights: int
    first_sight_failures: int
    late_answers: int
