"""The serving benchmark's results: one Run per (configuration, engines,
workload, round), its summary, the table and the issue's targets."""

from __future__ import annotations

import dataclasses
import random
import statistics
from typing import Any

import serving_client as client

LABELS = {
    "none": "no offload", "cpu": "vLLM CPU offload", "vllm-fs": "vLLM CPU+FS tiering", "kvtier-tier": "kvtier tier mode",
    "kvtier-manager": "kvtier manager mode", "kvtier-router": "kvtier manager mode + router prefetch", "lmcache": "LMCache MP",
}


@dataclasses.dataclass
class Run:
    config: str
    engines: int
    workload: str
    round: int
    cpu_bytes: int = 0
    device_blocks: int = 0
    max_model_len: int = 0
    results: list[client.Result] = dataclasses.field(default_factory=list)
    wall_s: float = 0.0
    hit_tokens: dict[str, int] = dataclasses.field(default_factory=dict)
    kvtier_tiers: dict[str, int] = dataclasses.field(default_factory=dict)  # tokens served by the daemon, per tier
    offload: dict[str, float] = dataclasses.field(default_factory=dict)  # vLLM's offloading counters (serving.OFFLOAD_COUNTERS)
    startup_s: float = 0.0
    cache_cpu_s: float | None = None  # CPU seconds the kvtier daemon / LMCache server used during the workload
    error: str = ""

    @property
    def label(self) -> str:
        return LABELS[self.config] + (f" ×{self.engines}" if self.engines > 1 else "")

    def ok(self) -> list[client.Result]:
        return [r for r in self.results if not r.error]

    def summary(self) -> dict[str, Any]:
        ok = self.ok()
        ttft = [r.ttft_s for r in ok]
        itl = [x for r in ok for x in r.itl_s]
        prompt = sum(r.prompt_tokens for r in self.results)
        out = sum(r.output_tokens for r in ok)
        return {
            "requests": len(self.results), "failed": len(self.results) - len(ok), "prompt_tokens": prompt,
            "ttft_p50_s": _pct(ttft, 50), "ttft_p90_s": _pct(ttft, 90), "ttft_p99_s": _pct(ttft, 99),
            "ttft_mean_s": statistics.fmean(ttft) if ttft else None,
            "itl_p50_s": _pct(itl, 50), "e2e_p50_s": _pct([r.e2e_s for r in ok], 50),
            "wall_s": self.wall_s, "output_tok_s": out / self.wall_s if self.wall_s else None,
            "req_s": len(ok) / self.wall_s if self.wall_s else None,
            "hit_tokens_total": sum(self.hit_tokens.values()),
            "hit_share": sum(self.hit_tokens.values()) / prompt if prompt else None,
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "config": self.config, "label": self.label, "engines": self.engines, "workload": self.workload,
            "round": self.round, "cpu_bytes": self.cpu_bytes, "device_blocks": self.device_blocks,
            "startup_s": self.startup_s, "cache_cpu_s": self.cache_cpu_s, "error": self.error, "summary": self.summary(),
            "prompt_tokens": self.summary()["prompt_tokens"], "hit_tokens": self.hit_tokens,
            "kvtier_tier_tokens": self.kvtier_tiers, "offload_counters": self.offload, "ttft_s": [r.ttft_s for r in self.ok()],
            "requests": [{"prompt_tokens": r.prompt_tokens, "cached_tokens": r.cached_tokens, "ttft_s": r.ttft_s,
                          "e2e_s": r.e2e_s, "error": r.error} for r in self.results],
            "request_errors": sorted({r.error for r in self.results if r.error})[:5],
        }


def _pct(xs: list[float], p: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def table(runs: list[Run]) -> str:
    rows = [("workload", "configuration", "rnd", "p50 TTFT", "p90 TTFT", "p50 ITL", "out tok/s", "hit share",
             "hit tokens by source")]
    for r in runs:
        if r.error:
            rows.append((r.workload, r.label, str(r.round), "failed", "", "", "", "", r.error.splitlines()[0][:60]))
            continue
        sm = r.summary()
        src = ", ".join(f"{k} {v}" for k, v in r.hit_tokens.items()) or "-"
        if r.kvtier_tiers:
            src += " (kvtier: " + ", ".join(f"{k} {v}" for k, v in r.kvtier_tiers.items()) + ")"
        rows.append((r.workload, r.label, str(r.round), ms(sm["ttft_p50_s"]), ms(sm["ttft_p90_s"]), ms(sm["itl_p50_s"]),
                     f"{sm['output_tok_s']:.1f}", f"{sm['hit_share']:.3f}", src + (f" [{sm['failed']} failed]" if sm["failed"] else "")))
    w = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w[i]) for i, c in enumerate(r)).rstrip() for r in rows)


def ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.0f} ms"


KVTIER = ("kvtier-manager", "kvtier-tier", "kvtier-router")
ALTERNATIVES = ("none", "cpu", "vllm-fs", "lmcache")


def _p50s(runs: list[Run], config: str, engines: int, workload: str) -> dict[int, float]:
    """p50 TTFT of each round of one configuration."""
    out = {}
    for r in runs:
        if r.config == config and r.engines == engines and r.workload == workload and not r.error:
            if (x := r.summary()["ttft_p50_s"]) is not None:
                out[r.round] = x
    return out


def bootstrap(xs: list[float], *, seed: int, n: int = 2000, level: float = 0.9) -> tuple[float, float]:
    """The bootstrap interval of the median of xs: xs resampled with
    replacement n times, the (1-level)/2 and (1+level)/2 quantiles of the
    resamples' medians."""
    if len(xs) < 2:
        return (xs[0], xs[0]) if xs else (float("nan"), float("nan"))
    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(xs, k=len(xs))) for _ in range(n))
    lo = _pct(meds, 100 * (1 - level) / 2)
    hi = _pct(meds, 100 * (1 + level) / 2)
    assert lo is not None and hi is not None
    return lo, hi


def ratios(runs: list[Run], *, seed: int = 1) -> list[dict[str, Any]]:
    """Every kvtier ÷ alternative ratio of p50 TTFT, per workload and engine
    count: one ratio per round in which both ran (paired by round: the two
    ran minutes apart on the same machine), their median and a bootstrap
    90 % interval of it."""
    out = []
    for w in sorted({r.workload for r in runs}):
        for n in sorted({r.engines for r in runs}):
            for k in KVTIER:
                mine = _p50s(runs, k, n, w)
                if not mine:
                    continue
                # The router's prefetch is measured against the same
                # configuration without it, too.
                for alt in ALTERNATIVES + (("kvtier-manager",) if k == "kvtier-router" else ()):
                    theirs = _p50s(runs, alt, n, w)
                    both = sorted(set(mine) & set(theirs))
                    if not both:
                        continue
                    per = [mine[i] / theirs[i] for i in both]
                    lo, hi = bootstrap(per, seed=seed)
                    out.append({"workload": w, "engines": n, "config": k, "against": alt, "rounds": len(per),
                                "per_round": per, "median": statistics.median(per), "lo": lo, "hi": hi})
    return out


def targets(runs: list[Run]) -> list[dict[str, Any]]:
    """Issue 40's targets, on the medians over rounds of the paired ratios
    (see ratios) and of the hit tokens."""
    rs = ratios(runs)

    def ratio(w: str, n: int, k: str, alt: str) -> dict[str, Any] | None:
        return next((x for x in rs if (x["workload"], x["engines"], x["config"], x["against"]) == (w, n, k, alt)), None)

    def p50(config: str, engines: int, workload: str) -> float | None:
        xs = list(_p50s(runs, config, engines, workload).values())
        return statistics.median(xs) if xs else None

    def hits(config: str, engines: int, workload: str) -> float | None:
        xs = [sum(r.hit_tokens.values()) for r in runs if r.config == config and r.engines == engines
              and r.workload == workload and not r.error]
        return statistics.median(xs) if xs else None

    out: list[dict[str, Any]] = []

    def check(w: str, n: int, k: str, alt: str, bound: float, upper: float | None, what: str) -> None:
        x = ratio(w, n, k, alt)
        if x is None:
            return
        met = x["median"] <= bound and (upper is None or x["hi"] <= upper)
        out.append({"workload": w, "target": what, "ratio": x["median"], "interval": [x["lo"], x["hi"]],
                    "against": alt + (f" x{n}" if n > 1 else ""), "met": met})

    for w in sorted({r.workload for r in runs}):
        best1 = [(c, v) for c in ("cpu", "vllm-fs", "lmcache") if (v := p50(c, 1, w)) is not None]
        best2 = [(c, v) for c in ("cpu", "vllm-fs", "lmcache") if (v := p50(c, 2, w)) is not None]
        if w == "no-reuse":
            for k in KVTIER:
                check(w, 1, k, "none", 1.03, 1.05, f"{k} p50 TTFT <= 1.03 x no offloading (interval's upper bound <= 1.05)")
        if w in ("mooncake", "agent") and best1:
            alt = min(best1, key=lambda x: x[1])[0]
            check(w, 1, "kvtier-manager", alt, 0.85, 0.9999,
                  "manager p50 TTFT <= 0.85 x best of cpu, vllm-fs, lmcache (upper bound < 1)")
        if w == "documents" and best2:
            alt = min(best2, key=lambda x: x[1])[0]
            check(w, 2, "kvtier-manager", alt, 0.7, None, "two engines: manager p50 TTFT <= 0.7 x best alternative")
        for n in (1, 2):
            check(w, n, "kvtier-router", "kvtier-manager", 0.8, None,
                  "router prefetch: p50 TTFT <= 0.8 x the same configuration without it (issue 41)")
        for engines in (1, 2):
            alts = [(c, v) for c in ALTERNATIVES if (v := hits(c, engines, w)) is not None]
            for mode in KVTIER:
                k = hits(mode, engines, w)
                if alts and k is not None:
                    c, v = max(alts, key=lambda x: x[1])
                    out.append({"workload": w, "target": f"{mode} hit tokens >= every alternative, within 1 % ({engines} engine(s))",
                                "ratio": k / v if v else None, "against": c, "met": k >= 0.99 * v})
    return out
