"""One side of bench/grpo_smollm2_vs_trl.py: GRPO steps on SmolLM2-135M-Instruct with TRL's
GRPOTrainer, run by the TRL virtual environment's Python; prints one JSON object {"seconds": [per
step wall seconds], "cpu": [per step CPU seconds of this process]}.

    python bench/grpo_smollm2_trl_side.py CKPT_DIR PROMPTS.jsonl STEPS THREADS

The settings of examples/smollm2/grpo.yaml: chat prompts through the checkpoint's template, 8
prompts x 4 completions of at most 16 tokens, one optimizer step per generation batch, KL to the
reference model (beta 0.01, TRL's k3 as meshrl's GRPO default), temperature 1, learning rate 5e-6,
float32, token-mean loss (TRL's "dapo" = meshrl's token-mean), the example's reward functions
(correct + 0.2 x concise, the file itself, which imports no meshrl).
"""

from __future__ import annotations

import importlib.util
import json
import sys
import tempfile
from pathlib import Path

import torch

REWARDS = Path(__file__).resolve().parents[1] / "examples" / "smollm2" / "rewards.py"


def main() -> None:
    ckpt, data, steps, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    torch.set_num_threads(threads)
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    spec = importlib.util.spec_from_file_location("smollm2_rewards", REWARDS)
    rw = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rw)
    rows = [json.loads(line) for line in open(data)]
    ds = Dataset.from_list([{"prompt": [{"role": "user", "content": r["prompt"]}], "answer": r["answer"]}
                            for r in rows])

    def reward(completions, answer, **_):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [rw.correct("", t, a) + 0.2 * rw.concise("", t, a) for t, a in zip(texts, answer, strict=True)]

    from trl_timer import StepTimer  # bench/ is this script's directory

    timer = StepTimer()
    with tempfile.TemporaryDirectory() as out:
        cfg = GRPOConfig(output_dir=out, per_device_train_batch_size=32, num_generations=4,
                         max_completion_length=16, gradient_accumulation_steps=1, num_iterations=1, beta=0.01,
                         learning_rate=5e-6, temperature=1.0, max_steps=steps, logging_steps=1, report_to="none",
                         use_cpu=True, save_strategy="no", seed=1, dataloader_num_workers=0, bf16=False,
                         disable_tqdm=True, loss_type="dapo")
        model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)
        trainer = GRPOTrainer(model=model, reward_funcs=reward, args=cfg, train_dataset=ds,
                              processing_class=AutoTokenizer.from_pretrained(ckpt), callbacks=[timer])
        trainer.train()
    print(json.dumps({"seconds": timer.seconds, "cpu": timer.cpu}))


if __name__ == "__main__":
    main()
