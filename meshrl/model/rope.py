"""Rotary position embeddings with the scaling types transformers defines (modeling_rope_utils.py):
``default``, ``linear``, ``dynamic`` (NTK), ``yarn`` and ``llama3``. Each formula follows
transformers' ``_compute_*_parameters`` step by step, in float32 as there, so cos/sin are the same
numbers. YaRN's attention factor multiplies cos and sin, as transformers' rotary modules do.

``dynamic`` differs in one documented way: transformers keeps one frequency set per module, grown
from the batch's longest position (and kept across calls); here each row gets the frequencies of its
own longest position in the call, so a row's numbers never depend on which rows share its batch
(plans change speed, never results). For a batch whose rows are equally long, and for one row, the
two agree; within one call of transformers they agree whenever the rows share their length.
"""

from __future__ import annotations

import math

import torch

from .config import ModelConfig


def _base_inv_freq(base: float | torch.Tensor, dim: int, device: torch.device) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64, device=device).float() / dim))


def _yarn(cfg: ModelConfig, dim: int, device: torch.device) -> tuple[torch.Tensor, float]:
    rs, base = cfg.rope_scaling, cfg.rope_theta
    orig = rs.original_max_position_embeddings or cfg.max_position_embeddings
    factor = rs.factor if rs.factor is not None else cfg.max_position_embeddings / orig

    def get_mscale(scale: float, mscale: float = 1) -> float:
        return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0

    attention_factor = rs.attention_factor
    if attention_factor is None:
        if rs.mscale and rs.mscale_all_dim:
            attention_factor = float(get_mscale(factor, rs.mscale) / get_mscale(factor, rs.mscale_all_dim))
        else:
            attention_factor = get_mscale(factor)
    beta_fast, beta_slow = rs.beta_fast or 32, rs.beta_slow or 1

    def correction_dim(num_rotations: float) -> float:
        return (dim * math.log(orig / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if rs.truncate is None or rs.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1).to(device)
    pos_freqs = base ** (torch.arange(0, dim, 2).to(device=device, dtype=torch.float) / dim)
    extrapolation = 1 - ramp
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv_freq, attention_factor


def _llama3(cfg: ModelConfig, dim: int, device: torch.device) -> torch.Tensor:
    rs = cfg.rope_scaling
    inv_freq = _base_inv_freq(cfg.rope_theta, dim, device)
    factor, low_f, high_f = rs.factor, rs.low_freq_factor, rs.high_freq_factor
    old_len = rs.original_max_position_embeddings or cfg.max_position_embeddings
    low_wavelen, high_wavelen = old_len / low_f, old_len / high_f
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low_f) / (high_f - low_f)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def _dynamic(cfg: ModelConfig, dim: int, seq_len: torch.Tensor) -> torch.Tensor:
    """seq_len [B] (int64: each row's longest position + 1) -> inv_freq [B, dim/2]."""
    mpe = cfg.max_position_embeddings
    seq_len = torch.maximum(seq_len, torch.tensor(mpe, dtype=seq_len.dtype, device=seq_len.device))
    factor = cfg.rope_scaling.factor
    base = cfg.rope_theta * ((factor * seq_len / mpe) - (factor - 1)) ** (dim / (dim - 2))  # [B]
    exps = torch.arange(0, dim, 2, dtype=torch.int64, device=seq_len.device).float() / dim
    return 1.0 / (base[:, None] ** exps)


def inv_freq_and_scale(cfg: ModelConfig, positions: torch.Tensor) -> tuple[torch.Tensor, float]:
    """positions [B, S] -> (inv_freq [dim/2] or, for ``dynamic``, [B, dim/2]; cos/sin factor)."""
    dim, rs, dev = cfg.head_dim, cfg.rope_scaling, positions.device
    if rs is None:
        return _base_inv_freq(cfg.rope_theta, dim, dev), 1.0
    if rs.rope_type == "linear":
        return _base_inv_freq(cfg.rope_theta, dim, dev) / rs.factor, 1.0
    if rs.rope_type == "llama3":
        return _llama3(cfg, dim, dev), 1.0
    if rs.rope_type == "yarn":
        return _yarn(cfg, dim, dev)
    return _dynamic(cfg, dim, positions.amax(-1) + 1), 1.0


def rope_cos_sin(positions: torch.Tensor, cfg: ModelConfig, dtype: torch.dtype
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [B, S] (int) -> cos, sin [B, S, head_dim], computed in float32 as HF does."""
    inv_freq, scale = inv_freq_and_scale(cfg, positions)
    if inv_freq.dim() == 1:
        inv_freq = inv_freq[None]
    freqs = positions.float()[..., None] * inv_freq[:, None, :]  # [B, S, head_dim/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    if scale != 1.0:
        cos, sin = cos * scale, sin * scale
    return cos.to(dtype), sin.to(dtype)
