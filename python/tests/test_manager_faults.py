"""Manager mode when the daemon goes away, through vLLM's real scheduler and
connector (vLLM's OffloadingSpecFactory builds KvtierOffloadingSpec from
the config block) and a real `kvtier serve`: killed (lookups MISS, the
engine keeps serving, nothing stalls), restarted on the same fs directory
(the engine attaches again, the old fs blocks come back byte for byte, new
stores land), stopped (a lookup waits at most lookup_timeout_s), two
engines through one restart, and a model test of random lifecycles."""

from __future__ import annotations

import os
import pathlib
import random
import tempfile
from typing import Any, Iterator

import pytest

from conftest import AS_TENANT, Daemon, engine_daemon_config, wait_until
from engine_harness import BLOCK, Engine, tiny_model_dir

BOUND = 0.5  # lookup_timeout_s of these engines


def prompt(seed: int, blocks: int = 4) -> list[int]:
    return [10 + (seed * 97 + i) % 400 for i in range(blocks * BLOCK + 3)]


def daemon_at(kvtier_bin: str, d: pathlib.Path) -> Daemon:
    return Daemon(kvtier_bin, d, engine_daemon_config(d, "1MiB"))


@pytest.fixture
def daemon(kvtier_bin: str) -> Iterator[Daemon]:
    dm = daemon_at(kvtier_bin, pathlib.Path(tempfile.mkdtemp(prefix="kvt"))).start()
    yield dm
    dm.stop()


def engine(daemon: Daemon, model: str, **kv: Any) -> Engine:
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    opts = {"target": "unix://" + daemon.sock, "lookup_timeout_s": BOUND, "reconnect_interval_s": 0.05, "timeout_s": 5,
            **kv}
    return Engine({"spec_name": "KvtierOffloadingSpec", "kvtier": opts}, model=model)


def serve(e: Engine, rid: str, tokens: list[int], params: dict[str, Any] | None = None) -> tuple[int, int]:
    """Runs one request to its end and the engine to idle (a step call in
    flight keeps it stepping, up to timeout_s when the daemon hangs);
    returns (blocks reused with the right bytes, blocks not computed
    here)."""
    e.add(rid, tokens, params)
    e.run(max_steps=20000)
    return e.reused[rid]


def cascaded(daemon: Daemon, ns: str, jobs: int = 1) -> bool:
    """Whether the disk tier has finished that many cascades (a job holds
    the blocks of one step)."""
    return daemon.tier_stats(ns)["disk"].cascades_ok >= jobs


def reattach(e: Engine, reattaches: int) -> None:
    wait_until(lambda: (e.step(), e.manager.reattaches >= reattaches and e.manager._up)[1], 30, "the engine to attach again")


def test_killed_daemon_misses_then_the_engine_reattaches(kvtier_bin: str) -> None:
    d = pathlib.Path(tempfile.mkdtemp(prefix="kvt"))
    daemon = daemon_at(kvtier_bin, d).start()
    e = engine(daemon, tiny_model_dir())
    try:
        m = e.manager
        ns, epoch = m._ns, m._epoch
        assert serve(e, "a", prompt(1)) == (0, 0)
        wait_until(lambda: cascaded(daemon, ns), 20, "the prefix on disk")
        daemon.kill()
        # Down: a new prompt is served at once, computed (MISS), and the
        # engine goes idle — no lookup waits on a dead daemon.
        assert serve(e, "b", prompt(2)) == (0, 0)
        assert m.outages == 1 and not m._up
        e.reset_prefix_cache()
        assert serve(e, "a2", prompt(1)) == (0, 0)  # the primary died with the daemon
        # Back on the same fs directory: the engine attaches to the new
        # namespace (another epoch), its worker maps the new arena, and the
        # prefix comes back from disk byte for byte.
        daemon.start()
        reattach(e, 1)
        assert m._ns == ns and m._epoch != epoch
        e.reset_prefix_cache()
        assert serve(e, "a3", prompt(1)) == (4, 4)
        assert e.worker.connector_worker.worker.epoch == m._epoch
        # New stores land on the new daemon.
        assert serve(e, "c", prompt(3)) == (0, 0)
        wait_until(lambda: cascaded(daemon, ns), 20, "the new prefix on disk")
        e.reset_prefix_cache()
        assert serve(e, "c2", prompt(3)) == (4, 4)
    finally:
        e.shutdown()
        daemon.stop()


ADMIN = "admin-token-0123456789abcdef"


TENANT = "acme-token-0123456789abcdef"


@pytest.mark.skipif(AS_TENANT, reason="configures its own tokens")
@pytest.mark.parametrize("who", ["admin", "tenant"])
def test_an_engine_with_a_token_maps_its_arena_by_ticket(kvtier_bin: str, who: str) -> None:
    """A daemon with tokens hands the arena only against a ticket of an
    authenticated call: the engine's workers take one of their own with
    the spec's token, also for the new epoch's arena after a restart. The
    same engine without the token is refused at its attach. With a
    tenant's token the engine gets a namespace (and an arena) of the
    tenant's own and serves exactly as with the admin's."""
    d = pathlib.Path(tempfile.mkdtemp(prefix="kvt"))
    cfg = engine_daemon_config(d, "1MiB").replace("shutdown_timeout: 20s", f"shutdown_timeout: 20s, auth_token: {ADMIN}")
    cfg += f"tenants:\n  - {{name: acme, token: {TENANT}, namespaces: [default]}}\n"
    daemon = Daemon(kvtier_bin, d, cfg).start()
    daemon.token = ADMIN
    with pytest.raises(RuntimeError, match="UNAUTHENTICATED"):
        engine(daemon, tiny_model_dir())
    tf = d / "token"  # the tenant's token from a file (token_file)
    tf.write_text(TENANT + "\n")
    tf.chmod(0o600)
    e = engine(daemon, tiny_model_dir(), token=ADMIN) if who == "admin" else engine(daemon, tiny_model_dir(), token_file=str(tf))
    try:
        m = e.manager
        ns, epoch = m._ns, m._epoch
        assert ns.endswith("~acme") == (who == "tenant")
        assert serve(e, "a", prompt(1)) == (0, 0)
        e.reset_prefix_cache()
        assert serve(e, "a1", prompt(1)) == (4, 4)  # through the mapped arena
        wait_until(lambda: cascaded(daemon, ns), 20, "the prefix on disk")
        daemon.kill()
        daemon.start()
        reattach(e, 1)
        assert m._epoch != epoch
        e.reset_prefix_cache()
        assert serve(e, "a2", prompt(1)) == (4, 4)
        assert e.worker.connector_worker.worker.epoch == m._epoch
    finally:
        e.shutdown()
        daemon.stop()


def test_a_stopped_daemon_holds_no_lookup_past_the_bound(daemon: Daemon) -> None:
    e = engine(daemon, tiny_model_dir(), timeout_s=2)
    try:
        m = e.manager
        assert serve(e, "a", prompt(1)) == (0, 0)
        assert daemon.proc is not None
        daemon.pause()
        try:
            # The daemon answers nothing: the request's lookups answer MISS
            # once lookup_timeout_s has passed, and it is served while the
            # daemon is still stopped.
            e.reset_prefix_cache()
            assert serve(e, "b", prompt(1)) == (0, 0)
            assert m.late_lookups >= 1
        finally:
            daemon.resume()
        # The stalled call times out; the engine attaches again (the same
        # daemon, a new session) and serves from kvtier once more.
        reattach(e, 1)
        e.reset_prefix_cache()
        wait_until(lambda: cascaded(daemon, m._ns), 20, "the prefix on disk")
        assert serve(e, "c", prompt(1)) == (4, 4)
    finally:
        e.shutdown()
    # Every session the engine opened ends with it: nothing stays pinned.
    wait_until(lambda: daemon.client(m._ns).stats().sessions == 0, 20, "the engine's sessions to end")
    assert daemon.client(m._ns).stats().primary.pinned_slots == 0


def test_a_slow_promotion_holds_no_lookup_past_the_bound(kvtier_bin: str) -> None:
    """The daemon answers "not sure yet" while a promotion from a slow tier
    is in flight, step after step: the key is asked again, and the bound
    still runs from its first ask, so the request is served (computed) at
    the bound rather than when the tier gets round to it."""
    d = pathlib.Path(tempfile.mkdtemp(prefix="kvt"))
    daemon = Daemon(kvtier_bin, d, f"""
namespace: {{model: unused, bytes_per_block: 4KiB}}
primary: {{bytes: 0}}
engines: {{primary_bytes: 1MiB}}
secondary_tiers:
  - {{name: slow, type: memory, medium: storage, locality: local, latency: 3s}}
server: {{unix_socket: {d}/k.sock, tcp_addr: "", metrics_addr: "", shutdown_timeout: 20s}}
""").start()
    e = engine(daemon, tiny_model_dir())
    try:
        m = e.manager
        probe = Probe(e)
        assert serve(e, "a", prompt(1)) == (0, 0)
        wait_until(lambda: daemon.tier_stats(m._ns)["slow"].cascades_ok >= 1, 30, "the prefix on the slow tier")
        e.reset_prefix_cache()  # the primary forgets it: only the slow tier has it
        assert serve(e, "b", prompt(1)) == (0, 0)
        assert m.late_lookups >= 1 and not probe.late, (m.late_lookups, probe.late)
    finally:
        e.shutdown()
        daemon.stop()


def test_two_engines_reattach_through_one_restart(kvtier_bin: str) -> None:
    d = pathlib.Path(tempfile.mkdtemp(prefix="kvt"))
    daemon = daemon_at(kvtier_bin, d).start()
    model = tiny_model_dir()
    e1, e2 = engine(daemon, model), engine(daemon, model)
    try:
        assert serve(e1, "a", prompt(1)) == (0, 0)
        daemon.kill()
        daemon.start()
        reattach(e1, 1)
        reattach(e2, 1)
        assert e1.manager._ns == e2.manager._ns and e1.manager._epoch == e2.manager._epoch
        # Stored by engine 1 after the restart, loaded by engine 2.
        assert serve(e1, "b", prompt(2)) == (0, 0)
        assert serve(e2, "b", prompt(2)) == (4, 4)
    finally:
        e1.shutdown()
        e2.shutdown()
        daemon.stop()


def test_each_engine_is_a_session_of_its_own(daemon: Daemon) -> None:
    """The daemon's sessions are connections: two engines in one process
    (and an engine's old and new attach) must not share one, or one's
    leases and pins would be the other's and outlive it."""
    model = tiny_model_dir()
    e1, e2 = engine(daemon, model), engine(daemon, model)
    ns = e1.manager._ns
    try:
        n = e1.manager._min_free
        assert n > 1 and e2.manager._min_free == n
        wait_until(lambda: (e1.step(), e2.step(), len(e1.manager._pool) == len(e2.manager._pool) == n)[2], 20,
                   "both engines' first pools of store slots")
        assert daemon.client(ns).stats().primary.leased_slots == 2 * n
    finally:
        e1.shutdown()
    wait_until(lambda: daemon.client(ns).stats().primary.leased_slots == n, 20, "engine 1's slots to come back")
    e2.shutdown()
    wait_until(lambda: daemon.client(ns).stats().primary.leased_slots == 0, 20, "engine 2's slots to come back")


class Probe:
    """Wraps a manager's lookup: records, per (request, key), when it first
    answered RETRY (on the manager's clock) and any RETRY answered past the
    bound."""

    def __init__(self, e: Engine) -> None:
        self.first: dict[tuple[str, bytes], float] = {}
        self.late: list[tuple[str, bytes, float]] = []
        m = e.manager
        inner = m.lookup

        def lookup(key: Any, ctx: Any) -> Any:
            res = inner(key, ctx)
            k = (ctx.req_id, bytes(key))
            if res.name == "RETRY":
                t0 = self.first.setdefault(k, m._now)
                if m._now > t0 + m._lookup_timeout:
                    self.late.append((ctx.req_id, bytes(key), m._now - t0))
            else:
                self.first.pop(k, None)
            return res

        m.lookup = lookup  # type: ignore[method-assign]


class WorkerProbe:
    """Wraps an engine's ArenaWorker: every transfer it hands on must go
    through the mapping of the epoch its slots name, and every mapping it
    left must be unmapped (so a stray touch would fail, not read)."""

    def __init__(self, e: Engine) -> None:
        w = e.worker.connector_worker.worker
        self.bad: list[Any] = []
        self.regions: list[Any] = []

        def check(spec: Any) -> None:
            region = w._inner._region
            if not self.regions or self.regions[-1] is not region:
                self.regions.append(region)
            if getattr(spec, "epoch", None) != w.epoch or region.epoch != w.epoch:
                self.bad.append((spec.epoch, w.epoch, region.epoch))
            for old in self.regions[:-1]:
                if old.mmap_obj is not None:
                    self.bad.append(("still mapped", old.epoch))

        for name, arg in (("submit_store", 2), ("submit_load", 1)):
            inner = getattr(w, name)

            def wrapped(job_id: int, *a: Any, _inner: Any = inner, _arg: int = arg, **kw: Any) -> Any:
                ok = _inner(job_id, *a, **kw)
                # Handed on, unless skipped (a skipped store is answered at
                # once; a remap also moves the old mapping's results there,
                # but never this job's).
                if not any(r.job_id == job_id for r in w._done):
                    check(a[_arg - 1])
                return ok

            setattr(w, name, wrapped)


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5, 6])
def test_model_random_lifecycles(kvtier_bin: str, seed: int) -> None:
    """Random sequences of requests, cache resets, daemon kills and
    restarts, engine restarts, over two engines. After every request: its
    reused blocks carry the bytes the model computed; no lookup answered
    RETRY past the bound; every transfer went through the mapping of its
    slots' epoch, and every earlier mapping is unmapped. At the end: no pin and no session left on the daemon."""
    rng = random.Random(seed)
    d = pathlib.Path(tempfile.mkdtemp(prefix="kvt"))
    daemon = daemon_at(kvtier_bin, d).start()
    model = tiny_model_dir()
    engines = [engine(daemon, model), engine(daemon, model)]
    probes = [Probe(e) for e in engines]
    workers = [WorkerProbe(e) for e in engines]
    up, n, counts = True, 0, {"kill": 0, "start": 0, "engine": 0, "reset": 0, "serve": 0}
    try:
        for _ in range(24):
            op = rng.choices(["serve", "kill", "start", "engine", "reset"], [6, 1, 2, 1, 1])[0]
            i = rng.randrange(2)
            if op == "kill" and up:
                # Mid-request half the time: after a few steps of a request
                # whose loads and stores are in flight.
                mid = rng.random() < 0.5
                if mid:
                    n += 1
                    rid, toks = f"r{n}", prompt(rng.randrange(4))
                    engines[i].add(rid, toks)
                    for _ in range(rng.randrange(1, 4)):
                        engines[i].step()
                daemon.kill()
                up = False
                if mid:
                    engines[i].run(max_steps=20000)
                    good, total = engines[i].reused[rid]
                    assert good == total, (seed, n, good, total)
            elif op == "start" and not up:
                daemon.start()
                up = True
                for e in engines:
                    reattach(e, e.manager.reattaches + 1)
            elif op == "engine" and up:
                engines[i].shutdown()
                engines[i] = engine(daemon, model)
                probes[i] = Probe(engines[i])
                workers[i] = WorkerProbe(engines[i])
            elif op == "reset":
                engines[i].reset_prefix_cache()
            else:
                op = "serve"
                n += 1
                good, total = serve(engines[i], f"r{n}", prompt(rng.randrange(4)))
                assert good == total, (seed, n, good, total)
            counts[op] += 1
            if os.environ.get("KVTIER_TEST_TRACE"):
                st = daemon.client(engines[0].manager._ns).stats() if up else None
                print(op, i, [e.manager._gen for e in engines], st and (st.sessions, st.primary.leased_slots, st.primary.pinned_slots))
            for p in probes:
                assert not p.late, p.late
            for w in workers:
                assert not w.bad, w.bad
    finally:
        names = {e.manager._ns for e in engines}
        for e in engines:
            e.shutdown()
    try:
        for name in names if up else ():  # a daemon that is down holds nothing
            # The daemon ends a session when its connection closes.
            def released() -> bool:
                st = daemon.client(name).stats()
                return st.sessions == 0 and st.primary.pinned_slots == 0 and st.primary.leased_slots == 0

            wait_until(released, 20, "the engines' sessions to end and release every pin and leased slot")
    finally:
        daemon.stop()
    print(f"seed {seed}: {counts}")
    assert counts["serve"] >= 5, counts


def test_a_first_sight_answered_late_leaves_no_pin(daemon: Daemon) -> None:
    """A daemon stopped through a first sight: the engine stops waiting
    after its bound and asks again with the step's batch; the daemon,
    resumed, carries out the first sight all the same and leases the hits
    to the request. That late answer's leases are given back: once the
    request is served and finished nothing stays pinned, with the engine's
    session still open (a finished request keeps its pins on the daemon)."""
    model = tiny_model_dir()
    e1, e2 = engine(daemon, model), engine(daemon, model)
    try:
        assert serve(e1, "w", prompt(3)) == (0, 0)
        m = e2.manager
        ns = m._ns
        wait_until(lambda: not m._in_flight, 10, "engine 2 idle")
        assert daemon.proc is not None
        daemon.pause()
        try:
            e2.add("h", prompt(3))
            e2.step()  # its first sight waits out its bound: the daemon is stopped
            assert m.first_sight_failures == 1 and m.first_sights == 0
        finally:
            daemon.resume()
        wait_until(lambda: (e2.step(), m.late_answers >= 1)[1], 20, "the first sight's late answer")
        e2.run(max_steps=20000)
        assert e2.reused["h"] == (4, 4), e2.reused["h"]
        wait_until(lambda: (e2.step(), daemon.client(ns).stats().primary.pinned_slots == 0)[1], 20,
                   "the late first sight's leases to be given back")
    finally:
        e1.shutdown()
        e2.shutdown()
