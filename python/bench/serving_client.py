"""The serving benchmark's client: streams completions from vLLM's OpenAI
server and times them, and reads the server's Prometheus counters.

Only the standard library: it runs under any interpreter that can reach
the server (one thread per request in flight; a handful suffice)."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import http.client
import json
import re
import threading
import time
import urllib.request
from typing import Callable, Iterable, Sequence

from serving_workload import Request


@dataclasses.dataclass
class Result:
    """One request as the client saw it."""

    prompt_tokens: int
    output_tokens: int = 0
    ttft_s: float = 0.0  # from sending the request to its first token
    e2e_s: float = 0.0  # to its last token
    itl_s: list[float] = dataclasses.field(default_factory=list)  # between tokens after the first
    cached_tokens: int | None = None  # prompt tokens the engine did not compute (its usage report)
    error: str = ""


def complete(host: str, port: int, model: str, req: Request, timeout: float) -> Result:
    """One streamed completion with a token-id prompt, greedy, exactly
    req.max_tokens tokens (end-of-sequence ignored)."""
    res = Result(prompt_tokens=len(req.prompt))
    body = json.dumps({
        "model": model, "prompt": list(req.prompt), "max_tokens": req.max_tokens, "min_tokens": req.max_tokens,
        "temperature": 0.0, "ignore_eos": True, "stream": True, "detokenize": False, "return_token_ids": True,
        "stream_options": {"include_usage": True},
    })
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    t0 = time.monotonic()
    last = 0.0
    try:
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            res.error = f"HTTP {resp.status}: {resp.read(500).decode(errors='replace')}"
            return res
        for raw in resp:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            chunk = json.loads(data)
            if "error" in chunk:
                res.error = str(chunk["error"])
                return res
            if usage := chunk.get("usage"):
                details = usage.get("prompt_tokens_details") or {}
                if details.get("cached_tokens") is not None:
                    res.cached_tokens = int(details["cached_tokens"])
            n = sum(len(c.get("token_ids") or []) or (1 if c.get("text") else 0) for c in chunk.get("choices", []))
            if n == 0:
                continue
            now = time.monotonic()
            if res.output_tokens == 0:
                res.ttft_s = now - t0
            else:
                res.itl_s.append((now - last) / n)
            last = now
            res.output_tokens += n
        res.e2e_s = time.monotonic() - t0
        if res.output_tokens == 0:
            res.error = "no token streamed"
    except (OSError, http.client.HTTPException, ValueError) as e:
        res.error = f"{type(e).__name__}: {e}"
    finally:
        conn.close()
    return res


def replay(servers: Sequence[tuple[str, int]], model: str, reqs: Iterable[Request], *, concurrency: int,
           timeout: float, speedup: float = 0.0,
           on_assign: Callable[[Request, int], None] | None = None) -> tuple[list[Result], float]:
    """Sends reqs in order, round-robin over servers. With speedup 0, at
    most `concurrency` in flight (a closed loop: the next request leaves
    when one finishes); else each at its arrival time divided by speedup
    (an open loop: TTFT then includes the wait for the engine). Returns the
    results in request order and the wall time. on_assign, if set, is a
    router's work once it has assigned a request to a server (by index):
    it runs on the dispatching thread before the request waits for a slot
    (closed loop: up to `concurrency` requests ahead of its sending; open
    loop: at its arrival, so inside its TTFT)."""
    reqs = list(reqs)
    results: list[Result | None] = [None] * len(reqs)
    open_loop = speedup > 0
    slots = threading.Semaphore(256 if open_loop else concurrency)
    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(256 if open_loop else concurrency) as pool:
        futs = []
        first = reqs[0].at if reqs else 0.0
        for i, r in enumerate(reqs):
            if open_loop:
                delay = t0 + (r.at - first) / speedup - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            if on_assign is not None:
                r0 = time.monotonic()
                on_assign(r, i % len(servers))
                routed = time.monotonic() - r0
            else:
                routed = 0.0
            slots.acquire()
            host, port = servers[i % len(servers)]

            def run(i: int = i, r: Request = r, host: str = host, port: int = port, routed: float = routed) -> None:
                try:
                    res = complete(host, port, model, r, timeout)
                    if open_loop:
                        # The router's work delayed the request's sending.
                        res.ttft_s += routed
                        res.e2e_s += routed
                    results[i] = res
                finally:
                    slots.release()

            futs.append(pool.submit(run))
        for f in futs:
            f.result()
    return [r for r in results if r is not None], time.monotonic() - t0


_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([0-9.eE+-]+|NaN|[+-]Inf)\s*$')


def scrape(host: str, port: int, timeout: float = 10) -> dict[str, float]:
    """The server's /metrics as {name{labels}: value}, summed over its
    engines (vLLM labels every sample with engine and model_name; those
    labels are dropped, others kept)."""
    text = scrape_text(host, port, timeout)
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if not m:
            continue
        name, labels, value = m.groups()
        keep = []
        for kv in re.findall(r'(\w+)="([^"]*)"', labels or ""):
            if kv[0] not in ("engine", "model_name"):
                keep.append(f"{kv[0]}={kv[1]}")
        key = name + ("{" + ",".join(keep) + "}" if keep else "")
        out[key] = out.get(key, 0.0) + float(value)
    return out


def scrape_text(host: str, port: int, timeout: float = 10) -> str:
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=timeout) as r:
        return str(r.read().decode())


def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items()}
