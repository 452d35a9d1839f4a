"""Workloads of the serving benchmark (serving.py): token-id prompts built
from the Mooncake conversation trace, and synthetic ones: many users asking
about one long document, prompts that share nothing (the cost of
offloading when nothing hits), agent sessions (one system prompt, histories
that grow turn by turn, turns of different sessions interleaved), several
documents queried round-robin (for two engines whose device caches cannot
hold them), and a burst of arrivals at one instant (an open loop).

A trace request is a list of hash ids, one per 512-token block; requests
that share leading ids share that prefix. The benchmark keeps the sharing
and shrinks the blocks: every id becomes `tokens_per_hash` deterministic
token ids, so a 7 000-token trace prompt becomes about 900 tokens that a
CPU-backend engine prefills in about a second, and two requests share as
many leading tokens, in proportion, as they did in production.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
import pathlib
import random
from collections import defaultdict


@dataclasses.dataclass(frozen=True)
class Request:
    """One completion request: a prompt of token ids and how many tokens
    to generate."""

    prompt: tuple[int, ...]
    max_tokens: int
    group: str  # what the request belongs to (a conversation, a user)
    at: float = 0.0  # arrival, seconds from the workload's start (before any speed-up)


@dataclasses.dataclass(frozen=True)
class Workload:
    name: str
    requests: tuple[Request, ...]
    # Sent at their arrival times whatever the benchmark's --speedup (a
    # burst is a burst only if it arrives at once).
    open_loop: bool = False

    def unique_tokens(self, block: int) -> int:
        """Distinct prompt tokens in whole blocks of `block` tokens, keyed
        by prefix (what a prefix cache with unbounded room would hold)."""
        seen: set[tuple[int, ...]] = set()
        for r in self.requests:
            for end in range(block, len(r.prompt) + 1, block):
                seen.add(r.prompt[:end])
        return len(seen) * block

    def prompt_tokens(self) -> int:
        return sum(len(r.prompt) for r in self.requests)


def _block_tokens(hash_id: int, n: int, vocab: int, salt: int) -> list[int]:
    """The n token ids block hash_id stands for: the same for every
    request that names it, distinct (with overwhelming probability) for
    distinct ids. Ids below 16 are left out (special tokens)."""
    rng = random.Random(hash_id * 1_000_003 + salt)
    return [rng.randrange(16, vocab) for _ in range(n)]


def mooncake(trace: pathlib.Path, *, conversations: int, tokens_per_hash: int, max_blocks: int, max_tokens: int,
             vocab: int, seed: int, max_turns: int = 6, max_requests: int = 0) -> Workload:
    """Whole multi-turn conversations sampled from the trace (with the
    system prompt every request shares), their turns in trace order.

    A conversation is the requests whose first two hash ids are the same
    (the shared system prompt, then the conversation's own first block);
    only conversations of at least two turns are sampled, since a
    single-turn one can reuse nothing but the system prompt, and each keeps
    its first max_turns turns. Requests
    longer than max_blocks ids are cut to max_blocks (the engine's context
    bounds them)."""
    text = gzip.decompress(trace.read_bytes()).decode() if trace.suffix == ".gz" else trace.read_text()
    rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    convs: dict[tuple[int, ...], list[int]] = defaultdict(list)
    for i, row in enumerate(rows):
        h = row["hash_ids"]
        if len(h) >= 2:
            convs[tuple(h[:2])].append(i)
    multi = sorted(k for k, v in convs.items() if len(v) >= 2)
    rng = random.Random(seed)
    picked = rng.sample(multi, min(conversations, len(multi)))
    # The sampled conversations run side by side, as the trace's thousands
    # of conversations do: each starts at a random point within the median
    # sampled conversation's duration, and keeps its own turns' spacing.
    # Replayed in trace order instead, a sample's turns would follow each
    # other with little traffic between them, and any cache would hold them.
    durations = sorted(rows[convs[k][-1]]["timestamp"] - rows[convs[k][0]]["timestamp"] for k in picked)
    spread = durations[len(durations) // 2] if durations else 0
    at: list[tuple[float, int]] = []
    for k in picked:
        turns = convs[k][:max_turns]
        start = rng.uniform(0, spread)
        t0 = rows[turns[0]]["timestamp"]
        at += [(start + rows[i]["timestamp"] - t0, i) for i in turns]
    order = [i for _, i in sorted(at)]
    arrival = {i: t for t, i in at}
    if max_requests:
        order = order[:max_requests]
    reqs = []
    for i in order:
        row = rows[i]
        ids = row["hash_ids"][:max_blocks]
        # The trace's last block is partial: keep the same share of it.
        n = min(len(ids) * tokens_per_hash, math.ceil(row["input_length"] * tokens_per_hash / 512))
        prompt: list[int] = []
        for h in ids:
            prompt += _block_tokens(h, tokens_per_hash, vocab, seed)
        key = tuple(row["hash_ids"][:2])
        reqs.append(Request(tuple(prompt[:max(n, 1)]), max(1, min(row["output_length"], max_tokens)), f"conv{key[1]}",
                            arrival[i] / 1000))
    return Workload("mooncake", tuple(reqs))


def document(*, users: int, questions: int, doc_tokens: int, question_tokens: int, noise: int, max_tokens: int,
             vocab: int, seed: int, gap_s: float = 2.0) -> Workload:
    """Many users asking about one long document: every prompt is the
    document followed by a user's question. Between rounds of questions,
    `noise` requests with long prompts of their own (other tenants'
    documents) push the document out of the engine's device cache, so a
    user's question finds the document only if an offloading cache kept
    it. Requests arrive gap_s apart."""
    rng = random.Random(seed)
    doc = [rng.randrange(16, vocab) for _ in range(doc_tokens)]
    reqs = []
    for q in range(questions):
        for u in range(users):
            question = [rng.randrange(16, vocab) for _ in range(question_tokens)]
            reqs.append(Request(tuple(doc + question), max_tokens, f"user{u}", len(reqs) * gap_s))
        for n in range(noise):
            other = [rng.randrange(16, vocab) for _ in range(doc_tokens + question_tokens)]
            reqs.append(Request(tuple(other), max_tokens, f"noise{q}.{n}", len(reqs) * gap_s))
    return Workload("document", tuple(reqs))


def _tokens(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(16, vocab) for _ in range(n)]


def no_reuse(*, requests: int, prompt_tokens: int, max_tokens: int, vocab: int, seed: int, gap_s: float = 1.0) -> Workload:
    """Prompts that share no token: nothing can hit, in any cache. What an
    offloading cache costs here is its whole cost (lookups that miss,
    stores nobody reads)."""
    rng = random.Random(seed * 7919 + 1)
    reqs = tuple(Request(tuple(_tokens(rng, prompt_tokens, vocab)), max_tokens, f"u{i}", i * gap_s) for i in range(requests))
    return Workload("no-reuse", reqs)


def agent(*, sessions: int, turns: int, system_tokens: int, turn_tokens: int, max_tokens: int, vocab: int, seed: int,
          gap_s: float = 1.0) -> Workload:
    """Agent sessions: every prompt starts with one system prompt; a
    session's turn t is its turn t-1's prompt plus a new observation of
    turn_tokens tokens (its history grows turn by turn), and the sessions'
    turns interleave (turn 1 of every session, then turn 2, ...), so a
    session's history must survive the other sessions' turns to be hit."""
    rng = random.Random(seed * 7919 + 2)
    system = _tokens(rng, system_tokens, vocab)
    history = [list(system) for _ in range(sessions)]
    reqs = []
    for t in range(turns):
        for sess in range(sessions):
            history[sess] += _tokens(rng, turn_tokens, vocab)
            reqs.append(Request(tuple(history[sess]), max_tokens, f"session{sess}", len(reqs) * gap_s))
    return Workload("agent", tuple(reqs))


def documents(*, documents: int, questions: int, doc_tokens: int, question_tokens: int, max_tokens: int, vocab: int,
              seed: int, gap_s: float = 1.0) -> Workload:
    """Several documents, each asked `questions` questions, round-robin over
    the documents: with the benchmark's round-robin client and two engines,
    an engine is asked about a document the other engine computed, and the
    documents together are larger than a device cache."""
    rng = random.Random(seed * 7919 + 3)
    docs = [_tokens(rng, doc_tokens, vocab) for _ in range(documents)]
    reqs = []
    for q in range(questions):
        for d in range(documents):
            reqs.append(Request(tuple(docs[d] + _tokens(rng, question_tokens, vocab)), max_tokens, f"doc{d}",
                                len(reqs) * gap_s))
    return Workload("documents", tuple(reqs))


def burst(*, requests: int, prefix_tokens: int, suffix_tokens: int, max_tokens: int, vocab: int, seed: int,
          warm_gap_s: float = 5.0) -> Workload:
    """An arrival burst: one request with a shared prefix, then, warm_gap_s
    later, `requests` requests at the same instant, half of them on that
    prefix (hits for a cache that kept it) and half on prefixes of their
    own (misses). Sent as an open loop: every request of the burst waits on
    the cache's lookups at once."""
    rng = random.Random(seed * 7919 + 4)
    prefix = _tokens(rng, prefix_tokens, vocab)
    reqs = [Request(tuple(prefix + _tokens(rng, suffix_tokens, vocab)), max_tokens, "warm", 0.0)]
    for i in range(requests):
        head = prefix if i % 2 == 0 else _tokens(rng, prefix_tokens, vocab)
        reqs.append(Request(tuple(head + _tokens(rng, suffix_tokens, vocab)), max_tokens, f"b{i}", warm_gap_s))
    return Workload("burst", tuple(reqs), open_loop=True)
