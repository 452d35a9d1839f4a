"""Tier mode end to end: vLLM's own TieringOffloadingSpec and manager, built
from the one config block, with kvtier as their secondary tier and a real
`kvtier serve` (an fs tier and a memory tier) behind it."""

from __future__ import annotations

import hashlib
import pathlib
from typing import Any

import numpy as np

from conftest import Daemon, offloading_config, wait_until, stored_hash

CHUNK = 4096


def build(daemon: Daemon, *, chunks: int = 4, tier: dict[str, Any] | None = None, events: bool = True) -> tuple[Any, Any]:
    """vLLM's spec and manager from the user's one config block."""
    from vllm.plugins import load_general_plugins
    from vllm.v1.kv_offload.factory import OffloadingSpecFactory

    load_general_plugins()  # the kvtier entry point registers tier type "kvtier"
    extra = {
        "spec_name": "TieringOffloadingSpec",
        "cpu_bytes_to_use": chunks * CHUNK,
        "secondary_tiers": [tier or {"type": "kvtier", "target": "unix://" + daemon.sock}],
    }
    spec = OffloadingSpecFactory.create_spec(offloading_config(extra, events=events))
    return spec, spec.get_manager()


def ctx(rid: str, params: dict[str, Any] | None = None) -> Any:
    """A request context as vLLM's connector builds it (its own parser)."""
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler import _parse_tier_filter
    from vllm.v1.kv_offload.base import ReqContext, TierFilter

    f = TierFilter.ALL
    if params and params.get("kv_load_tiers") is not None:
        f = _parse_tier_filter(params["kv_load_tiers"])
    return ReqContext(req_id=rid, kv_transfer_params=params, load_tier_filter=f)


def key(i: int) -> bytes:
    return hashlib.sha256(str(i).encode()).digest() + (0).to_bytes(4, "big")


def block(i: int) -> np.ndarray:
    return np.frombuffer(hashlib.sha256(b"content%d" % i).digest() * (CHUNK // 32), dtype=np.uint8)


def view(mgr: Any) -> np.ndarray:
    return np.asarray(mgr.primary_tier.get_kv_memoryview())


def step(mgr: Any) -> None:
    from vllm.v1.kv_offload.base import ScheduleEndContext

    mgr.on_schedule_end(ScheduleEndContext(new_req_ids=(), preempted_req_ids=()))


def settle(mgr: Any, timeout: float = 20) -> None:
    """Steps until no tier has work pending (jobs answered, lookups in)."""
    def idle() -> bool:
        step(mgr)
        return not mgr.has_pending_work()

    wait_until(idle, timeout, "the tiers to settle")


def store(mgr: Any, c: Any, ids: list[int]) -> None:
    """Stores blocks as vLLM's connector and GPU worker do: prepare_store,
    the worker writes the slots, complete_store (which cascades)."""
    keys = [key(i) for i in ids]
    out = mgr.prepare_store(keys, c)
    assert out is not None, "the primary had no room"
    v = view(mgr)
    for k, slot in zip(out.keys_to_store, out.store_spec.chunk_ids):
        v[slot] = block(ids[keys.index(k)])
    mgr.complete_store(keys, c, True)


def lookup_until(mgr: Any, k: bytes, c: Any, want: str, timeout: float = 20) -> list[str]:
    """Looks k up once per step until the answer is want; returns the
    answers seen."""
    seen: list[str] = []

    def done() -> bool:
        r = mgr.lookup(k, c).name
        if not seen or seen[-1] != r:
            seen.append(r)
        if r == want:
            return True
        step(mgr)
        return False

    wait_until(done, timeout, f"lookup {want} (saw {seen})")
    return seen


def files_on_disk(daemon: Daemon) -> dict[str, bytes]:
    out = {}
    for p in pathlib.Path(daemon.dir / "data").rglob("*.bin"):
        out[p.stem] = p.read_bytes()
    return out


def test_store_evict_lookup_promote(daemon: Daemon) -> None:
    spec, mgr = build(daemon, chunks=4)
    try:
        tier = mgr.secondary_tiers[0]
        assert type(tier).__name__ == "KvtierSecondaryTier" and tier.medium is None and tier.locality is None
        c = ctx("r1")
        mgr.on_new_request(c)
        store(mgr, c, [1, 2])
        settle(mgr)
        ns = tier.namespace
        stats = daemon.tier_stats(ns)
        assert stats["disk"].cascades_ok == 1 and stats["dram"].cascades_ok == 1, stats
        # The bytes are on disk (kvtier's format: the block, then a trailer).
        disk = files_on_disk(daemon)
        assert disk[stored_hash(key(1)).hex()][:CHUNK] == block(1).tobytes()
        mgr.on_request_finished(c)

        # Evict blocks 1 and 2 from vLLM's primary with four others.
        c2 = ctx("r2")
        mgr.on_new_request(c2)
        store(mgr, c2, [10, 11, 12, 13])
        settle(mgr)
        mgr.on_request_finished(c2)
        assert mgr.primary_tier.lookup(key(1), c2).name == "MISS"

        # lookup: RETRY (kvtier asks the daemon), then the promotion.
        c3 = ctx("r3")
        mgr.on_new_request(c3)
        seen = lookup_until(mgr, key(1), c3, "HIT")
        assert seen[0] == "RETRY" and "HIT_PENDING" in seen, seen
        spec_out = mgr.prepare_load([key(1)], c3)
        slot = int(spec_out.chunk_ids[0])
        assert bytes(view(mgr)[slot]) == block(1).tobytes(), "the promoted bytes differ"
        mgr.complete_load([key(1)], c3)
        mgr.on_request_finished(c3)
        settle(mgr)
    finally:
        mgr.shutdown()


def test_filters_reach_kvtiers_sub_tiers(daemon: Daemon) -> None:
    spec, mgr = build(daemon, chunks=4)
    try:
        tier = mgr.secondary_tiers[0]
        ns = tier.namespace
        # Stored to storage only: the CPU tier never gets it.
        s = ctx("s", {"kv_store_tiers": [{"medium": "storage"}]})
        mgr.on_new_request(s)
        store(mgr, s, [1])
        settle(mgr)
        mgr.on_request_finished(s)
        st = daemon.tier_stats(ns)
        assert st["disk"].cascades_ok == 1 and st["dram"].cascades_ok == 0 and st["dram"].cascades_filtered == 1, st

        # kv_store_tiers: [] — nothing reaches kvtier's tiers.
        n = ctx("n", {"kv_store_tiers": []})
        mgr.on_new_request(n)
        store(mgr, n, [2])
        settle(mgr)
        mgr.on_request_finished(n)
        st2 = daemon.tier_stats(ns)
        assert st2["disk"].cascades_ok == 1 and st2["dram"].cascades_ok == 0, st2
        assert st2["disk"].cascades_filtered == 1 and st2["dram"].cascades_filtered == 2, st2
        assert stored_hash(key(2)).hex() not in files_on_disk(daemon)

        # Evict 1 from vLLM's primary.
        e = ctx("e")
        mgr.on_new_request(e)
        store(mgr, e, [10, 11, 12, 13])
        settle(mgr)
        mgr.on_request_finished(e)

        # kv_load_tiers excluding storage: a miss, and the fs tier is never asked.
        before = daemon.tier_stats(ns)["disk"]
        c = ctx("c", {"kv_load_tiers": [{"medium": "cpu"}]})
        mgr.on_new_request(c)
        seen = lookup_until(mgr, key(1), c, "MISS")
        assert seen == ["RETRY", "MISS"], seen
        after = daemon.tier_stats(ns)["disk"]
        asked = lambda t: t.hits + t.misses + t.retries  # noqa: E731
        assert asked(after) == asked(before) and after.skipped_by_filter > before.skipped_by_filter, (before, after)
        mgr.on_request_finished(c)

        # kv_load_tiers: [] — vLLM does not even ask kvtier.
        settle(mgr)
        before = daemon.tier_stats(ns)
        z = ctx("z", {"kv_load_tiers": []})
        mgr.on_new_request(z)
        assert mgr.lookup(key(1), z).name == "MISS"
        mgr.on_request_finished(z)
        settle(mgr)
        after2 = daemon.tier_stats(ns)
        for name in ("disk", "dram"):
            assert asked(after2[name]) == asked(before[name]) and after2[name].skipped_by_filter == before[name].skipped_by_filter, name
    finally:
        mgr.shutdown()


def test_events_come_from_kvtiers_tiers(daemon: Daemon) -> None:
    spec, mgr = build(daemon, chunks=4, events=True)
    try:
        c = ctx("r")
        mgr.on_new_request(c)
        store(mgr, c, [5])
        settle(mgr)
        # The next step end brings the tiers' events (fs: STORAGE/LOCAL,
        # memory: CPU/REMOTE).
        evs: list[Any] = []

        def got() -> bool:
            step(mgr)
            evs.extend(e for e in mgr.take_events() if not (e.medium.name == "CPU" and e.locality is None))
            return len(evs) >= 2

        wait_until(got, 20, "tier events")
        kinds = sorted((e.medium.name, e.locality.name if e.locality else None) for e in evs)
        assert ("CPU", "REMOTE") in kinds and ("STORAGE", "LOCAL") in kinds, kinds
        assert all(key(5) in [bytes(k) for k in e.keys] for e in evs)
        mgr.on_request_finished(c)
    finally:
        mgr.shutdown()


def test_module_path_form_works_too(daemon: Daemon) -> None:
    spec, mgr = build(daemon, tier={"type": "KvtierSecondaryTier", "module_path": "kvtier.vllm", "target": "unix://" + daemon.sock})
    try:
        assert type(mgr.secondary_tiers[0]).__name__ == "KvtierSecondaryTier"
    finally:
        mgr.shutdown()
