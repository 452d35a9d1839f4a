"""The serving benchmark's results: one Run per (configuration, engines,
workload, round), its summary, the table and the issue's targets."""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any

import serving_client as client

LABELS = {
    "none": "no offload", "cpu": "vLLM CPU offload", "vllm-fs": "vLLM CPU+FS tiering", "kvtier-tier": "kvtier tier mode",
    "kvtier-manager": "kvtier manager mode", "lmcache": "LMCache MP",
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
            "kvtier_tier_tokens": self.kvtier_tiers, "ttft_s": [r.ttft_s for r in self.ok()],
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


def targets(runs: list[Run]) -> list[dict[str, Any]]:
    """The issue's targets, checked on the medians of p50 TTFT over rounds."""
    def p50(config: str, engines: int, workload: str) -> float | None:
        xs = [r.summary()["ttft_p50_s"] for r in runs if r.config == config and r.engines == engines
              and r.workload == workload and not r.error]
        xs = [x for x in xs if x is not None]
        return statistics.median(xs) if xs else None

    def hits(config: str, engines: int, workload: str) -> float | None:
        xs = [sum(r.hit_tokens.values()) for r in runs if r.config == config and r.engines == engines
              and r.workload == workload and not r.error]
        return statistics.median(xs) if xs else None

    out = []
    for w in sorted({r.workload for r in runs}):
        m = p50("kvtier-manager", 1, w)
        best = [(c, v) for c in ("cpu", "vllm-fs", "lmcache") if (v := p50(c, 1, w)) is not None]
        if m is not None and best:
            c, v = min(best, key=lambda x: x[1])
            out.append({"workload": w, "target": "manager p50 TTFT <= 0.9 x best of cpu, vllm-fs, lmcache",
                        "ratio": m / v, "against": c, "met": m <= 0.9 * v})
        m2, c2 = p50("kvtier-manager", 2, w), p50("cpu", 2, w)
        if m2 is not None and c2 is not None:
            out.append({"workload": w, "target": "two engines: manager p50 TTFT <= 0.8 x native CPU",
                        "ratio": m2 / c2, "against": "cpu x2", "met": m2 <= 0.8 * c2})
        for engines in (1, 2):
            alts = [(c, v) for c in ("none", "cpu", "vllm-fs", "lmcache") if (v := hits(c, engines, w)) is not None]
            for mode in ("kvtier-manager", "kvtier-tier"):
                k = hits(mode, engines, w)
                if alts and k is not None:
                    c, v = max(alts, key=lambda x: x[1])
                    out.append({"workload": w, "target": f"{mode} hit tokens >= every alternative ({engines} engine(s))",
                                "ratio": k / v if v else None, "against": c, "met": k >= v})
    return out


