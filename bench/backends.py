"""meshrl's engine against vLLM on the same weights, in one run (``bench/generate.py --backend
meshrl,vllm``): greedy generation tokens/s per batch size and dtype after a warm-up call each, the
share of rows whose greedy completions are equal, and optionally one GRPO iteration per backend.

Both engines get the same token ids, the same GenerationConfig and the same weights (meshrl's model,
loaded into vLLM through meshrl's weight sync); each runs in a process of its own (``--worker``),
processes alternating meshrl/vLLM so that noise from other processes hits both alike; medians of wall
time. A preset model decodes all ``--new-tokens`` (no
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


def _engine(backend: str, model):
    """(generate(prompts, cfg) -> GenerationOutput, close()) of one backend on ``model``'s weights."""
    from meshrl.model import generate

    if backend == "meshrl":
        return partial(generate, model), lambda: None
    from meshrl.commands.bench_generate import vllm_bench_engine

    return vllm_bench_engine(model, 0)


def worker(backend: str, model_arg: str, batch: int, dtype_name: str, new_tokens: int, repeats: int,
           prompt_lens: tuple[int, int]) -> dict:
    """One backend in this process: a warm-up call, then ``repeats`` timed ones ->
    {"tok_s": [per run], "rows": greedy completions}."""
    dtype = getattr(torch, dtype_name)
    model, prompts, cfg = _workload(model_arg, batch, new_tokens, prompt_lens, dtype)
    gen, close = _engine(backend, model)
    with torch.no_grad():
        rows = _rows(gen(prompts, cfg))  # warm-up
        tok_s = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            out = gen(prompts, cfg)
            tok_s.append(int(out.response_mask.sum()) / (time.perf_counter() - t0))
    close()
    return {"tok_s": tok_s, "rows": rows}


def _spawn(backend: str, model_arg: str, batch: int, dtype_name: str, new_tokens: int, repeats: int,
           prompt_lens: tuple[int, int], threads: int) -> dict:
    cmd = [sys.executable, __file__, "--worker", backend, "--model", model_arg, "--batch", str(batch),
           "--dtype", dtype_name, "--new-tokens", str(new_tokens), "--repeats", str(repeats),
           "--prompt-len", ",".join(map(str, prompt_lens)), "--threads", str(threads)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{backend} worker failed ({' '.join(cmd)}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def compare(model_arg: str, batches: list[int], dtypes: list[str], new_tokens: int, repeats: int,
            prompt_lens: tuple[int, int], threads: int = 0, rounds: int = 2) -> None:
    """Per dtype and batch, each backend in its own process (an engine binds its process's threads:
    vLLM's CPU build pins them, which slows the other engine of the same process), ``rounds``
    processes each in alternating order, ``repeats`` timed calls in each; medians over all calls."""
    for dtype_name in dtypes:
        for batch in batches:
            runs: dict[str, list[float]] = {"meshrl": [], "vllm": []}
            rows: dict[str, list] = {}
            for r in range(rounds):
                for backend in ("meshrl", "vllm") if r % 2 == 0 else ("vllm", "meshrl"):
                    got = _spawn(backend, model_arg, batch, dtype_name, new_tokens, repeats, prompt_lens, threads)
                    runs[backend] += got["tok_s"]
                    rows[backend] = got["rows"]
            tok_s = {n: statistics.median(r) for n, r in runs.items()}
            same = sum(a == b for a, b in zip(rows["meshrl"], rows["vllm"], strict=True)) / batch
            print(f"{model_arg} {dtype_name} batch {batch:3d}, {new_tokens} new tokens greedy: meshrl "
                  f"{tok_s['meshrl']:8.1f} tok/s, vLLM {tok_s['vllm']:8.1f} tok/s, meshrl/vLLM "
                  f"{tok_s['meshrl'] / tok_s['vllm']:.2f}x; greedy completions equal {same:.0%} "
                  f"(one engine a process, {rounds} processes x {repeats} calls each)", flush=True)


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


def _worker_main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description="one backend's side of compare(), in its own process")
    ap.add_argument("--worker", choices=("meshrl", "vllm"), required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--dtype", required=True)
    ap.add_argument("--new-tokens", type=int, required=True)
    ap.add_argument("--repeats", type=int, required=True)
    ap.add_argument("--prompt-len", required=True)
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    got = worker(a.worker, a.model, a.batch, a.dtype, a.new_tokens, a.repeats, tuple(map(int, a.prompt_len.split(","))))
    print(json.dumps(got), flush=True)


if __name__ == "__main__":  # vLLM's engine process needs the guard
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    _worker_main()
