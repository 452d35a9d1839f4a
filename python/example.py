#!/usr/bin/python3
"""Stores blocks in a kvtier daemon and loads them back with kv_load_tiers.

Run a daemon (`kvtier serve`, the embedded default has an FS tier named
local-disk), then:

    /usr/bin/python3 python/example.py [--target ./kvtier.sock] [--token T]

Steps:
 1. store 4 blocks the way an engine does: prepare_store, write the slots
    of the mapped arena (or put_blocks when the arena is not shareable),
    complete_store; the blocks cascade to the secondary tiers;
 2. reset the primary tier, so the blocks live only in secondary tiers
    (do not run this against a daemon serving real traffic);
 3. load with kv_load_tiers = remote CPU only: every key misses, because
    the filter excludes the local disk;
 4. load with kv_load_tiers = local storage: the daemon promotes the
    blocks from disk and they come back byte for byte.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import kvtier  # noqa: E402


def wait_idle(c, timeout=30):
    """Ends steps until no transfer is in flight (cascades finished)."""
    deadline = time.time() + timeout
    while c.schedule_end():
        if time.time() > deadline:
            raise RuntimeError("transfers still in flight after %ss" % timeout)
        time.sleep(0.005)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="./kvtier.sock", help="Unix socket path or host:port")
    ap.add_argument("--token", default=None, help="TCP auth token")
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--by-value", action="store_true", help="use put_blocks/get_blocks, not the arena")
    args = ap.parse_args()

    with kvtier.Client(args.target, token=args.token) as c:
        info = c.arena_info()
        size = info.slot_size
        keys = [kvtier.make_key(("example-%d" % i).encode(), 0) for i in range(args.blocks)]
        data = {k: bytes([i % 251]) * size for i, k in enumerate(keys)}

        arena = None
        if not args.by_value:
            try:
                arena = c.map_arena()
            except RuntimeError as e:
                print("arena not mappable (%s); using put_blocks/get_blocks" % e)

        # 1. Store.
        if arena is not None:
            c.new_request("example-store")
            res = c.prepare_store("example-store", keys)
            if not res.ok:
                raise SystemExit("primary tier full")
            for k, slot in zip(res.keys_to_store, res.slots):
                arena.slot(slot)[:] = data[k]
            c.complete_store("example-store", list(res.keys_to_store))
            c.finish_request("example-store")
            print("stored %d blocks of %d bytes through the mapped arena" % (len(res.keys_to_store), size))
        else:
            stored = c.put_blocks([(k, data[k]) for k in keys])
            print("put_blocks: %d blocks of %d bytes written, %d already present" % (sum(stored), size, len(stored) - sum(stored)))
        wait_idle(c)

        # 2. Only the secondary tiers hold the blocks now.
        c.reset()

        # 3. A filter that excludes the local disk: misses.
        remote_cpu = {"kv_load_tiers": [{"medium": "cpu", "locality": "remote"}]}
        results, _, hits = c.get_blocks(keys, params=remote_cpu, wait_ms=500)
        assert hits == 0 and all(r == kvtier.MISS for r in results), results
        print("kv_load_tiers=%s: %d of %d hits (local disk excluded)" % (remote_cpu["kv_load_tiers"], hits, len(keys)))

        # 4. Local storage allowed: promoted from disk.
        local_disk = {"kv_load_tiers": [{"medium": "storage", "locality": "local"}]}
        if arena is not None:
            rid = "example-load"
            c.new_request(rid, local_disk)
            deadline = time.time() + 30
            while True:
                results, hits = c.lookup(rid, keys, prefix_scan=True)
                if hits == len(keys) and all(r == kvtier.HIT for r in results):
                    break
                if time.time() > deadline:
                    raise SystemExit("blocks never became readable: %s" % results)
                c.schedule_end()  # submits the promotions, then polls them
                time.sleep(0.002)
            slots = c.prepare_load(rid, keys)
            try:
                for k, slot in zip(keys, slots):
                    assert arena.slot(slot).tobytes() == data[k], "block %r differs" % k
            finally:
                c.complete_load(rid, keys)
            c.finish_request(rid)
            arena.close()
        else:
            results, got, hits = c.get_blocks(keys, params=local_disk, wait_ms=5000)
            assert hits == len(keys), results
            for k, d in zip(keys, got):
                assert d == data[k], "block %r differs" % k
        print("kv_load_tiers=%s: %d of %d blocks loaded and verified" % (local_disk["kv_load_tiers"], len(keys), len(keys)))


if __name__ == "__main__":
    main()
