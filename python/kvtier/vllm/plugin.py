"""The ``vllm.general_plugins`` entry point: registers kvtier's names.

vLLM calls register() in every engine and worker process. It only adds
names to vLLM's registries (the classes import when vLLM first builds
one), so it is cheap and safe to call more than once.
"""

from __future__ import annotations

import logging

log = logging.getLogger("kvtier.vllm")

#: The secondary tier type users write in ``secondary_tiers``.
TIER_TYPE = "kvtier"
#: The offloading spec of manager mode (``spec_name``).
SPEC_NAME = "KvtierOffloadingSpec"


def register() -> None:
    from kvtier.vllm import _compat as vc

    registry = getattr(vc.SecondaryTierFactory, "_registry", {})
    if TIER_TYPE not in registry:
        vc.SecondaryTierFactory.register_tier(TIER_TYPE, "kvtier.vllm", "KvtierSecondaryTier")
        log.debug("kvtier: registered secondary tier type %r", TIER_TYPE)
    for name in (SPEC_NAME, "KvtierTieringOffloadingSpec"):
        if name not in getattr(vc.OffloadingSpecFactory, "_registry", {}):
            vc.OffloadingSpecFactory.register_spec(name, "kvtier.vllm", name)
