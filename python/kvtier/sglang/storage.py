"""KvtierHiCacheStorage: a kvtier daemon as SGLang's HiCache L3.

SGLang's HiCacheController keeps KV pages in a host pool and writes them to
and reads them from its storage backend on threads of its own (backup,
prefetch query, prefetch I/O). This backend attaches to a kvtier daemon on
this host as a manager-mode engine (EngineAttach): the daemon keeps a
namespace for the pool's layout, its primary in a memfd arena this process
maps, and kvtier's configured tiers (fs, s3, redis, peers) behind it.

Data path: a page is copied once, between the host pool and an arena slot
(``memmove`` of the page's contiguous runs, without the GIL and without
torch's intra-op threads, which halve a 2 MiB copy's speed on a busy
machine), and each batch costs one step
call, not one call per page:

* ``batch_set_v1`` writes pages into free slots the daemon leased to this
  engine and binds them to their keys with one EngineStep (which also tops
  the lease pool up); the store filter of the step's request decides which
  tiers the pages cascade to.
* ``batch_exists`` sends the keys as one lookup; a page the primary holds
  is pinned for the call and answered with its slot, a page in a secondary
  tier is promoted and asked again (the daemon lets each step settle for a
  few milliseconds) until ``lookup_timeout_s``. The pins of the leading
  hits are *held* for ``hold_s`` so that the ``batch_get`` SGLang sends for
  the same pages next needs no call and cannot race an eviction.
* ``batch_get_v1`` copies held (or newly looked-up) slots into the pool;
  the unpins go with the next step (or a background flush).

Keys: SGLang's page hashes (SHA-256 hex) as their 32 bytes; other strings
as their SHA-256. The namespace is derived from the layout (model, dtype,
page size and bytes, pool layout and class, page shape, layers, and the TP
rank and size unless the model is MLA, whose KV is the same on every rank),
so two servers with the same layout share pages and never read another
layout's bytes. vLLM's namespaces are of other layouts: the two engines
share no pages.

Failures never raise into SGLang's threads: while the daemon is down,
unreachable or slow (a call past ``timeout_s``), lookups answer 0 pages,
gets and sets answer False, and a background thread attaches again every
``reconnect_interval_s``. A copy in flight when the daemon went away
finishes against the mapping it started on, whose slots stay reserved to
it until it is done.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, List

import torch

from kvtier import _daemon
from kvtier.sglang import _compat as sc
from kvtier.sglang import _link
from kvtier.sglang._options import Options
from kvtier.sglang._pages import copy_in, copy_out, layout_of, pack_keys, storage_key  # noqa: F401 (layout_of: API)
from kvtier.v1 import kvtier_pb2 as pb

log = logging.getLogger("kvtier.sglang")

_MAX_FREE = 4096  # the daemon's bound on one engine's leased free slots


# A held pin: (link, request id, slot, expiry), by SGLang key.
_Pin = tuple  # (_link.Link, str, int, float)


def _answer(rep: Any, rid: str) -> Any:
    for lk in rep.lookups:
        if lk.request_id == rid:
            return lk
    return None


class KvtierHiCacheStorage(sc.HiCacheStorage):
    """SGLang HiCache storage backed by a kvtier daemon on this host.

    Load it with::

        --hicache-storage-backend dynamic
        --hicache-storage-backend-extra-config '{"backend_name": "kvtier",
          "module_path": "kvtier.sglang", "class_name": "KvtierHiCacheStorage",
          "target": "unix:///run/kvtier/kvtier.sock"}'
    """

    def __init__(self, storage_config: Any, kwargs: Any = None) -> None:
        extra = storage_config.extra_config if storage_config.extra_config is not None else {}
        self.options = Options.parse(extra)
        if isinstance(storage_config.extra_config, dict) and sc.INTERFACE_V1 not in storage_config.extra_config:
            # SGLang reads the switch after building the backend: without
            # it every page would be copied twice (into a scratch page and
            # then into the pool).
            storage_config.extra_config[sc.INTERFACE_V1] = 1
        self.storage_config = storage_config
        self.mem_pool_host: Any = None
        self._layout: dict[str, Any] | None = None
        self._page_bytes = 0
        self._mu = threading.Lock()
        self._link: _link.Link | None = None
        self._held: dict[str, _Pin] = {}
        self._seq = 0
        self._oldest = float("inf")  # the earliest expiry of a held pin
        self._warned: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._load_params = self.options.params("kv_load_tiers")
        self._store_params = self.options.params("kv_store_tiers")
        self.counters = {"lookups": 0, "hit_pages": 0, "loaded_pages": 0, "stored_pages": 0, "failed_calls": 0,
                         "outages": 0, "attaches": 0}

    # -- attach ------------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        super().register_mem_pool_host(mem_pool_host)
        self._layout, self._page_bytes = layout_of(mem_pool_host, self.storage_config)
        try:
            self._attach()
        except Exception as e:  # noqa: BLE001 - SGLang serves without L3 until the daemon is there
            log.warning("kvtier: no daemon at %s yet (%s): HiCache L3 misses until it is; trying every %gs",
                        self.options.target, _link.rpc_msg(e), self.options.reconnect_interval_s)
        if self._thread is None:
            self._thread = threading.Thread(target=self._background, name="kvtier-sglang", daemon=True)
            self._thread.start()

    def _attach(self) -> None:
        assert self._layout is not None
        link = _link.attach(self.options.target, self.options.token, self._layout, self._page_bytes,
                            self.options.timeout_s)
        link.arena_t = torch.frombuffer(link.memory, dtype=torch.uint8)
        link.target_free = max(1, min(2 * 128, link.num_slots // 4, _MAX_FREE))  # type: ignore[attr-defined]
        link.max_held = max(1, link.num_slots // 4)  # type: ignore[attr-defined]
        with self._mu:
            old, self._link = self._link, link
            self.counters["attaches"] += 1
        if old is not None:
            old.shutdown()
        log.info("kvtier: SGLang L3 attached to namespace %s at %s (%d slots of %d bytes, pages of %d bytes)",
                 link.namespace, self.options.target, link.num_slots, link.slot_size, self._page_bytes)

    def _use(self) -> _link.Link | None:
        """The link, acquired; None while the daemon is away."""
        with self._mu:
            link = self._link
        if link is None or not link.acquire():
            return None
        return link

    def _failed(self, link: _link.Link, e: BaseException) -> None:
        with self._mu:
            self.counters["failed_calls"] += 1
            if link.fail(e):
                self.counters["outages"] += 1
            # The connection's end releases them on the daemon.
            for k in [k for k, p in self._held.items() if p[0] is link]:
                del self._held[k]

    def _background(self) -> None:
        """Attaches again while the daemon is away; sends deferred
        releases and expires held pins while it is idle."""
        again = _daemon.Reattach("kvtier", self.options.target, self.options.reconnect_interval_s, log)
        while not self._stop.wait(0.02):
            now = time.monotonic()
            link = self._link
            if link is None or link.down:
                again.start(now, at_once=True)
                if again.wait(now) > 0:
                    continue
                try:
                    self._attach()
                except Exception as e:  # noqa: BLE001
                    again.failed(e, now)
                    continue
                log.info("kvtier: the daemon is back after %.1fs", again.back())
                continue
            self._expire(now)
            if link.has_deferred() and link.acquire():
                try:
                    link.step(pb.EngineStepRequest())
                except Exception as e:  # noqa: BLE001
                    self._failed(link, e)
                finally:
                    link.release()

    def _expire(self, now: float) -> None:
        with self._mu:
            if not self._held or self._oldest > now:
                return
            gone = [k for k, p in self._held.items() if p[3] <= now]
            for k in gone:
                p = self._held.pop(k)
                p[0].defer_unpin(p[1], [storage_key(k)])
            self._oldest = min((p[3] for p in self._held.values()), default=float("inf"))

    def _params(self, key: str, extra_info: Any) -> str:
        per_call = getattr(extra_info, "extra_info", None)
        if isinstance(per_call, dict) and key in per_call:
            return self.options.params(key, extra_info)
        return self._load_params if key == "kv_load_tiers" else self._store_params

    def _rid(self, kind: str) -> str:
        with self._mu:
            self._seq += 1
            return f"sglang-{kind}-{self._seq}"

    # -- lookups -----------------------------------------------------------

    def _lookup(self, link: _link.Link, packed: bytes, params: str) -> tuple[str, bytearray, list[int]]:
        """Looks the packed keys up as one request; returns its id, one
        answer per key (UNKNOWN past the deadline) and the slot of each
        HIT (-1 else). Keys after the first MISS are not asked again."""
        rid = self._rid("get")
        n = len(packed) // 32
        req = pb.EngineStepRequest()
        req.new_requests.add(request_id=rid, kv_transfer_params=params)
        req.lookups.add(request_id=rid, packed_keys=packed, key_size=32)
        deadline = time.monotonic() + self.options.lookup_timeout_s
        try:
            rep = link.step(req)
            lk = _answer(rep, rid)
            refused = [w for w in rep.warnings if f'"{rid}"' in w]
            if refused or lk is None:
                # The daemon did not take the request (its limits, or a
                # filter strict validation rejects): every key misses.
                self._warn_once("refused", "kvtier: the daemon refused a lookup: %s", refused or "no answer")
                return rid, bytearray([_link.MISS]) * n, [-1] * n
            found = bytearray(lk.found)
            if len(lk.slots) == n:
                return rid, found, list(lk.slots)  # every key a HIT: the common case
            slots = [-1] * n
            it = iter(lk.slots)
            for i in range(n):
                if found[i] == _link.HIT:
                    slots[i] = next(it)
            while True:
                first_miss = found.find(_link.MISS)
                end = n if first_miss < 0 else first_miss
                ask = [i for i in range(end) if found[i] == _link.UNKNOWN]
                if not ask or time.monotonic() >= deadline:
                    break
                req = pb.EngineStepRequest()
                req.lookups.add(request_id=rid, packed_keys=b"".join(packed[i * 32:i * 32 + 32] for i in ask),
                                key_size=32)
                lk = _answer(link.step(req), rid)
                if lk is None:
                    continue
                it = iter(lk.slots)
                for j, f in enumerate(lk.found[:len(ask)]):
                    i = ask[j]
                    found[i] = f
                    if f == _link.HIT:
                        slots[i] = next(it)
        finally:
            link.defer_finish(rid)
        return rid, found, slots

    def _exists(self, keys: List[str], extra_info: Any) -> int:
        if not keys:
            return 0
        link = self._use()
        if link is None:
            return 0
        try:
            packed = pack_keys(keys)
            try:
                rid, found, slots = self._lookup(link, packed, self._params("kv_load_tiers", extra_info))
            except Exception as e:  # noqa: BLE001
                self._failed(link, e)
                return 0
            n = len(keys)
            hits = n - len(found.lstrip(bytes([_link.HIT])))
            self.counters["lookups"] += 1
            self.counters["hit_pages"] += hits
            release = [i for i in range(hits, n) if found[i] == _link.HIT]
            if self.options.hold_s > 0:
                expiry = time.monotonic() + self.options.hold_s
                with self._mu:
                    room = max(0, link.max_held - len(self._held))  # type: ignore[attr-defined]
                    held = self._held
                    for i in range(hits):
                        p = (link, rid, slots[i], expiry)
                        # One pin per key is held; a repeat is released.
                        if i >= room or held.setdefault(keys[i], p) is not p:
                            release.append(i)
                    self._oldest = min(self._oldest, expiry)
            else:
                release.extend(range(hits))
            link.defer_unpin(rid, [packed[i * 32:i * 32 + 32] for i in release])
            return hits
        finally:
            link.release()

    def batch_exists(self, keys: List[str], extra_info: Any = None) -> int:
        """The number of leading keys whose pages kvtier holds (in any tier
        the call may load from)."""
        try:
            return self._exists(keys, extra_info)
        except Exception:  # noqa: BLE001 - never into SGLang's threads
            log.exception("kvtier: batch_exists failed")
            return 0

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    # -- loads -------------------------------------------------------------

    def _load(self, keys: List[str], dsts: list[Any], extra_info: Any) -> list[bool]:
        """Copies the pages of keys into dsts (tensors of a page's bytes,
        any shape); one success per key."""
        n = len(keys)
        ok = [False] * n
        if n == 0:
            return ok
        link = self._use()
        if link is None:
            return ok
        try:
            pins: list[Any] = [None] * n
            with self._mu:
                for i, k in enumerate(keys):
                    p = self._held.pop(k, None)
                    if p is not None and p[0] is link:  # another link's pin went with its connection
                        pins[i] = p
            need = [i for i in range(n) if pins[i] is None]
            if need:
                try:
                    rid, found, slots = self._lookup(link, pack_keys([keys[i] for i in need]),
                                                     self._params("kv_load_tiers", extra_info))
                except Exception as e:  # noqa: BLE001
                    self._failed(link, e)
                    found, slots, rid = bytearray(len(need)), [-1] * len(need), ""
                for j, i in enumerate(need):
                    if found[j] == _link.HIT:
                        pins[i] = (link, rid, slots[j], 0.0)
            base = link.arena_t.data_ptr()
            by_rid: dict[str, list[bytes]] = {}
            for i in range(n):
                if pins[i] is not None:
                    by_rid.setdefault(pins[i][1], []).append(storage_key(keys[i]))
            try:
                for i in range(n):
                    p = pins[i]
                    if p is None:
                        continue
                    dst = dsts[i]
                    if dst.device.type != "cpu" or dst.numel() * dst.element_size() != self._page_bytes:
                        raise ValueError(f"kvtier: a page target must be {self._page_bytes} bytes on the CPU, "
                                         f"not {tuple(dst.shape)} {dst.dtype} on {dst.device}")
                    if not 0 <= p[2] < link.num_slots:
                        raise ValueError(f"kvtier: the daemon answered slot {p[2]} of {link.num_slots}")
                    copy_in(dst, base + p[2] * link.slot_size)
                    ok[i] = True
            finally:
                for rid, ks in by_rid.items():
                    link.defer_unpin(rid, ks)
            self.counters["loaded_pages"] += sum(ok)
            return ok
        finally:
            link.release()

    def batch_get_v1(self, keys: List[str], host_indices: torch.Tensor, extra_info: Any = None) -> List[bool]:
        """Loads pages straight into the host pool (SGLang's zero-copy
        interface): page i goes to the pool page at host_indices[i * page_size]."""
        try:
            dsts = self._pool_pages(keys, host_indices)
            if dsts is None:
                return [False] * len(keys)
            return self._load(keys, dsts, extra_info)
        except Exception:  # noqa: BLE001
            log.exception("kvtier: batch_get_v1 failed")
            return [False] * len(keys)

    def batch_get(self, keys: List[str], target_locations: Any = None, target_sizes: Any = None) -> List[Any]:
        """Loads pages into the flat tensors target_locations; returns each
        filled tensor, or None for a page not loaded."""
        try:
            if target_locations is None or len(target_locations) != len(keys):
                log.error("kvtier: batch_get needs one target tensor per key")
                return [None] * len(keys)
            ok = self._load(keys, list(target_locations), None)
            return [t if good else None for t, good in zip(target_locations, ok)]
        except Exception:  # noqa: BLE001
            log.exception("kvtier: batch_get failed")
            return [None] * len(keys)

    def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> Any:
        if target_location is None:
            target_location = self.mem_pool_host.get_dummy_flat_data_page()
        return self.batch_get([key], [target_location])[0]

    # -- stores ------------------------------------------------------------

    def _take_free(self, link: _link.Link, n: int) -> list[int]:
        """Up to n leased free slots (asking the daemon for more if the
        pool has fewer)."""
        with link.mu:
            short = n > len(link.free)
        if short:
            req = pb.EngineStepRequest(want_free_slots=min(_MAX_FREE, max(n, link.target_free)))  # type: ignore[attr-defined]
            rep = link.step(req)
            with link.mu:
                link.free.extend(rep.granted_slots)
        with link.mu:
            got, link.free = link.free[:n], link.free[n:]
        return got

    def _store(self, keys: List[str], srcs: list[Any], extra_info: Any) -> list[bool]:
        n = len(keys)
        if n == 0:
            return []
        link = self._use()
        if link is None:
            return [False] * n
        try:
            try:
                slots = self._take_free(link, n)
            except Exception as e:  # noqa: BLE001
                self._failed(link, e)
                return [False] * n
            m = len(slots)
            if m == 0:
                return [False] * n  # the primary lent no slot (all pinned): nothing to bind
            base = link.arena_t.data_ptr()
            try:
                for i in range(m):
                    src = srcs[i]
                    if src.device.type != "cpu" or src.numel() * src.element_size() != self._page_bytes:
                        raise ValueError(f"kvtier: a page must be {self._page_bytes} bytes on the CPU, "
                                         f"not {tuple(src.shape)} {src.dtype} on {src.device}")
                    if not 0 <= slots[i] < link.num_slots:
                        raise ValueError(f"kvtier: the daemon leased slot {slots[i]} of {link.num_slots}")
                    copy_out(base + slots[i] * link.slot_size, src)
            except BaseException:
                with link.mu:
                    link.free.extend(slots)
                raise
            rid = self._rid("set")
            req = pb.EngineStepRequest(want_free_slots=link.target_free)  # type: ignore[attr-defined]
            req.new_requests.add(request_id=rid, kv_transfer_params=self._params("kv_store_tiers", extra_info))
            req.stores.add(request_id=rid, packed_keys=pack_keys(keys[:m]), key_size=32, slots=slots, success=True)
            req.finished_request_ids.append(rid)
            try:
                rep = link.step(req)
            except Exception as e:  # noqa: BLE001
                self._failed(link, e)
                return [False] * n
            with link.mu:
                link.free.extend(rep.granted_slots)
            self.counters["stored_pages"] += m
            return [True] * m + [False] * (n - m)
        finally:
            link.release()

    def batch_set_v1(self, keys: List[str], host_indices: torch.Tensor, extra_info: Any = None) -> List[bool]:
        """Stores pages straight from the host pool (SGLang's zero-copy
        interface)."""
        try:
            srcs = self._pool_pages(keys, host_indices)
            if srcs is None:
                return [False] * len(keys)
            return self._store(keys, srcs, extra_info)
        except Exception:  # noqa: BLE001
            log.exception("kvtier: batch_set_v1 failed")
            return [False] * len(keys)

    def batch_set(self, keys: List[str], values: Any = None, target_locations: Any = None,
                  target_sizes: Any = None) -> bool:
        """Stores flat page tensors; True when every page was stored."""
        try:
            if values is None or len(values) != len(keys):
                log.error("kvtier: batch_set needs one value tensor per key")
                return False
            return all(self._store(keys, list(values), None))
        except Exception:  # noqa: BLE001
            log.exception("kvtier: batch_set failed")
            return False

    def set(self, key: str, value: Any = None, target_location: Any = None, target_sizes: Any = None) -> bool:
        return self.batch_set([key], [value])

    # -- pools of the v2 interface (hybrid models) -------------------------

    def batch_exists_v2(self, keys: List[str], pool_transfers: Any = None, extra_info: Any = None) -> Any:
        """KV pages only: a model whose prefix needs pages of other pools
        (Mamba, SWA, indexer states) finds none here, so its L3 hit is 0."""
        if pool_transfers:
            self._warn_pools(pool_transfers)
            return sc.PoolTransferResult(0, {}, [])
        hits = self.batch_exists(keys, extra_info)
        return sc.PoolTransferResult(hits, {sc.KV_POOL: hits} if hits else {}, list(range(1, hits + 1)))

    def batch_get_v2(self, transfers: Any, extra_info: Any = None) -> dict[str, List[bool]]:
        return self._v2(transfers, extra_info, self.batch_get_v1)

    def batch_set_v2(self, transfers: Any, extra_info: Any = None) -> dict[str, List[bool]]:
        return self._v2(transfers, extra_info, self.batch_set_v1)

    def _v2(self, transfers: Any, extra_info: Any, op: Any) -> dict[str, List[bool]]:
        out: dict[str, List[bool]] = {}
        for tr in transfers:
            keys = list(tr.keys or [])
            if tr.name == sc.KV_POOL and tr.host_indices is not None:
                out[tr.name] = op(keys, tr.host_indices, extra_info)
            else:
                self._warn_pools([tr])
                out[tr.name] = [False] * len(keys)
        return out

    def _warn_pools(self, transfers: Any) -> None:
        self._warn_once("pools", "kvtier: SGLang asked for pages of pool(s) %s; kvtier's L3 holds KV pages only",
                        sorted({str(t.name) for t in transfers}))

    def _warn_once(self, what: str, msg: str, *args: Any) -> None:
        if what not in self._warned:
            self._warned.add(what)
            log.warning(msg, *args)

    # -- the rest ----------------------------------------------------------

    def _pool_pages(self, keys: List[str], host_indices: torch.Tensor) -> list[Any] | None:
        host = self.mem_pool_host
        ps = int(host.page_size)
        if host_indices is None or host_indices.numel() != len(keys) * ps:
            log.error("kvtier: %d keys need %d host indices, got %s", len(keys), len(keys) * ps,
                      None if host_indices is None else host_indices.numel())
            return None
        return [host.get_data_page(int(i), flat=False) for i in host_indices[::ps].tolist()]

    def clear(self) -> None:
        """Drops every page of the namespace's primary no one holds
        (vLLM's reset_cache); pages in kvtier's storage tiers stay."""
        link = self._use()
        if link is None:
            return
        try:
            link.step(pb.EngineStepRequest(reset_cache=True))
        except Exception as e:  # noqa: BLE001
            self._failed(link, e)
        finally:
            link.release()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._mu:
            link, self._link = self._link, None
            self._held.clear()
        if link is not None:
            link.shutdown()

    def get_stats(self) -> Any:
        return None
