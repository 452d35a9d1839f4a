"""Tier mode when things go wrong: no daemon at start, a daemon killed
while jobs are in flight (vLLM keeps serving; kvtier comes back), a
region of the wrong size, and two engines on one daemon."""

from __future__ import annotations

import os
import pathlib
import tempfile
from typing import Any

import pytest

from conftest import AS_TENANT, Daemon, daemon_config, wait_until
from test_tier_mode import block, build, ctx, key, lookup_until, settle, step, store, view


def test_no_daemon_at_start_names_the_target(tmp_path: pathlib.Path) -> None:
    from kvtier.vllm._region import DaemonUnavailable

    sock = str(tmp_path / "nobody.sock")
    fake = Daemon.__new__(Daemon)
    fake.sock = sock
    with pytest.raises(DaemonUnavailable) as e:
        build(fake)
    assert sock in str(e.value) and "kvtier serve" in str(e.value)


def test_daemon_killed_mid_job_then_back(kvtier_bin: str) -> None:
    d = pathlib.Path(tempfile.mkdtemp(prefix="kvt"))
    # A slow memory tier keeps the cascade in flight while the daemon dies.
    slow = "  - {name: slow, type: memory, medium: storage, locality: remote, latency: 2s}\n"
    daemon = Daemon(kvtier_bin, d, daemon_config(d, slow)).start()
    spec, mgr = build(daemon, chunks=4)
    tier = mgr.secondary_tiers[0]
    try:
        c = ctx("r1")
        mgr.on_new_request(c)
        store(mgr, c, [1])
        wait_until(lambda: (step(mgr), tier.has_pending_work())[1], 10, "the cascade to be in flight")
        daemon.kill()
        # The job fails once the daemon is gone, and the tier notices (its
        # results stream ends: on a busy machine after the job's failure);
        # vLLM's primary still serves the block it holds.
        settle(mgr, 20)
        wait_until(lambda: (step(mgr), tier.region_id is None)[1], 20, "the tier to notice the daemon is gone")
        assert mgr.lookup(key(1), c).name == "HIT"
        # A block that is not in the primary is a miss, not an error.
        assert mgr.lookup(key(99), c).name == "MISS"
        mgr.on_request_finished(c)

        # The daemon comes back: the tier registers the region again and
        # cascades reach the daemon's tiers once more.
        daemon.start()
        wait_until(lambda: (step(mgr), tier.region_id is not None)[1], 20, "the tier to reconnect")
        c2 = ctx("r2")
        mgr.on_new_request(c2)
        store(mgr, c2, [2])
        settle(mgr, 20)
        st = daemon.tier_stats(tier.namespace)
        assert st["disk"].cascades_ok >= 1, st
        mgr.on_request_finished(c2)
    finally:
        mgr.shutdown()
        daemon.stop()


def test_region_of_the_wrong_size_is_refused(daemon: Daemon, tmp_path: pathlib.Path) -> None:
    from kvtier.vllm._region import register

    f = tmp_path / "region"
    f.write_bytes(b"\0" * 3 * 4096)
    fd = os.open(f, os.O_RDWR)
    layout = {"num_blocks": 4, "row_stride": 4096, "blocks_per_chunk": 1, "model": "m", "dtype": "float16", "world_size": 1}
    try:
        with pytest.raises(ValueError) as e:
            register(daemon.sock, layout, fd, 10)
        assert "12288 bytes" in str(e.value) and "4 blocks of 4096 bytes" in str(e.value)
    finally:
        os.close(fd)


def test_two_engines_share_blocks(daemon: Daemon) -> None:
    _, m1 = build(daemon, chunks=4)
    _, m2 = build(daemon, chunks=8)
    try:
        t1, t2 = m1.secondary_tiers[0], m2.secondary_tiers[0]
        assert t1.region_id != t2.region_id and t1.namespace == t2.namespace
        c = ctx("same-id")
        m1.on_new_request(c)
        store(m1, c, [7])
        settle(m1)
        m1.on_request_finished(c)
        # Engine 2 has never seen block 7, and uses the same request id.
        c2 = ctx("same-id")
        m2.on_new_request(c2)
        lookup_until(m2, key(7), c2, "HIT")
        out = m2.prepare_load([key(7)], c2)
        assert bytes(view(m2)[int(out.chunk_ids[0])]) == block(7).tobytes()
        m2.complete_load([key(7)], c2)
        m2.on_request_finished(c2)
        settle(m2)
    finally:
        m1.shutdown()
        m2.shutdown()


@pytest.mark.skipif(AS_TENANT, reason="configures its own tokens")
def test_engines_of_two_tenants_keep_their_blocks_apart(kvtier_bin: str) -> None:
    """Tier-mode engines with tenants' tokens: each region is its tenant's,
    so an acme engine finds what another acme engine stored and a beta
    engine on the same layout does not."""
    d = pathlib.Path(tempfile.mkdtemp(prefix="kvt"))
    admin, acme, beta = "admin-token-0123456789ab", "acme-token-0123456789ab", "beta-token-0123456789ab"
    cfg = daemon_config(d).replace("shutdown_timeout: 20s", f"shutdown_timeout: 20s, auth_token: {admin}")
    cfg += (f"tenants:\n  - {{name: acme, token: {acme}, namespaces: [default]}}\n"
            f"  - {{name: beta, token: {beta}, namespaces: [default]}}\n")
    daemon = Daemon(kvtier_bin, d, cfg).start()
    daemon.token = admin

    def tier(token: str) -> dict[str, Any]:
        return {"type": "kvtier", "target": "unix://" + daemon.sock, "token": token}

    tf = d / "acme.token"  # one of acme's engines reads its token from a file (token_file)
    tf.write_text(acme + "\n")
    tf.chmod(0o600)
    _, a1 = build(daemon, chunks=4, tier={"type": "kvtier", "target": "unix://" + daemon.sock, "token_file": str(tf)})
    _, a2 = build(daemon, chunks=8, tier=tier(acme))
    _, b = build(daemon, chunks=8, tier=tier(beta))
    try:
        c = ctx("r")
        a1.on_new_request(c)
        store(a1, c, [7])
        settle(a1)
        a1.on_request_finished(c)
        cb = ctx("r")
        b.on_new_request(cb)
        assert "HIT" not in lookup_until(b, key(7), cb, "MISS")
        b.on_request_finished(cb)
        c2 = ctx("r")
        a2.on_new_request(c2)
        lookup_until(a2, key(7), c2, "HIT")
        out = a2.prepare_load([key(7)], c2)
        assert bytes(view(a2)[int(out.chunk_ids[0])]) == block(7).tobytes()
        a2.complete_load([key(7)], c2)
        a2.on_request_finished(c2)
        settle(a2)
    finally:
        for m in (a1, a2, b):
            m.shutdown()
        daemon.stop()
