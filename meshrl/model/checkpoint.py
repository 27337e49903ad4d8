"""Hugging Face checkpoint I/O and random initialisation.

A checkpoint directory holds ``config.json`` plus either ``model.safetensors`` or shards listed in
``model.safetensors.index.json`` (the format ``transformers`` reads and writes). Models are built on
the meta device and then receive real tensors with ``load_state_dict(assign=True)``, so loading
never allocates a throw-away random copy (gpt-fast does the same). Only safetensors are read: no
pickle ever runs on a file a user did not make.

Every bad input raises :class:`~meshrl.errors.UserError` naming the file or the tensor.
"""

from __future__ import annotations

import json
import os
from contextlib import ExitStack
from pathlib import Path

import torch
from safetensors import safe_open

from ..errors import UserError
from .config import ModelConfig, param_shapes
from .hf_config import config_from_hf
from .hf_save import DEFAULT_MAX_SHARD_BYTES, INDEX_NAME, WEIGHTS_NAME, save_pretrained  # noqa: F401 (the API)
from .presets import get_preset
from .transformer import CausalLM, ValueModel

INIT_STD = 0.02  # HF's initializer_range default for the LLaMA family

# Older LLaMA conversions stored rotary buffers; they are derived from the config, so skip them.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


# ---- config ---------------------------------------------------------------------------------------
def read_config(path: str | os.PathLike) -> tuple[ModelConfig, dict]:
    """Read ``path/config.json`` -> (ModelConfig, the raw dict). Errors name the file."""
    root = Path(path)
    if not root.exists():
        raise UserError(f"checkpoint directory {str(root)!r} does not exist")
    if not root.is_dir():
        raise UserError(f"checkpoint path {str(root)!r} is not a directory")
    cfg_file = root / "config.json"
    if not cfg_file.is_file():
        raise UserError(f"{cfg_file}: no config.json in the checkpoint directory")
    try:
        raw = json.loads(cfg_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{cfg_file}: malformed JSON ({e})") from None
    if not isinstance(raw, dict):
        raise UserError(f"{cfg_file}: expected a JSON object, got {type(raw).__name__}")
    try:
        return config_from_hf(raw), raw
    except UserError as e:
        raise UserError(f"{cfg_file}: {e}") from None
    except (TypeError, ValueError) as e:
        raise UserError(f"{cfg_file}: invalid value ({e})") from None


# ---- construction -----------------------------------------------------------------------------
def _build_meta(cfg: ModelConfig, value_head: bool) -> CausalLM | ValueModel:
    with torch.device("meta"):
        return ValueModel(cfg) if value_head else CausalLM(cfg)


def _assign(model: CausalLM | ValueModel, state: dict[str, torch.Tensor]) -> CausalLM | ValueModel:
    """Give a meta-device model its real tensors. ``assign=True`` replaces Parameter objects, which
    breaks tying, so the tied head is re-pointed at the embedding afterwards."""
    tied = isinstance(model, CausalLM) and model.config.tie_word_embeddings
    if tied:
        state = {**state, "lm_head.weight": state["model.embed_tokens.weight"]}
    model.load_state_dict(state, strict=True, assign=True)
    if tied:
        model.lm_head.weight = model.model.embed_tokens.weight
    return model.eval()


def init_tensor(name: str, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """HF's LLaMA init: norms = 1, biases = 0, every other weight ~ N(0, 0.02). float32 on CPU."""
    if name.endswith("norm.weight"):  # input/post_attention_layernorm, q_norm, k_norm, model.norm
        return torch.ones(shape)
    if name.endswith(".bias"):
        return torch.zeros(shape)
    return torch.empty(shape).normal_(0.0, INIT_STD, generator=gen)


def build_model(cfg: ModelConfig | str, seed: int = 0, value_head: bool = False,
                dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
                ) -> CausalLM | ValueModel:
    """A randomly initialised model (a preset name or a ModelConfig), deterministic for ``seed``.

    Tensors are drawn in float32 on the CPU in HF parameter order from one generator, then cast
    and moved, so the same seed gives the same weights on every device and in every dtype."""
    if isinstance(cfg, str):
        cfg = get_preset(cfg)
    gen = torch.Generator().manual_seed(seed)
    state = {name: init_tensor(name, shape, gen).to(device=device, dtype=dtype)
             for name, shape in param_shapes(cfg, value_head).items()}
    return _assign(_build_meta(cfg, value_head), state)


# ---- loading ----------------------------------------------------------------------------------------
def _weight_files(root: Path) -> dict[str, Path]:
    """tensor name -> file holding it, from the index or the single weights file."""
    index = root / INDEX_NAME
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            if not isinstance(weight_map, dict):
                raise TypeError("weight_map is not an object")
        except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError) as e:
            raise UserError(f"{index}: malformed index ({e!r})") from None
        for fname in set(weight_map.values()):
            if not (root / fname).is_file():
                raise UserError(f"{index}: lists shard {fname!r}, which is missing from {root}")
        return {name: root / fname for name, fname in weight_map.items()}
    single = root / WEIGHTS_NAME
    if not single.is_file():
        extra = ""
        if any(root.glob("*.bin")) or any(root.glob("*.pt")) or any(root.glob("*.pth")):
            extra = " (pickle .bin/.pt weights are not loaded for safety; convert them to safetensors)"
        raise UserError(f"{root}: no {WEIGHTS_NAME} or {INDEX_NAME} in the checkpoint directory{extra}")
    try:
        with safe_open(single, framework="pt") as f:
            return {name: single for name in f.keys()}
    except Exception as e:  # safetensors raises its own error types for corrupt headers
        raise UserError(f"{single}: not a readable safetensors file ({e})") from None


def _read_tensors(files: dict[str, Path], wanted: set[str], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    by_file: dict[Path, list[str]] = {}
    for name in wanted:
        by_file.setdefault(files[name], []).append(name)
    out = {}
    for path, names in by_file.items():
        try:
            with safe_open(path, framework="pt") as f:
                for name in names:
                    out[name] = f.get_tensor(name).to(dtype)
        except UserError:
            raise
        except Exception as e:
            raise UserError(f"{path}: cannot read tensors ({e})") from None
    return out


def _check_shapes(files: dict[str, Path], expected: dict[str, tuple[int, ...]]) -> None:
    """Compare header shapes with the config, in model order, so the first culprit named is the
    earliest tensor (the embedding when the hidden size is wrong)."""
    handles = {}
    with ExitStack() as stack:
        for name, shape in expected.items():
            path = files.get(name)
            if path is None:
                continue
            try:
                if path not in handles:
                    handles[path] = stack.enter_context(safe_open(path, framework="pt"))
                found = tuple(handles[path].get_slice(name).get_shape())
            except Exception as e:
                raise UserError(f"{path}: not a readable safetensors file ({e})") from None
            if found != shape:
                raise UserError(f"{path}: tensor {name!r} has shape {list(found)}, but "
                                f"config.json implies {list(shape)}")


def load_pretrained(path: str | os.PathLike, dtype: torch.dtype = torch.float32, value_head: bool = False,
                    device: str | torch.device = "cpu", seed: int = 0) -> CausalLM | ValueModel:
    """Load an HF checkpoint directory as CausalLM, or as ValueModel with ``value_head=True``.

    A value model may come from a causal-LM checkpoint: its ``lm_head`` is dropped and ``score``
    [1, hidden] is drawn from N(0, 0.02) with a generator seeded by ``seed``."""
    cfg, _ = read_config(path)
    root = Path(path)
    files = _weight_files(root)
    expected = param_shapes(cfg, value_head)
    on_disk = {n for n in files if not n.endswith(_IGNORED_SUFFIXES)}
    # Tolerated extras: a tied checkpoint that still stores lm_head (some HF exports do), and the
    # LM head of a causal-LM checkpoint loaded as a value model.
    tolerated = {"lm_head.weight"} if (cfg.tie_word_embeddings or value_head) else set()
    init_score = value_head and "score.weight" not in on_disk
    if not value_head and "score.weight" in on_disk and "lm_head.weight" not in on_disk:
        raise UserError(f"{root}: holds a value model (tensor 'score.weight', no 'lm_head.weight'); "
                        "load it with value_head=True")
    missing = [n for n in expected if n not in on_disk and not (init_score and n == "score.weight")]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise UserError(f"{root}: checkpoint lacks tensor {missing[0]!r}{more}")
    unexpected = sorted(on_disk - set(expected) - tolerated)
    if unexpected:
        more = f" (and {len(unexpected) - 1} more)" if len(unexpected) > 1 else ""
        raise UserError(f"{files[unexpected[0]]}: unexpected tensor {unexpected[0]!r}{more} for a "
                        f"{cfg.model_type} model with this config.json")
    _check_shapes(files, expected)
    state = _read_tensors(files, set(expected) & on_disk, dtype)
    if init_score:
        gen = torch.Generator().manual_seed(seed)
        state["score.weight"] = init_tensor("score.weight", expected["score.weight"], gen).to(dtype)
    state = {k: v.to(device) for k, v in state.items()}
    return _assign(_build_meta(cfg, value_head), state)
