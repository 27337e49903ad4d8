"""Writing a Hugging Face checkpoint directory: ``config.json`` plus ``model.safetensors``, or
shards listed in ``model.safetensors.index.json`` (the format ``transformers`` reads). Reading is
meshrl/model/checkpoint.py's; this half knows the models only as modules with HF parameter names
(``CausalLM``, or ``ValueModel`` with its ``score`` head), so model/transformer.py can offer
``save_pretrained`` without importing the reader."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from .config import ARCHITECTURES
from .hf_config import config_to_hf

WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
DEFAULT_MAX_SHARD_BYTES = 5 * 1024**3  # transformers' long-standing "5GB" default


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _state_to_save(model: nn.Module) -> dict[str, torch.Tensor]:
    """Contiguous CPU tensors with HF names; tied lm_head omitted as HF does (safetensors refuses
    two names for one storage)."""
    state = {}
    for name, t in model.state_dict().items():
        if name == "lm_head.weight" and model.config.tie_word_embeddings:
            continue
        state[name] = t.detach().to("cpu").contiguous()
    return state


def hf_config_dict(model: nn.Module) -> dict:
    d = config_to_hf(model.config)
    d["torch_dtype"] = _dtype_name(next(model.parameters()).dtype)
    d["dtype"] = d["torch_dtype"]
    if hasattr(model, "score"):  # a ValueModel (its head is ``score``; a CausalLM's is ``lm_head``)
        # Same layout as HF's *ForTokenClassification with one label (whose bias we do not use).
        d["architectures"] = [ARCHITECTURES[model.config.model_type].replace("ForCausalLM",
                                                                             "ForTokenClassification")]
        d["num_labels"] = 1
    return d


def save_safetensors(tensors: dict[str, torch.Tensor], path: Path, meta: dict[str, str]) -> None:
    """safetensors' save_file, with the permissions of any other file the user writes: it creates
    its file with mode 0600 whatever the umask, which hides a shared checkpoint from other users."""
    save_file(tensors, str(path), metadata=meta)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def save_pretrained(model: nn.Module, path: str | os.PathLike,
                    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES) -> None:
    """Write ``config.json`` and ``model.safetensors``, or shards plus an index when the weights
    exceed ``max_shard_bytes`` (shard file names follow HF: model-00001-of-00003.safetensors)."""
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    state = _state_to_save(model)
    (root / "config.json").write_text(json.dumps(hf_config_dict(model), indent=2) + "\n")
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, t in state.items():
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nbytes
    meta = {"format": "pt"}
    for stale in [root / WEIGHTS_NAME, root / INDEX_NAME, *root.glob("model-*-of-*.safetensors")]:
        stale.unlink(missing_ok=True)  # never leave a mix of old and new weights behind
    if len(shards) == 1:
        save_safetensors(shards[0], root / WEIGHTS_NAME, meta)
        return
    weight_map = {}
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_safetensors(shard, root / fname, meta)
        weight_map.update({name: fname for name in shard})
    total = sum(t.numel() * t.element_size() for t in state.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (root / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n")
