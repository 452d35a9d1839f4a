"""An engine without a model: vLLM's real Scheduler with the
OffloadingConnector in both roles in one process, CPU tensors as the "GPU"
KV caches, and a "model" that writes, into every KV block it computes, bytes
derived from the block's tokens — so that a block loaded back from an
offload tier can be checked byte for byte. Our own code, in the style of
vLLM's connector unit tests (which are not in the wheel).
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import tempfile
import uuid
from typing import Any

import torch

BLOCK = 16  # tokens per GPU block
LAYERS = ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"]
KV_HEADS, HEAD = 2, 16
EOS = 2


def tiny_model_dir() -> str:
    """A local LlamaForCausalLM config: no download, no weights needed."""
    d = pathlib.Path(tempfile.mkdtemp(prefix="tiny-llama"))
    (d / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": len(LAYERS), "num_attention_heads": 4, "num_key_value_heads": KV_HEADS, "vocab_size": 512,
        "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "torch_dtype": "float16", "tie_word_embeddings": False,
        "bos_token_id": 1, "eos_token_id": EOS,
    }))
    return str(d)


def block_bytes(tokens: list[int], layer: int, page: int) -> torch.Tensor:
    """The KV bytes the "model" writes for a block of tokens in a layer."""
    seed = hashlib.sha256(json.dumps([layer, tokens]).encode()).digest()
    reps = page // len(seed) + 1
    return torch.frombuffer(bytearray((seed * reps)[:page]), dtype=torch.int8)


class Engine:
    """One engine: scheduler + worker connector over host "GPU" caches."""

    def __init__(self, extra_config: dict[str, Any], *, num_gpu_blocks: int = 64, model: str | None = None,
                 engine_id: str | None = None) -> None:
        from vllm.config import (
            CacheConfig,
            DeviceConfig,
            KVTransferConfig,
            ModelConfig,
            SchedulerConfig,
            VllmConfig,
            set_current_vllm_config,
        )
        from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorRole
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import OffloadingConnector
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
        from vllm.v1.structured_output import StructuredOutputManager

        mc = ModelConfig(model=model or tiny_model_dir(), skip_tokenizer_init=True, dtype="float16",
                         max_model_len=256, enforce_eager=True)
        self.config = VllmConfig(
            model_config=mc,
            cache_config=CacheConfig(block_size=BLOCK, enable_prefix_caching=True),
            scheduler_config=SchedulerConfig(max_num_batched_tokens=1024, max_num_seqs=16, max_model_len=256, is_encoder_decoder=False),
            device_config=DeviceConfig(device="cpu"),
            kv_transfer_config=KVTransferConfig(kv_connector="OffloadingConnector", kv_role="kv_both",
                                                engine_id=engine_id or f"engine-{uuid.uuid4().hex[:8]}",
                                                kv_connector_extra_config=extra_config),
        )
        self.config.scheduler_config.async_scheduling = False
        spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=KV_HEADS, head_size=HEAD, dtype=torch.float16)
        self.page = spec.page_size_bytes
        self.kv_cache_config = KVCacheConfig(num_blocks=num_gpu_blocks, kv_cache_tensors=[],
                                             kv_cache_groups=[KVCacheGroupSpec(list(LAYERS), spec)])
        self.config.cache_config.num_gpu_blocks = num_gpu_blocks
        self.scheduler = Scheduler(vllm_config=self.config, kv_cache_config=self.kv_cache_config,
                                   structured_output_manager=StructuredOutputManager(self.config), block_size=BLOCK, log_stats=True)
        self.worker = OffloadingConnector(self.config, KVConnectorRole.WORKER, self.kv_cache_config)
        # The "GPU" KV caches: one page per block per layer, block-major.
        self.kv = {name: torch.zeros((num_gpu_blocks, 2, BLOCK, KV_HEADS, HEAD), dtype=torch.float16) for name in LAYERS}
        with set_current_vllm_config(self.config):
            self.worker.register_kv_caches(self.kv)
        init_none_hash(sha256)
        self._hasher = get_request_block_hasher(BLOCK, sha256)
        self.tokens: dict[str, list[int]] = {}
        self.finished: list[str] = []
        # rid -> (blocks with the right bytes, blocks not computed here) at
        # the request's first compute step.
        self.reused: dict[str, tuple[int, int]] = {}

    @property
    def manager(self) -> Any:
        return self.scheduler.connector.connector_scheduler.manager

    def add(self, rid: str, tokens: list[int], params: dict[str, Any] | None = None) -> None:
        from vllm import SamplingParams
        from vllm.v1.request import Request

        sp = SamplingParams(max_tokens=1, extra_args={"kv_transfer_params": params} if params is not None else None)
        sp.update_from_generation_config({}, EOS)
        self.tokens[rid] = list(tokens)
        self.scheduler.add_request(Request(request_id=rid, prompt_token_ids=list(tokens), sampling_params=sp,
                                           pooling_params=None, block_hasher=self._hasher))

    def blocks_of(self, rid: str) -> list[int]:
        mgr = self.scheduler.kv_cache_manager.coordinator.single_type_managers[0]
        return [b.block_id for b in mgr.req_to_blocks.get(rid, [])]

    def gpu_block(self, layer: int, block_id: int) -> torch.Tensor:
        return self.kv[LAYERS[layer]].view(torch.int8).view(-1, self.page)[block_id]

    def _compute(self, out: Any) -> None:
        """The "model": writes the KV bytes of every prompt block this step
        completes."""
        for rid, n in out.num_scheduled_tokens.items():
            req = self.scheduler.requests[rid]
            # schedule() has already advanced num_computed_tokens by n.
            end = req.num_computed_tokens
            start = end - n
            toks = self.tokens[rid]
            blocks = self.blocks_of(rid)
            if rid not in self.reused:
                # The blocks before start were not computed here: prefix-cache
                # hits or loads from the offload tiers. Check their bytes.
                good = sum(self._block_ok(toks, blocks, j) for j in range(start // BLOCK))
                self.reused[rid] = (good, start // BLOCK)
            for j in range(start // BLOCK, min(end, len(toks)) // BLOCK):
                if (j + 1) * BLOCK > end:
                    continue
                for layer in range(len(LAYERS)):
                    self.gpu_block(layer, blocks[j]).copy_(block_bytes(toks[j * BLOCK:(j + 1) * BLOCK], layer, self.page))

    def step(self) -> Any:
        from vllm.forward_context import ForwardContext
        from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput

        out = self.scheduler.schedule()
        meta = out.kv_connector_metadata
        self.worker.handle_preemptions(meta)
        self.worker.bind_connector_metadata(meta)
        self.worker.start_load_kv(ForwardContext(no_compile_layers={}, attn_metadata={}, slot_mapping={}))
        if out.total_num_scheduled_tokens > 0:
            self._compute(out)
        # As vLLM's model runner, with or without a forward: the step's
        # stores are queued here.
        self.worker.wait_for_save()
        # As vLLM's KVConnectorModelRunnerMixin reports a step.
        tr = self.worker.get_transfer_results(out.finished_req_ids)
        kvo = KVConnectorOutput(
            finished_sending=tr.finished_sending, finished_recving=tr.finished_recving,
            failed_recving=tr.failed_recving, invalid_block_ids=self.worker.get_block_ids_with_load_errors(),
            kv_connector_stats=self.worker.get_kv_connector_stats(),
            kv_connector_worker_meta=self.worker.build_connector_worker_meta(),
        )
        self.worker.clear_connector_metadata()
        running = [r.request_id for r in self.scheduler.running]
        mro = ModelRunnerOutput(
            req_ids=running, req_id_to_index={r: i for i, r in enumerate(running)},
            sampled_token_ids=[[EOS] if r in out.num_scheduled_tokens else [] for r in running],
            kv_connector_output=kvo,
        )
        outs = self.scheduler.update_from_output(out, mro)
        for eo in outs.values():
            for o in eo.outputs:
                if o.finish_reason is not None:
                    self.finished.append(o.request_id)
        return out

    def run(self, max_steps: int = 500) -> None:
        """Steps until every request finished and the connector is idle."""
        import time

        for _ in range(max_steps):
            if not self.scheduler.requests and not self.scheduler.has_requests() and not self.manager.has_pending_work():
                return
            self.step()
            time.sleep(0.002)  # tier jobs run on the daemon meanwhile
        m = self.manager
        detail = {
            "requests": list(self.scheduler.requests),
            "tiers": [(type(t).__name__, t.has_pending_work(), vars(t).get("_outstanding"), vars(t).get("_inflight_lookups"), vars(t).get("_finished")) for t in getattr(m, "secondary_tiers", [])],
            "manager_jobs": len(getattr(m, "_jobs", {})),
            "req_state": list(getattr(m, "_req_state", {})),
            "waiting": [(r.request_id, str(r.status)) for r in self.scheduler.waiting],
            "running": [r.request_id for r in self.scheduler.running],
            "connector_jobs": {j: (st.req_id, st.is_store, st.pending_count) for j, st in self.scheduler.connector.connector_scheduler._jobs.items()},
            "proxy": {k: v for k, v in vars(m).items() if k in ("_in_flight", "_up", "_attached", "_gen", "_outstanding")
                      or k.startswith("_b_") and v},
            "pending": {rid: [k.hex()[:8] for k in r.asked]
                        for rid, r in getattr(m, "_reqs", {}).items()},
        }
        import sys
        import threading
        import traceback

        names = {t.ident: t.name for t in threading.enumerate()}
        stacks = {f"{names.get(i)}-{i}": traceback.format_stack(f)[-6:] for i, f in sys._current_frames().items()
                  if str(names.get(i, "")).startswith("kvtier")}
        raise AssertionError(f"engine not idle after {max_steps} steps: {detail}; kvtier threads: {stacks}")

    def _block_ok(self, toks: list[int], blocks: list[int], j: int) -> bool:
        return all(torch.equal(self.gpu_block(layer, blocks[j]), block_bytes(toks[j * BLOCK:(j + 1) * BLOCK], layer, self.page))
                   for layer in range(len(LAYERS)))

    def reset_prefix_cache(self) -> None:
        assert self.scheduler.reset_prefix_cache(reset_connector=True), "reset_prefix_cache refused"

    def shutdown(self) -> None:
        self.worker.shutdown()
        self.scheduler.shutdown()
