"""A GPU profile (``meshrl profile --gpu``) is read by the planner: measured matmul FLOP/s and HBM
bandwidth replace the preset's datasheet figures; a profile of another device is ignored."""

import json

import pytest

from meshrl.errors import UserError
from meshrl.plan.hardware import PRESETS
from meshrl.plan.hardware_profile import get_hardware


def test_planner_reads_a_gpu_profile(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"device": "h200", "matmul_bf16": {"896": 3e14, "4096": 7e14}, "hbm_bw": 4.1e12}))
    hw = get_hardware("h200", 8, str(path))
    assert (hw.peak_flops, hw.hbm_bw, hw.mfu) == (7e14, 4.1e12, 1.0)
    assert hw.mem_bytes == PRESETS["h200"].mem_bytes and "measured" in hw.sources["peak_flops"]
    assert get_hardware("a100-80g", 8, str(path)) == PRESETS["a100-80g"]  # another device's profile
    path.write_text(json.dumps({"device": "h200", "matmul_bf16": {"4096": "fast"}, "hbm_bw": 1}))
    with pytest.raises(UserError, match="malformed"):
        get_hardware("h200", 8, str(path))
