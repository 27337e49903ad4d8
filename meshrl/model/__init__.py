"""The model: LLaMA / Qwen2 / Mistral decoder, value head, HF checkpoint I/O, generation, tokenizers.

Names are resolved lazily (PEP 562), so ``from meshrl.model import ModelConfig`` (used by the planner
to size 70B models) never imports torch; ``from meshrl.model import load_pretrained`` does.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "ModelConfig": "config", "ConfigError": "config", "param_shapes": "config", "num_params": "config",
    "PRESETS": "presets", "get_preset": "presets",
    "CausalLM": "transformer", "ValueModel": "transformer", "KVCache": "transformer",
    "load_pretrained": "checkpoint", "save_pretrained": "checkpoint", "build_model": "checkpoint",
    "read_config": "checkpoint",
    "generate": "generation", "GenerationConfig": "generation", "GenerationOutput": "generation",
    "sequence_logprobs": "generation",
    "ByteTokenizer": "tokenizer", "HFTokenizer": "tokenizer", "load_tokenizer": "tokenizer",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'meshrl.model' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
