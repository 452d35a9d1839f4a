"""The tripwire of a vLLM upgrade: every vLLM symbol, signature and private
field kvtier.vllm relies on, checked against the installed package (no
stand-ins), and kvtier's filter parser checked against vLLM's."""

from __future__ import annotations

import dataclasses
import inspect
import json
import pathlib
import subprocess
import tempfile

import pytest

from kvtier.vllm import _compat as vc


def test_vllm_is_the_tested_release() -> None:
    assert vc.vllm_version() == vc.TESTED_VLLM, (
        f"installed vLLM {vc.vllm_version()}, kvtier tested with {vc.TESTED_VLLM}: rerun this file and update TESTED_VLLM"
    )


def test_secondary_tier_contract() -> None:
    cls = vc.SecondaryTierManager
    assert cls.__abstractmethods__ == {
        "lookup", "submit_store", "submit_load", "get_finished_jobs", "on_new_request", "drain_jobs",
    }
    for name in ("has_pending_work", "take_events", "touch", "on_request_finished", "on_schedule_end", "shutdown"):
        assert callable(getattr(cls, name)), name
    params = list(inspect.signature(cls.__init__).parameters)
    assert params == ["self", "offloading_spec", "primary_kv_view", "tier_type", "backpressure_detector"], params
    assert cls.medium is None
    from kvtier.vllm.tier import KvtierSecondaryTier

    assert issubclass(KvtierSecondaryTier, cls) and not KvtierSecondaryTier.__abstractmethods__


def test_factory_passes_the_entry_as_keywords() -> None:
    src = inspect.getsource(vc.SecondaryTierFactory.create_secondary_tier)
    for needle in ("offloading_spec=offloading_spec", "primary_kv_view=primary_kv_view", "tier_type=tier_type", "**config"):
        assert needle in src, needle
    assert list(inspect.signature(vc.SecondaryTierFactory.create_secondary_tier).parameters) == ["tier_config", "primary_kv_view", "offloading_spec"]
    assert list(inspect.signature(vc.SecondaryTierFactory.register_tier).parameters) == ["tier_type", "module_path", "class_name"]


def test_job_and_event_types() -> None:
    names = lambda c: [f.name for f in dataclasses.fields(c)]  # noqa: E731
    assert names(vc.TransferJob)[:5] == ["job_id", "keys", "chunk_ids", "is_promotion", "req_context"]
    assert names(vc.JobResult)[:3] == ["job_id", "success", "successful_keys"]
    assert {"keys", "medium", "removed", "locality"} <= set(names(vc.OffloadingEvent))
    assert {"req_id", "kv_transfer_params", "load_tier_filter"} <= set(names(vc.ReqContext))
    assert {m.name for m in vc.LookupResult} == {"MISS", "HIT", "HIT_PENDING", "RETRY"}
    assert {m.name for m in vc.Medium} == {"CPU", "STORAGE"} and {m.name for m in vc.Locality} == {"LOCAL", "REMOTE"}
    vc.RequestOffloadingContext()  # default-constructible
    assert vc.ScheduleEndContext._fields == ("new_req_ids", "preempted_req_ids")


def test_spec_and_region_fields() -> None:
    """The fields region_layout and region_fd read, on a real spec with a
    real region."""
    from conftest import offloading_config
    from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion
    from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

    spec = TieringOffloadingSpec(offloading_config({"cpu_bytes_to_use": 4 * 4096}))
    for attr in ("num_chunks", "kv_bytes_per_chunk", "cpu_page_size_per_worker", "replicated_layout",
                 "tokens_per_block", "tokens_per_hash", "blocks_per_chunk", "kv_events_config", "_engine_id"):
        assert hasattr(spec, attr), attr
    src = inspect.getsource(TieringOffloadingSpec.get_manager)
    # The region is on the spec before the first tier is built.
    assert src.index("self._scheduler_mmap = scheduler_mmap") < src.index("SecondaryTierFactory.create_secondary_tier")
    region = SharedOffloadRegion(engine_id=spec._engine_id, num_chunks=spec.num_chunks, rank=None,
                                 kv_bytes_per_chunk=spec.kv_bytes_per_chunk, cpu_page_size=spec.cpu_page_size_per_worker)
    try:
        assert isinstance(region.fd, int) and len(region._segments) == 1 and region.mmap_path.startswith("/dev/shm/")
        spec._scheduler_mmap = region
        view = memoryview(region.create_kv_memoryview())
        layout = vc.region_layout(spec, view)
        assert layout["num_blocks"] == 4 and layout["row_stride"] == 4096 and layout["model"] == "tiny-llama"
        fd = vc.region_fd(spec)
        import os

        assert os.fstat(fd).st_size == 4 * 4096
        os.close(fd)
    finally:
        region.cleanup()


def test_plugin_registers_the_tier_type() -> None:
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    load_general_plugins()  # twice is harmless
    from kvtier.vllm.tier import KvtierSecondaryTier

    assert vc.SecondaryTierFactory.get_tier_class({"type": "kvtier"}) is KvtierSecondaryTier


def test_importing_kvtier_vllm_imports_no_vllm() -> None:
    code = "import sys, kvtier.vllm; print(sorted(m for m in ('vllm', 'torch', 'numpy') if m in sys.modules))"
    out = subprocess.run([__import__("sys").executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


FILTERS = [
    None,
    [],
    [{"medium": "storage"}],
    [{"medium": "CPU", "locality": "remote"}],
    [{"locality": "local"}],
    [{"medium": "storage", "locality": "local"}, {"medium": "cpu"}],
    [{"medium": "tape"}],
    [{"medium": "tape"}, {"medium": "cpu"}],
    [{}],
    ["storage"],
    "storage",
]


@pytest.mark.parametrize("raw", FILTERS, ids=lambda r: json.dumps(r))
def test_load_filter_decisions_match_vllms(kvtier_bin: str, raw: object) -> None:
    """kvtier's parser (kvtier explain, lenient like vLLM) allows exactly
    the tiers vLLM's _parse_tier_filter does, on every medium/locality."""
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler import _parse_tier_filter
    from vllm.v1.kv_offload.base import TierFilter

    root = pathlib.Path(__file__).resolve().parents[2]
    decls = {"cpu-local": ("CPU", "LOCAL"), "cpu-remote": ("CPU", "REMOTE"), "storage-local": ("STORAGE", "LOCAL"), "storage-remote": ("STORAGE", "REMOTE")}
    cfg = pathlib.Path(tempfile.mkdtemp()) / "k.yaml"
    cfg.write_text("secondary_tiers:\n" + "".join(
        f"  - {{name: {n}, type: memory, medium: {m.lower()}, locality: {loc.lower()}}}\n" for n, (m, loc) in decls.items()))
    params = {} if raw is None else {"kv_load_tiers": raw}
    out = subprocess.run([kvtier_bin, "explain", "--config", str(cfg), "--params", json.dumps(params), "--json"],
                         capture_output=True, text=True, cwd=root)
    assert out.returncode == 0, out.stderr
    kvtier_allows = set(json.loads(out.stdout)["load"])
    f = TierFilter.ALL if raw is None else _parse_tier_filter(raw)
    vllm_allows = {n for n, (m, loc) in decls.items() if f.allows(vc.Medium[m], vc.Locality[loc])}
    assert kvtier_allows == vllm_allows, (kvtier_allows, vllm_allows)


def test_manager_mode_symbols() -> None:
    assert {"lookup", "prepare_load", "prepare_store", "on_new_request"} <= vc.OffloadingManager.__abstractmethods__
    for name in ("touch", "complete_load", "complete_store", "on_request_finished", "take_events",
                 "on_schedule_end", "has_pending_work", "reset_cache", "shutdown", "lock"):
        assert hasattr(vc.OffloadingManager, name), name
    assert [f.name for f in dataclasses.fields(vc.PrepareStoreOutput)] == ["keys_to_store", "store_spec", "evicted_keys"]
    assert hasattr(vc.CPULoadStoreSpec([1]), "chunk_ids")
    assert list(inspect.signature(vc.CPUOffloadingWorker.__init__).parameters) == [
        "self", "kv_caches", "blocks_per_chunk", "num_cpu_chunks", "mmap_region", "canonical_layout"]
    assert {"get_manager", "get_worker"} <= vc.OffloadingSpec.__abstractmethods__
    from kvtier.vllm.manager import KvtierProxyManager
    from kvtier.vllm.spec import KvtierOffloadingSpec

    assert not KvtierProxyManager.__abstractmethods__ and not KvtierOffloadingSpec.__abstractmethods__


def test_arena_region_sets_every_field_vllms_region_has() -> None:
    """ArenaRegion skips SharedOffloadRegion.__init__: it must set every
    instance field a real region has (vLLM's worker and region methods read
    them), and its views must address the rows as vLLM's do."""
    import os

    import torch

    from kvtier.vllm.spec import ArenaRegion

    real = vc.SharedOffloadRegion(engine_id="kvtier-compat-" + os.urandom(4).hex(), num_chunks=4, rank=1,
                                  kv_bytes_per_chunk=8192, cpu_page_size=4096)
    fd = os.memfd_create("kvtier-compat")
    os.ftruncate(fd, 4 * 8192)
    ours = ArenaRegion(fd, 4, 8192, 4096, 1)
    try:
        missing = set(vars(real)) - set(vars(ours))
        assert not missing, f"ArenaRegion lacks {sorted(missing)}"
        v_real, v_ours = real.create_next_worker_view(1024), ours.create_next_worker_view(1024)
        assert v_real.shape == v_ours.shape and v_real.stride() == v_ours.stride()
        assert v_real.storage_offset() == v_ours.storage_offset() == 4096
        v_ours[2].fill_(7)
        assert int(ours.base_tensor[2 * 8192 + 4096]) == 7 and int(ours.base_tensor[2 * 8192 + 4095]) == 0
        assert isinstance(ours.base_tensor, torch.Tensor)
    finally:
        real.cleanup()
        ours.cleanup()


def test_manager_mode_reattach_assumptions() -> None:
    """What manager mode's reattach relies on (kvtier/vllm/manager.py,
    spec.ArenaWorker), pinned against the installed vLLM:

    * a step submits the stores deferred from the last step before its own
      loads, so every job of an old epoch reaches the worker before any of
      the next;
    * vLLM cannot fail a transfer (it asserts every job's success), so jobs
      in flight at a restart finish against the mapping they started in;
    * on_schedule_end is the step's last manager call (switches happen
      there or before the step's first lookup);
    * vLLM 0.33 calls on_reset_flushed once a reset's jobs are done."""
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading import scheduler, worker

    src = inspect.getsource(worker.OffloadingConnectorWorker.start_kv_transfers)
    assert src.index("_unsubmitted_store_jobs") < src.index("metadata.load_jobs"), src
    assert "assert transfer_result.success" in inspect.getsource(worker.OffloadingConnectorWorker.get_finished)
    build = inspect.getsource(scheduler.OffloadingConnectorScheduler._build_connector_meta)
    tail = [ln.strip() for ln in build.rstrip().splitlines()[-3:]]
    assert tail[-2].startswith("self.manager.on_schedule_end(") and tail[-1] == "return meta", tail
    assert vc.RESET_FLUSH_CALLBACK == (vc.vllm_version() >= "0.33")


def test_request_keys_are_recorded_before_the_first_lookup() -> None:
    """The manager's first-sight lookup reads a request's keys from the
    ReqContext, which vLLM's connector fills (update_offload_keys, in
    prefix order) right before it scans the request's keys with lookup."""
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading import scheduler as sched

    rc = vc.ReqContext(req_id="r")
    for i in range(3):
        rc.set_offload_key_position(vc.OffloadKey(bytes([i]) * 8), (i + 1) * 16)
    assert vc.request_keys(rc, bytes([1]) * 8, 4096) == [bytes([1]) * 8, bytes([2]) * 8]
    assert vc.request_keys(rc, bytes([0]) * 8, 2) == [bytes([0]) * 8, bytes([1]) * 8]
    assert vc.request_keys(rc, b"absent", 4096) is None
    src = inspect.getsource(sched.OffloadingConnectorScheduler.get_num_new_matched_tokens)
    assert src.index("req_status.update_offload_keys()") < src.index("self._lookup(req_status")
    upd = inspect.getsource(sched.RequestOffloadState.update_offload_keys)
    assert "set_offload_key_position" in upd
