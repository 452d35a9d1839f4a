"""The SGLang backend's options: the keys kvtier reads from
``--hicache-storage-backend-extra-config`` (SGLang's own keys pass), checked
when the backend is built, and the kv_transfer_params of each call."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional

from kvtier.sglang import _compat as sc


@dataclass(frozen=True)
class Options:
    """The backend's keys in ``--hicache-storage-backend-extra-config``."""

    target: str = "unix:///run/kvtier/kvtier.sock"
    token: Optional[str] = None
    token_file: Optional[str] = None
    timeout_s: float = 10.0
    lookup_timeout_s: float = 2.0
    reconnect_interval_s: float = 1.0
    hold_s: float = 10.0
    kv_load_tiers: Optional[list] = None
    kv_store_tiers: Optional[list] = None

    @classmethod
    def parse(cls, extra: dict[str, Any]) -> "Options":
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(k for k in extra if k not in known and k not in sc.SGLANG_KEYS)
        if unknown:
            raise ValueError(
                f"kvtier.sglang: unknown key(s) {unknown} in --hicache-storage-backend-extra-config "
                f"(kvtier's: {sorted(known)}; SGLang's: {sorted(sc.SGLANG_KEYS)})")
        kw: dict[str, Any] = {k: extra[k] for k in known if k in extra}
        for k in ("timeout_s", "lookup_timeout_s", "reconnect_interval_s", "hold_s"):
            if k in kw:
                try:
                    kw[k] = float(kw[k])
                except (TypeError, ValueError):
                    raise ValueError(f"kvtier.sglang: {k} must be a number of seconds, not {kw[k]!r}") from None
                floor_ok = kw[k] >= 0 if k == "hold_s" else kw[k] > 0  # hold_s 0: hold no pins
                if not floor_ok:
                    raise ValueError(f"kvtier.sglang: {k} must be {'at least 0' if k == 'hold_s' else 'positive'}, "
                                     f"not {kw[k]!r}")
        for k in ("kv_load_tiers", "kv_store_tiers"):
            if k in kw and kw[k] is not None and not isinstance(kw[k], list):
                raise ValueError(f"kvtier.sglang: {k} must be a list of tier selectors (as in kv_transfer_params), "
                                 f"not {kw[k]!r}")
        for k in ("target", "token", "token_file"):
            if k in kw and kw[k] is not None and not isinstance(kw[k], str):
                raise ValueError(f"kvtier.sglang: {k} must be a string, not {kw[k]!r}")
        from kvtier.client import token_of

        kw["token"] = token_of(kw.get("token"), kw.pop("token_file", None), "kvtier.sglang")
        return cls(**kw)

    def params(self, key: str, extra_info: Any = None) -> str:
        """The kv_transfer_params of one call's request: the per-call
        filter SGLang passed (extra_info.extra_info[key]; SGLang 0.5.23
        passes none), else the configured default, else none (the
        daemon's defaults)."""
        v = getattr(self, key)
        per_call = getattr(extra_info, "extra_info", None)
        if isinstance(per_call, dict) and key in per_call:
            v = per_call[key]
        return json.dumps({key: v}) if v is not None else ""
