"""meshrl's engine against vLLM on the same weights, in one run (``bench/generate.py --backend
meshrl,vllm``): greedy generation tokens/s per batch size and dtype after a warm-up call each, the
share of rows whose greedy completions are equal, and optionally one GRPO iteration per backend.

Both engines get the same token ids, the same GenerationConfig and the same weights (meshrl's model,
loaded into vLLM through meshrl's weight sync); runs alternate meshrl/vLLM so that noise from other
processes hits both alike; medians of wall time. A preset model decodes all ``--new-tokens`` (no
EOS), a checkpoint directory with a chat template (SmolLM2) stops at its end of turn, on its
held-out prompts (examples/smollm2/data/eval.jsonl) cycled to the batch size.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import torch

EVAL = Path(__file__).parents[1] / "examples" / "smollm2" / "data" / "eval.jsonl"


def _workload(model_arg: str, batch: int, new_tokens: int, prompt_lens: tuple[int, int], dtype):
    """-> (meshrl model, prompts, GenerationConfig) for a preset (random spread weights) or a checkpoint."""
    from meshrl.model import GenerationConfig, load_pretrained

    if Path(model_arg).is_dir():
        from meshrl.commands.generate import encode_all
        from meshrl.data.chat import end_of_turn_id
        from meshrl.model import load_tokenizer

        model, tok = load_pretrained(model_arg, dtype=dtype).eval(), load_tokenizer(model_arg)
        lines = EVAL.read_text().splitlines()
        items = [[{"role": "user", "content": json.loads(lines[i % len(lines)])["prompt"]}] for i in range(batch)]
        prompts = encode_all(tok, model_arg, items, chat=True)
        eos, pad = end_of_turn_id(model_arg, tok), tok.pad_token_id or 0
        return model, prompts, GenerationConfig(max_new_tokens=new_tokens, greedy=True, eos_token_id=eos,
                                                pad_token_id=pad)
    from bench_models import MODELS
    from generate import _prompts

    from meshrl.model.transformer import CausalLM

    torch.manual_seed(0)
    model = CausalLM(MODELS[model_arg])
    with torch.no_grad():  # spread the logits (std 0.1) so greedy decoding is far from ties
        for p in model.parameters():
            p.normal_(0.0, 0.1) if p.dim() > 1 else p.fill_(1.0)
    prompts = _prompts(batch, model.config.vocab_size, *prompt_lens)
    return model.to(dtype).eval(), prompts, GenerationConfig(max_new_tokens=new_tokens, greedy=True,
                                                             eos_token_id=None, pad_token_id=0)


def _rows(out) -> list[list[int]]:
    return [out.responses[i, :int(out.response_mask[i].sum())].tolist() for i in range(out.responses.shape[0])]


def compare(model_arg: str, batches: list[int], dtypes: list[str], new_tokens: int, repeats: int,
            prompt_lens: tuple[int, int]) -> None:
    from meshrl.gen.vllm_engine import VllmGenerator
    from meshrl.model import generate

    for dtype_name in dtypes:
        dtype = getattr(torch, dtype_name)
        engine = None
        for batch in batches:
            model, prompts, cfg = _workload(model_arg, batch, new_tokens, prompt_lens, dtype)
            if engine is None:  # one engine per dtype, its weights synced from meshrl's model
                engine = VllmGenerator(model.config, dtype, 0, model.config.max_position_embeddings)
                engine.load_weights(model.state_dict().items())
            with torch.no_grad():
                ours, theirs = _rows(generate(model, prompts, cfg)), _rows(engine.generate(prompts, cfg))  # warm-up
            same = sum(a == b for a, b in zip(ours, theirs, strict=True)) / len(prompts)
            runs: dict[str, list[tuple[float, int]]] = {"meshrl": [], "vllm": []}
            for _ in range(repeats):
                for name, fn in (("meshrl", partial(generate, model, prompts, cfg)),
                                 ("vllm", partial(engine.generate, prompts, cfg))):
                    t0 = time.perf_counter()
                    with torch.no_grad():
                        out = fn()
                    runs[name].append((time.perf_counter() - t0, int(out.response_mask.sum())))
            tok_s = {n: statistics.median(tokens / s for s, tokens in r) for n, r in runs.items()}
            print(f"{model_arg} {dtype_name} batch {batch:3d}, {new_tokens} new tokens greedy: meshrl "
                  f"{tok_s['meshrl']:8.1f} tok/s, vLLM {tok_s['vllm']:8.1f} tok/s, meshrl/vLLM "
                  f"{tok_s['meshrl'] / tok_s['vllm']:.2f}x; greedy completions equal {same:.0%}", flush=True)
        if engine is not None:
            engine.close()


def grpo_iteration(config: str, backends: list[str], overrides: list[str]) -> None:
    """One warm GRPO iteration per backend: ``meshrl train CONFIG gen.backend=B train.iterations=2``,
    iteration 1's time/iteration and time/call/actor_gen (iteration 0 includes the engines' start)."""
    for backend in backends:
        with tempfile.TemporaryDirectory() as out:
            cmd = [sys.executable, "-m", "meshrl.cli", "train", config, f"gen.backend={backend}",
                   "train.iterations=2", "eval.every=1000", *overrides, "--out", f"{out}/run"]
            subprocess.run(cmd, check=True, capture_output=True)
            rec = [json.loads(x) for x in Path(f"{out}/run/metrics.jsonl").read_text().splitlines()][-1]
        print(f"GRPO iteration ({config}, gen.backend={backend}): {rec['time/iteration']:.2f} s, of which "
              f"actor_gen {rec.get('time/call/actor_gen', 0.0):.2f} s; weight sync {rec['time/weight_sync']:.3f} s, "
              f"{rec['weight_sync/bytes'] / 2**20:.1f} MiB; rollout/logp_diff_max {rec['rollout/logp_diff_max']:.2e}",
              flush=True)
