"""Tenants' KV events as a router sees them (issue 47), against a real
daemon, decoded by vLLM's own event decoder.

Two tenants, a shared space and the daemon's own space store the same
prompt with its tokens (PutBlocks with metadata). Every batch must re-encode
byte for byte through vLLM's KVEventBatch decoder and encoder; each space's
blocks must carry their own hashes (the engine's XORed with the space's ID,
never another space's), the chunks must chain by parent hash within the
space, and the salt must sit where vLLM writes a cache_salt: the first
block of the request's first chunk only. A tenant's delete then removes its
own copy only.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import socket
import tempfile
import time
from typing import Any, Iterator

import pytest

from conftest import Daemon

zmq = pytest.importorskip("zmq")
msgspec = pytest.importorskip("msgspec")
kv_events = pytest.importorskip("vllm.distributed.kv_events")

BLOCK = 16
CHUNKS = 4


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def space_id(name: str) -> int:
    d = hashlib.sha256(b"kvtier key space\x00" + name.encode()).digest()
    return int.from_bytes(d[:8], "big") or 1


@pytest.fixture
def tenant_daemon(kvtier_bin: str) -> Iterator[tuple[Daemon, int]]:
    d = pathlib.Path(tempfile.mkdtemp(prefix="kvt"))
    port = free_port()
    cfg = f"""
namespace: {{model: m, bytes_per_block: 4KiB}}
primary: {{bytes: 1MiB}}
events: {{enabled: true, endpoint: "tcp://127.0.0.1:{port}", mode: bind, self_describing: true}}
tenants:
  - {{name: acme, token: acme-token-0123456789, namespaces: [default]}}
  - {{name: beta, token: beta-token-0123456789, namespaces: [default], event_salt: "beta's own salt"}}
shared_spaces:
  - {{name: docs, tenants: [acme, beta]}}
server: {{unix_socket: {d}/k.sock, tcp_addr: "", metrics_addr: "", shutdown_timeout: 20s,
          unix_peers: [{{uid: {os.getuid()}, as: admin}}]}}
"""
    dm = Daemon(kvtier_bin, d, cfg).start()
    dm.token = None  # this uid is the admin here (server.unix_peers)
    yield dm, port
    dm.stop()


def test_tenant_events_route_by_space(tenant_daemon: tuple[Daemon, int]) -> None:
    import kvtier
    from kvtier.keys import keys_from_tokens
    from kvtier.v1 import kvtier_pb2 as pb

    dm, port = tenant_daemon
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.RCVTIMEO, 15000)
    sub.setsockopt(zmq.LINGER, 0)
    sub.connect(f"tcp://127.0.0.1:{port}")
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    decoder = msgspec.msgpack.Decoder(kv_events.KVEventBatch)
    encoder = msgspec.msgpack.Encoder()

    tokens = list(range(1000, 1000 + BLOCK * CHUNKS))
    keys = keys_from_tokens(tokens, block_size=BLOCK)
    assert len(keys) == CHUNKS
    hashes = [k[:-4] for k in keys]  # offload key = hash || be32 group
    metas = [pb.BlockMetadata(block_hashes=[hashes[i]], parent_block_hash=hashes[i - 1] if i else b"",
                              token_ids=tokens[i * BLOCK:(i + 1) * BLOCK], block_size=BLOCK)
             for i in range(CHUNKS)]

    with dm.client() as admin:
        slot = admin.stats().primary.slot_size
    data = [bytes([i + 1]) * slot for i in range(CHUNKS)]

    def recv_stored(n: int) -> list[Any]:
        got: list[Any] = []
        while len(got) < n:
            topic, seq, payload = sub.recv_multipart()
            batch = decoder.decode(payload)
            assert encoder.encode(batch) == payload, "vLLM's decoder does not re-encode the batch byte for byte"
            got += [e for e in batch.events if isinstance(e, kv_events.BlockStored) and e.block_hashes != [0]]
        assert len(got) == n, got
        return got

    # The subscription races the first batch: store a warm-up block in
    # the daemon's own space (wire hash 0, ignored below) until one
    # arrives.
    warm = bytes(8) + b"\x00\x00\x00\x00"
    # A batch published before the subscription took hold is lost, so the
    # block is stored again each time the wait comes up empty; the bound
    # is generous for a busy machine, and running out of it fails.
    deadline = time.monotonic() + 60
    sub.setsockopt(zmq.RCVTIMEO, 200)
    with dm.client() as admin:
        admin.put_blocks([(warm, bytes(slot))])
        while True:
            try:
                sub.recv_multipart()
                break
            except zmq.Again:
                assert time.monotonic() < deadline, "no KV event batch reached the subscriber in 60 s"
                admin.delete([warm])
                admin.put_blocks([(warm, bytes(slot))])
    sub.setsockopt(zmq.RCVTIMEO, 15000)

    spaces = {
        "default": (None, "", 0, None),
        "acme": ("acme-token-0123456789", "", space_id("tenant/acme"), "kvtier_tenant:acme"),
        "beta": ("beta-token-0123456789", "", space_id("tenant/beta"), "beta's own salt"),
        "docs": ("acme-token-0123456789", "docs", space_id("shared/docs"), "kvtier_tenant:docs"),
    }
    seen: dict[str, list[Any]] = {}
    for name, (token, ns, _, _) in spaces.items():
        with kvtier.Client(dm.sock, token=token, namespace=ns) as c:
            assert c.put_blocks(list(zip(keys, data)), metadata=metas) == [True] * CHUNKS
        seen[name] = recv_stored(CHUNKS)

    engine = [int.from_bytes(h[-8:], "big") for h in hashes]
    all_hashes: dict[int, str] = {}
    for name, (_, _, sid, salt) in spaces.items():
        evs = seen[name]
        want = [h ^ sid for h in engine]
        assert [e.block_hashes for e in evs] == [[w] for w in want], name
        assert [e.parent_block_hash for e in evs] == [None] + want[:-1], name
        assert [list(e.token_ids) for e in evs] == [m.token_ids for m in metas], name
        if salt is None:
            assert all(e.extra_keys is None for e in evs), name
        else:
            assert evs[0].extra_keys == [(salt,)], name
            assert all(e.extra_keys is None for e in evs[1:]), name
        for w in want:
            assert w not in all_hashes, f"{name} reuses {all_hashes.get(w)}'s wire hash"
            all_hashes[w] = name

    # A tenant's delete of all its blocks removes its own copy, under its
    # own hashes, and nobody else's.
    with kvtier.Client(dm.sock, token="beta-token-0123456789") as c:
        assert c.delete_all().primary == CHUNKS
        assert c.get_blocks(keys)[2] == 0
    with kvtier.Client(dm.sock, token="acme-token-0123456789") as c:
        assert c.get_blocks(keys)[2] == CHUNKS
    removed: list[int] = []
    while len(removed) < CHUNKS:
        _, _, payload = sub.recv_multipart()
        batch = decoder.decode(payload)
        assert encoder.encode(batch) == payload
        for e in batch.events:
            assert not isinstance(e, kv_events.BlockStored) or e.block_hashes == [0], e
            if isinstance(e, kv_events.BlockRemoved):
                removed += [h for h in e.block_hashes if h != 0]
    assert sorted(removed) == sorted(h ^ spaces["beta"][2] for h in engine)
    sub.close()
    ctx.term()


def test_a_tenant_with_its_own_publisher(kvtier_bin: str) -> None:
    """tenants[].events.endpoint: acme's blocks are published on acme's own
    socket (its topic, its sequence) and never on the shared one, which
    carries every other space's."""
    import kvtier

    d = pathlib.Path(tempfile.mkdtemp(prefix="kvt"))
    shared_port, acme_port = free_port(), free_port()
    cfg = f"""
namespace: {{model: m, bytes_per_block: 4KiB}}
primary: {{bytes: 1MiB}}
events: {{enabled: true, endpoint: "tcp://127.0.0.1:{shared_port}", mode: bind, self_describing: true}}
tenants:
  - {{name: acme, token: acme-token-0123456789, namespaces: [default],
      events: {{endpoint: "tcp://127.0.0.1:{acme_port}", topic: acme-kv}}}}
  - {{name: beta, token: beta-token-0123456789, namespaces: [default]}}
server: {{unix_socket: {d}/k.sock, tcp_addr: "", metrics_addr: "", shutdown_timeout: 20s,
          unix_peers: [{{uid: {os.getuid()}, as: admin}}]}}
"""
    dm = Daemon(kvtier_bin, d, cfg).start()
    dm.token = None  # this uid is the admin here (server.unix_peers)
    zctx = zmq.Context()
    decoder = msgspec.msgpack.Decoder(kv_events.KVEventBatch)
    try:
        with dm.client() as admin:
            slot = admin.stats().primary.slot_size

        def subscribe(port: int, token: str | None) -> Any:
            """A subscriber that has seen a batch: a warm-up block stored
            (in the token's space) until one arrives."""
            s = zctx.socket(zmq.SUB)
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.RCVTIMEO, 200)
            s.connect(f"tcp://127.0.0.1:{port}")
            s.setsockopt(zmq.SUBSCRIBE, b"")
            deadline = time.monotonic() + 60
            with kvtier.Client(dm.sock, token=token) as c:
                n = 0
                while True:
                    n += 1
                    c.put_blocks([(bytes([n, port % 251]) + bytes(6) + b"\x00\x00\x00\x00", bytes(slot))])
                    try:
                        s.recv_multipart()
                        break
                    except zmq.Again:
                        assert time.monotonic() < deadline, f"no batch on port {port} in 60 s"
            s.setsockopt(zmq.RCVTIMEO, 15000)
            while True:  # drain the warm-up's other batches
                try:
                    s.recv_multipart(flags=zmq.NOBLOCK)
                except zmq.Again:
                    return s

        shared = subscribe(shared_port, None)
        acme = subscribe(acme_port, "acme-token-0123456789")

        def stored(s: Any) -> tuple[bytes, list[Any]]:
            while True:
                topic, _, payload = s.recv_multipart()
                evs = [e for e in decoder.decode(payload).events if isinstance(e, kv_events.BlockStored)]
                if evs:
                    return topic, evs

        k = bytes(range(1, 9)) + b"\x00\x00\x00\x00"
        with kvtier.Client(dm.sock, token="acme-token-0123456789") as c:
            assert c.put_blocks([(k, b"a" * slot)]) == [True]
        engine = int.from_bytes(k[:-4][-8:], "big")
        topic, evs = stored(acme)
        assert topic == b"acme-kv" and [e.block_hashes for e in evs] == [[engine ^ space_id("tenant/acme")]], evs
        # The shared socket's next block is beta's: acme's never came there.
        with kvtier.Client(dm.sock, token="beta-token-0123456789") as c:
            assert c.put_blocks([(k, b"b" * slot)]) == [True]
        _, evs = stored(shared)
        assert [e.block_hashes for e in evs] == [[engine ^ space_id("tenant/beta")]], evs
    finally:
        zctx.destroy(linger=0)
        dm.stop()
