"""kvtier.sglang against the real sglang package (0.5.23, in .venv-sglang:
scripts/sglang-env.sh) and a real `kvtier serve` in manager mode.

SGLang's host KV pools, its backend factory and its HiCacheController run
here on CPU: the pages the tests write and read are SGLang's own host-pool
pages, and the controller's backup and prefetch threads drive the backend
as they do in a server.
"""

from __future__ import annotations

import pathlib
import signal
import tempfile
import threading
from queue import Empty
from typing import Any, Iterator

import pytest

import torch  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig  # noqa: E402
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool  # noqa: E402
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost  # noqa: E402
from sglang.srt.mem_cache.storage import StorageBackendFactory  # noqa: E402

from conftest import AS_TENANT, Daemon, engine_daemon_config, wait_until  # noqa: E402
from kvtier.sglang import _compat as sc  # noqa: E402
from kvtier.sglang.storage import KvtierHiCacheStorage, layout_of  # noqa: E402

PS, LAYERS, HEADS, DIM = 64, 4, 2, 64  # a page: 2 x 64 x 4 x 2 x 64 bf16 = 128 KiB


def test_pinned_version() -> None:
    import importlib.metadata as md

    assert md.version("sglang") == sc.SGLANG_VERSION


def host_pool(layout: str = "page_first") -> Any:
    kv = MHATokenToKVPool(1024, PS, torch.bfloat16, HEADS, DIM, LAYERS, "cpu", False, start_layer=0, end_layer=LAYERS)
    host = MHATokenToKVPoolHost(kv.get_device_pool_infos()[0].buffer_info, 4.0, 0, PS, layout, pin_memory=False,
                                device="cpu", device_capacity_tokens=kv.size, start_layer=0, end_layer=LAYERS,
                                write_back_staging=kv.hicache_write_back_staging)
    host.kv_buffer.copy_(torch.randn(host.kv_buffer.shape).to(torch.bfloat16))
    host.device_pool = kv  # kept alive with the host pool
    return host


def storage_config(extra: dict[str, Any], *, tp_rank: int = 0, tp_size: int = 1, mla: bool = False,
                   model: str = "tiny-sgl") -> HiCacheStorageConfig:
    return HiCacheStorageConfig(
        tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1, is_mla_model=mla,
        enable_storage_metrics=False, is_page_first_layout=True, model_name=model,
        extra_config={"backend_name": "kvtier", "module_path": "kvtier.sglang", "class_name": "KvtierHiCacheStorage",
                      **extra})


@pytest.fixture
def engine_daemon(kvtier_bin: str) -> Iterator[Daemon]:
    d = pathlib.Path(tempfile.mkdtemp(prefix="kvs"))
    dm = Daemon(kvtier_bin, d, engine_daemon_config(d, "4MiB")).start()  # 32 pages
    yield dm
    dm.stop()


def backend(daemon: Daemon, host: Any, **extra: Any) -> KvtierHiCacheStorage:
    cfg = storage_config({"target": "unix://" + daemon.sock, "timeout_s": 10, "lookup_timeout_s": 30, **extra})
    b = StorageBackendFactory.create_backend("dynamic", cfg, host)
    b.register_mem_pool_host(host)
    assert isinstance(b, KvtierHiCacheStorage)
    # With KVTIER_TEST_AS_TENANT (and no token of its own) the backend is
    # the tenant "suite", in an engine namespace of its own.
    if b._link is not None and "token" not in extra and "token_file" not in extra:
        assert b._link.namespace.endswith("~suite") == AS_TENANT, b._link.namespace
    return b


def keys(tag: str, n: int) -> list[str]:
    import hashlib

    return [hashlib.sha256(f"{tag}-{i}".encode()).hexdigest() for i in range(n)]


def pages(first: int, n: int) -> torch.Tensor:
    """Host indices of n pages from page `first` of the pool."""
    return torch.arange(first * PS, (first + n) * PS)


def page_bytes(host: Any, page: int) -> torch.Tensor:
    return host.get_data_page(page * PS, flat=True).clone()


def disk(daemon: Daemon, b: KvtierHiCacheStorage) -> Any:
    return daemon.tier_stats(b._link.namespace)["disk"]  # type: ignore[union-attr]


def store_on_disk(daemon: Daemon, b: KvtierHiCacheStorage, ks: list[str], first: int) -> None:
    """Stores pages in batches of 8 and waits until each is on disk (the
    cascade pin budget, a quarter of the 32-slot primary, would drop the
    cascade of a larger burst: the pages would stay in the primary only)."""
    for i in range(0, len(ks), 8):
        st = disk(daemon, b)
        n = len(ks[i:i + 8])
        assert b.batch_set_v1(ks[i:i + 8], pages(first + i % 16, n)) == [True] * n

        def done(blocks: int = st.blocks + n, jobs: int = st.cascades_ok + 1) -> bool:
            now = disk(daemon, b)
            assert now.cascades_dropped == st.cascades_dropped, dict(now.cascades_dropped_by_reason)
            # Blocks are on disk once written; the job's pins are released
            # when the daemon has seen it end (cascades_ok counts jobs).
            return now.blocks >= blocks and now.cascades_ok >= jobs

        wait_until(done, what="pages on disk")


def test_factory_resolves_dynamic_config(engine_daemon: Daemon) -> None:
    host = host_pool()
    cfg = storage_config({"target": "unix://" + engine_daemon.sock})
    b = StorageBackendFactory.create_backend("dynamic", cfg, host)
    assert type(b) is KvtierHiCacheStorage
    # The zero-copy interface is switched on for the controller.
    assert cfg.extra_config["interface_v1"] == 1
    b.close()
    with pytest.raises(ValueError, match="kv_store_tier"):
        StorageBackendFactory.create_backend("dynamic", storage_config({"kv_store_tier": []}), host)
    with pytest.raises(ValueError, match="timeout_s"):
        StorageBackendFactory.create_backend("dynamic", storage_config({"timeout_s": "soon"}), host)


def test_set_evict_get_from_fs(engine_daemon: Daemon) -> None:
    host = host_pool()
    b = backend(engine_daemon, host)
    a = keys("a", 8)
    store_on_disk(engine_daemon, b, a, 0)
    # 32 more pages fill the 32-slot primary: every page of A leaves it.
    store_on_disk(engine_daemon, b, keys("b", 32), 8)
    before = disk(engine_daemon, b).bytes_in
    assert b.batch_exists(a) == 8
    assert disk(engine_daemon, b).bytes_in >= before + 8 * b._page_bytes, "A must have come back from the fs tier"
    assert b.batch_get_v1(a, pages(40, 8)) == [True] * 8
    for i in range(8):
        assert torch.equal(page_bytes(host, 40 + i), page_bytes(host, i)), f"page {i}"
    b.close()


@pytest.mark.skipif(AS_TENANT, reason="configures its own tokens")
@pytest.mark.parametrize("who", ["admin", "tenant"])
def test_a_backend_with_a_token_maps_its_arena_by_ticket(kvtier_bin: str, who: str) -> None:
    """A daemon with tokens hands the arena only against the attach's
    ticket: the backend with the token (the admin's, or a tenant's, which
    attaches to a namespace and arena of the tenant's own) round-trips
    pages through the mapped arena; without it the attach is refused and
    it serves misses."""
    admin, tenant = "admin-token-0123456789abcdef", "acme-token-0123456789abcdef"
    d = pathlib.Path(tempfile.mkdtemp(prefix="kvs"))
    cfg = engine_daemon_config(d, "4MiB").replace("shutdown_timeout: 20s", f"shutdown_timeout: 20s, auth_token: {admin}")
    cfg += f"tenants:\n  - {{name: acme, token: {tenant}, namespaces: [default]}}\n"
    dm = Daemon(kvtier_bin, d, cfg).start()
    dm.token = admin
    try:
        host = host_pool()
        tf = d / "token"  # the tenant's token from a file, as a deployment passes a Secret
        tf.write_text(tenant + "\n")
        tf.chmod(0o600)
        b = backend(dm, host, token=admin) if who == "admin" else backend(dm, host, token_file=str(tf))
        assert b._link is not None and b._link.namespace.endswith("~acme") == (who == "tenant")
        a = keys("t", 4)
        assert b.batch_set_v1(a, pages(0, 4)) == [True] * 4
        assert b.batch_get_v1(a, pages(8, 4)) == [True] * 4
        for i in range(4):
            assert torch.equal(page_bytes(host, 8 + i), page_bytes(host, i)), f"page {i}"
        b.close()
        anon = backend(dm, host_pool())
        assert anon.batch_exists(a) == 0
        anon.close()
    finally:
        dm.stop()


def test_exists_counts_the_leading_run(engine_daemon: Daemon) -> None:
    host = host_pool()
    b = backend(engine_daemon, host)
    ks = keys("p", 4)
    assert b.batch_set_v1([ks[0], ks[1], ks[3]], torch.cat([pages(0, 2), pages(3, 1)])) == [True] * 3
    assert b.batch_exists(ks) == 2
    assert b.batch_exists([ks[2]] + ks) == 0
    assert b.batch_exists([]) == 0
    assert b.batch_exists(keys("none", 5)) == 0
    assert b.exists(ks[3]) and not b.exists(ks[2])
    # get answers per page; only the stored ones load.
    assert b.batch_get_v1(ks, pages(10, 4)) == [True, True, False, True]
    assert torch.equal(page_bytes(host, 13), page_bytes(host, 3))
    b.close()


def test_generic_interface(engine_daemon: Daemon) -> None:
    """batch_set / batch_get with flat page tensors (SGLang without interface_v1)."""
    host = host_pool()
    b = backend(engine_daemon, host, interface_v1=0)
    ks = keys("g", 3)
    vals = [host.get_data_page(i * PS, flat=True) for i in range(3)]
    assert b.batch_set(ks, vals)
    outs = [host.get_dummy_flat_data_page() for _ in range(3)]
    got = b.batch_get(ks + keys("missing", 1), outs + [host.get_dummy_flat_data_page()])
    assert got[3] is None
    for i in range(3):
        assert torch.equal(got[i], vals[i])
    assert b.set(keys("one", 1)[0], vals[0]) and torch.equal(b.get(keys("one", 1)[0]), vals[0])
    b.close()


def test_filters(engine_daemon: Daemon) -> None:
    host = host_pool()
    b = backend(engine_daemon, host)
    cpu_only = backend(engine_daemon, host, kv_store_tiers=[], kv_load_tiers=[])
    assert cpu_only._link.namespace == b._link.namespace  # type: ignore[union-attr]
    kept = keys("kept", 8)
    assert cpu_only.batch_set_v1(kept, pages(0, 8)) == [True] * 8
    wait_until(lambda: disk(engine_daemon, b).cascades_filtered >= 1, what="the store filter")
    assert disk(engine_daemon, b).blocks == 0
    # The primary has them: both see them.
    assert cpu_only.batch_exists(kept) == 8 and b.batch_exists(kept) == 8
    # Pages on disk only: the backend whose load filter excludes the disk misses.
    d = keys("disk", 8)
    store_on_disk(engine_daemon, b, d, 8)
    store_on_disk(engine_daemon, b, keys("flood", 32), 16)
    skipped = disk(engine_daemon, b).skipped_by_filter
    assert cpu_only.batch_exists(d) == 0
    assert disk(engine_daemon, b).skipped_by_filter > skipped
    assert b.batch_exists(d) == 8
    cpu_only.close()
    b.close()


def test_namespaces_follow_the_layout(engine_daemon: Daemon) -> None:
    first, layer_first = host_pool("page_first"), host_pool("layer_first")
    l_pf, _ = layout_of(first, storage_config({}))
    l_lf, _ = layout_of(layer_first, storage_config({}))
    assert l_pf["kv_cache_layout"] != l_lf["kv_cache_layout"]
    # MHA: each TP rank holds its own heads; MLA: every rank the same bytes.
    r0, _ = layout_of(first, storage_config({}, tp_rank=0, tp_size=2))
    r1, _ = layout_of(first, storage_config({}, tp_rank=1, tp_size=2))
    assert r0 != r1
    m0, _ = layout_of(first, storage_config({}, tp_rank=0, tp_size=2, mla=True))
    m1, _ = layout_of(first, storage_config({}, tp_rank=1, tp_size=4, mla=True))
    assert m0 == m1
    # Same layout, two servers: one namespace, shared pages; another layout never reads them.
    a, b2, c = backend(engine_daemon, first), backend(engine_daemon, host_pool("page_first")), backend(engine_daemon, layer_first)
    assert a._link.namespace == b2._link.namespace != c._link.namespace  # type: ignore[union-attr]
    ks = keys("shared", 4)
    assert a.batch_set_v1(ks, pages(0, 4)) == [True] * 4
    assert b2.batch_exists(ks) == 4 and c.batch_exists(ks) == 0
    for x in (a, b2, c):
        x.close()


def test_daemon_killed_mid_batch_then_back(engine_daemon: Daemon) -> None:
    host = host_pool()
    b = backend(engine_daemon, host, timeout_s=2, reconnect_interval_s=0.05)
    ks = keys("k", 8)
    assert b.batch_set_v1(ks, pages(0, 8)) == [True] * 8
    want = [page_bytes(host, i) for i in range(8)]
    errors: list[BaseException] = []
    wrong: list[int] = []
    calls = {"n": 0, "failed": 0}
    stop = threading.Event()

    def loop() -> None:
        try:
            while not stop.is_set():
                n = b.batch_exists(ks)
                ok = b.batch_get_v1(ks, pages(16, 8))
                for i, good in enumerate(ok):
                    if good and not torch.equal(page_bytes(host, 16 + i), want[i]):
                        wrong.append(i)
                b.batch_set_v1(keys("more", 4), pages(24, 4))
                calls["n"] += 1
                if n == 0 or not all(ok):
                    calls["failed"] += 1
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    t = threading.Thread(target=loop)
    t.start()
    wait_until(lambda: calls["n"] >= 3, what="calls before the kill")
    engine_daemon.kill()
    wait_until(lambda: calls["failed"] >= 3, what="calls answered as misses")
    assert b.batch_exists(ks) == 0 and b.batch_get_v1(ks, pages(16, 8)) == [False] * 8
    assert b.batch_set_v1(ks, pages(0, 8)) == [False] * 8
    engine_daemon.start()
    wait_until(lambda: b.counters["attaches"] >= 2, what="the backend attached again")
    stop.set()
    t.join(30)
    assert not errors, errors
    assert not wrong, f"wrong bytes served for pages {wrong}"
    # The restarted daemon's disk tier still has the pages (same root_dir).
    assert b.batch_exists(ks) == 8
    assert b.batch_get_v1(ks, pages(32, 8)) == [True] * 8
    assert all(torch.equal(page_bytes(host, 32 + i), want[i]) for i in range(8))
    b.close()


def test_slow_and_unreachable_daemon(engine_daemon: Daemon, kvtier_bin: str) -> None:
    host = host_pool()
    b = backend(engine_daemon, host, timeout_s=0.5, reconnect_interval_s=0.05)
    ks = keys("s", 4)
    assert b.batch_set_v1(ks, pages(0, 4)) == [True] * 4
    assert engine_daemon.proc is not None
    engine_daemon.pause()
    try:
        # Each call gives up after timeout_s; then misses at once.
        assert b.batch_exists(ks) == 0
        assert b.batch_get_v1(ks, pages(8, 4)) == [False] * 4
        assert b.counters["outages"] >= 1
    finally:
        engine_daemon.proc.send_signal(signal.SIGCONT)
    wait_until(lambda: b.counters["attaches"] >= 2, what="the backend attached again")
    assert b.batch_exists(ks) == 4
    b.close()
    # No daemon at all at start: registering does not raise, calls miss.
    d = pathlib.Path(tempfile.mkdtemp(prefix="kvs"))
    late = Daemon(kvtier_bin, d, engine_daemon_config(d, "4MiB"))
    lb = backend(late, host, reconnect_interval_s=0.05)
    assert lb.batch_exists(ks) == 0 and lb.batch_set_v1(ks, pages(0, 4)) == [False] * 4
    late.start()
    try:
        wait_until(lambda: lb.counters["attaches"] >= 1, what="the first attach")
        assert lb.batch_set_v1(ks, pages(0, 4)) == [True] * 4 and lb.batch_exists(ks) == 4
    finally:
        lb.close()
        late.stop()


def test_hicache_controller_on_cpu(engine_daemon: Daemon) -> None:
    """SGLang's own HiCacheController drives the backend: its backup
    thread writes pages, its prefetch threads query and load them."""
    from sglang.srt.managers.cache_controller import HiCacheController
    from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
    from sglang.srt.mem_cache.utils import get_storage_hash_str
    from sglang.srt.runtime_context import get_parallel

    get_parallel().override_permanently(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_dcp_size=1, attn_dcp_rank=0)
    host = host_pool()
    alloc = PagedTokenToKVPoolAllocator(1024, PS, torch.bfloat16, "cpu", host.device_pool, False)
    ctl = HiCacheController(alloc, host, PS, None, threading.Event(), io_backend="direct", storage_backend="dynamic",
                            model_name="tiny-sgl", storage_backend_extra_config={
                                "backend_name": "kvtier", "module_path": "kvtier.sglang",
                                "class_name": "KvtierHiCacheStorage", "target": "unix://" + engine_daemon.sock,
                                "lookup_timeout_s": 30})
    try:
        assert isinstance(ctl.storage_backend, KvtierHiCacheStorage)
        assert ctl.page_set_func == ctl._page_set_zero_copy
        tokens = list(range(1000, 1000 + 6 * PS))
        hashes = get_storage_hash_str(tokens, None, page_size=PS)
        assert len(hashes) == 6
        src = host.alloc(6 * PS)
        want = [host.get_data_page(int(src[i * PS]), flat=True).clone() for i in range(6)]
        ctl.write_storage(src, tokens, hash_value=hashes)
        op = ctl.ack_backup_queue.get(timeout=60)
        assert op.completed_tokens == 6 * PS
        pf = ctl.prefetch("req-1", tokens)
        hit = ctl.prefetch_hit_queue.get(timeout=60)
        assert hit is pf and hit.storage_hit_count == 6 * PS
        pf.host_indices = host.alloc(6 * PS)
        ctl.prefetch_buffer.put(pf)
        loaded = 0
        while True:
            try:
                ack = ctl.ack_prefetch_queue.get(timeout=60)
            except Empty:
                raise AssertionError("no prefetch ack") from None
            if ack.completed_req:
                break
            loaded = ack.completed_tokens
        assert loaded == 6 * PS
        for i in range(6):
            assert torch.equal(host.get_data_page(int(pf.host_indices[i * PS]), flat=True), want[i]), f"page {i}"
    finally:
        ctl.detach_storage_backend()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_operations_keep_the_invariants(engine_daemon: Daemon, seed: int) -> None:
    """Random sets, exists and gets (with and without the exists first) on
    a 32-page primary over a disk tier: every page served is the bytes
    stored under its key, no key never stored is reported present, and
    once the backend is idle no pin, request or stray lease is left on
    the daemon."""
    import random

    rng = random.Random(seed)
    host = host_pool()
    b = backend(engine_daemon, host, hold_s=0.2)
    ks = keys(f"m{seed}", 24)  # key i is always page i's bytes
    want = [page_bytes(host, i) for i in range(24)]
    stored: set[int] = set()
    for step in range(150):
        op = rng.choice(["set", "exists", "get", "exists+get"])
        idx = rng.sample(range(24), rng.randint(1, 8))
        if op == "set":
            ok = b.batch_set_v1([ks[i] for i in idx], torch.cat([pages(i, 1) for i in idx]))
            stored.update(i for i, good in zip(idx, ok) if good)
            continue
        n = len(idx)
        if op.startswith("exists"):
            hits = b.batch_exists([ks[i] for i in idx])
            assert 0 <= hits <= n
            assert all(i in stored for i in idx[:hits]), f"step {step}: a key never stored is present"
            if op == "exists":
                continue
            idx = idx[:hits]
        ok = b.batch_get_v1([ks[i] for i in idx], pages(24, len(idx)) if idx else torch.arange(0))
        for j, (i, good) in enumerate(zip(idx, ok)):
            if good:
                assert i in stored
                assert torch.equal(page_bytes(host, 24 + j), want[i]), f"step {step}: wrong bytes for key {i}"

    def idle() -> bool:
        with engine_daemon.client(b._link.namespace) as c:  # type: ignore[union-attr]
            st = c.stats()
        return (st.active_requests == 0 and st.primary.pinned_slots == 0
                and st.primary.leased_slots == len(b._link.free))  # type: ignore[union-attr]

    wait_until(idle, what="no pin, request or stray lease left")
    assert b.counters["failed_calls"] == 0
    b.close()


@pytest.mark.parametrize("layout", ["layer_first", "page_first", "page_first_direct"])
def test_every_page_layout_round_trips(engine_daemon: Daemon, layout: str) -> None:
    """A page of each host-pool layout (2 runs per page for page_first,
    2 x layers for layer_first) goes to the daemon and comes back into
    other pages of the pool byte for byte, through the zero-copy and the
    generic interfaces."""
    host = host_pool(layout)
    b = backend(engine_daemon, host)
    ks = keys(layout, 4)
    assert b.batch_set_v1(ks, pages(0, 4)) == [True] * 4
    assert b.batch_exists(ks) == 4
    assert b.batch_get_v1(ks, pages(8, 4)) == [True] * 4
    for i in range(4):
        assert torch.equal(page_bytes(host, 8 + i), page_bytes(host, i)), f"{layout} page {i}"
    flat = [host.get_dummy_flat_data_page() for _ in range(4)]
    got = b.batch_get(ks, flat)
    for i in range(4):
        assert got[i] is not None and torch.equal(got[i], page_bytes(host, i)), f"{layout} generic page {i}"
    b.close()
