"""A KV-event subscriber written the way routers write them (pyzmq + msgpack).

Usage: kv_subscriber.py ENDPOINT REPLAY_ENDPOINT|- COUNT REPLAY_FROM

Prints READY once subscribed, then receives COUNT batches on a SUB socket,
then (unless REPLAY_ENDPOINT is -) asks a DEALER replay for every batch from
REPLAY_FROM on, and prints one JSON document with what it saw.
"""
import json
import sys

import msgpack
import zmq


def decode(payload):
    batch = msgpack.unpackb(payload, raw=False, strict_map_key=True)
    assert isinstance(batch, list) and len(batch) == 3, batch
    ts, events, dp_rank = batch
    assert isinstance(ts, float), ts
    for ev in events:
        assert isinstance(ev, dict), "events must be maps tagged by type: %r" % (ev,)
        assert ev["type"] in ("BlockStored", "BlockRemoved", "AllBlocksCleared"), ev
    return {"ts": ts, "events": events, "dp_rank": dp_rank}


def main():
    endpoint, replay_endpoint, count, replay_from = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.RCVTIMEO, 15000)
    sub.setsockopt(zmq.LINGER, 0)
    sub.connect(endpoint)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv@")
    print("READY", flush=True)

    live = []
    for _ in range(count):
        frames = sub.recv_multipart()
        assert len(frames) == 3, "want [topic, seq, payload], got %d frames" % len(frames)
        topic, seq, payload = frames
        assert len(seq) == 8, seq
        item = decode(payload)
        item["topic"] = topic.decode()
        item["seq"] = int.from_bytes(seq, "big")
        live.append(item)

    replayed, terminator = [], None
    if replay_endpoint != "-":
        dealer = ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.RCVTIMEO, 15000)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(replay_endpoint)
        dealer.send_multipart([b"", replay_from.to_bytes(8, "big")])
        while True:
            frames = dealer.recv_multipart()
            assert len(frames) == 4, "want ['', topic, seq, payload], got %d frames" % len(frames)
            empty, topic, seq, payload = frames
            assert empty == b"", empty
            seq = int.from_bytes(seq, "big", signed=True)
            if seq == -1:
                terminator = {"topic": topic.decode(), "payload": payload.decode()}
                break
            item = decode(payload)
            item["topic"] = topic.decode()
            item["seq"] = seq
            replayed.append(item)
        dealer.close()
    sub.close()
    ctx.term()
    print(json.dumps({"live": live, "replayed": replayed, "terminator": terminator}), flush=True)


if __name__ == "__main__":
    main()
