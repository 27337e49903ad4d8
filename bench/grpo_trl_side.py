"""One side of bench/grpo_vs_trl.py: GRPO steps with TRL's GRPOTrainer, run by the TRL virtual
environment's Python; prints one JSON object {"seconds": [per-step wall seconds], "cpu": [per-step
CPU seconds of the process]}.

    python bench/grpo_trl_side.py CKPT_DIR PROMPTS.jsonl STEPS THREADS [DTYPE [COMPILE(0|1)]]

The same checkpoint, tokenizer, prompts, sizes and reward as meshrl's side: 8 prompts x 4
completions of at most 32 tokens, one optimizer step per generation batch (num_iterations=1), KL to
the reference model (beta = meshrl's ppo.kl_coef), temperature 1, learning rate 1e-5.
"""

from __future__ import annotations

import json
import sys
import tempfile

import torch


def numeric_distance(response: str, answer: str) -> float:
    """meshrl's numeric_distance rule (meshrl/algo/rewards.py), copied: this side imports no meshrl."""
    try:
        got, want = float(response.strip()), float(answer.strip())
    except ValueError:
        return 0.0
    return max(0.0, 1.0 - abs(got - want) / 10.0)


def main() -> None:
    ckpt, data, steps, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    bf16 = len(sys.argv) > 5 and sys.argv[5] == "bfloat16"  # TRL's default: bf16 mixed precision (autocast)
    torch_compile = len(sys.argv) > 6 and sys.argv[6] == "1"  # the Trainer's torch.compile of the model
    torch.set_num_threads(threads)
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    rows = [json.loads(line) for line in open(data)]
    ds = Dataset.from_list([{"prompt": r["prompt"], "answer": r["answer"]} for r in rows])

    def reward(completions, answer, **_):
        return [numeric_distance(c, a) for c, a in zip(completions, answer, strict=True)]

    from trl_timer import StepTimer  # bench/ is this script's directory

    timer = StepTimer()
    with tempfile.TemporaryDirectory() as out:
        cfg = GRPOConfig(output_dir=out, per_device_train_batch_size=32, num_generations=4,
                         max_completion_length=32, gradient_accumulation_steps=1, num_iterations=1, beta=0.04,
                         learning_rate=1e-5, temperature=1.0, max_steps=steps, logging_steps=1, report_to="none",
                         use_cpu=True, save_strategy="no", seed=1, dataloader_num_workers=0, bf16=bf16,
                         torch_compile=torch_compile,
                         disable_tqdm=True)
        model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)
        trainer = GRPOTrainer(model=model, reward_funcs=reward, args=cfg, train_dataset=ds,
                              processing_class=AutoTokenizer.from_pretrained(ckpt), callbacks=[timer])
        trainer.train()
    print(json.dumps({"seconds": timer.seconds, "cpu": timer.cpu}))


if __name__ == "__main__":
    main()
