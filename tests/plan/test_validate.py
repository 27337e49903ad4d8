"""`meshrl plan --validate`: the chosen plan runs on 2 real gloo ranks and every call gets a predicted
and a measured time; bad input stops before any rank starts."""

from __future__ import annotations

import json
import math
import re

import pytest

from meshrl.algo.graph import ppo_graph
from meshrl.cli import main


def _fit(latency: float, slope: float) -> dict[str, float]:
    return {"latency_s": latency, "sec_per_unit": slope}


# A CPU profile in the format `meshrl profile` writes, with figures of the order it measured for the
# tiny width on this machine (docs/planner.md). The test checks the validation's mechanics, not the
# figures, so it does not pay for a profiling run.
PROFILE = {
    "matmul": {"128": 5e10}, "mem_bw": 5e9, "mem_bytes": 24 * 2**30, "dtype_bytes": 4,
    "layers": {"128": {"layer_params": 139520, "head_params": 33792,
                       "fwd": _fit(3e-3, 2.7e-6), "fwd_bwd": _fit(1.4e-3, 3.8e-5), "decode": _fit(9e-5, 1e-9),
                       "fixed_fwd": _fit(6e-4, 2.4e-5), "fixed_fwd_bwd": _fit(9e-3, 3.7e-5),
                       "fixed_decode": _fit(5e-3, 5e-5)}},
    "collectives": {k: {"2": {"latency_s": 1e-3, "sec_per_byte": 2e-9}} for k in ("all_reduce", "all_gather", "p2p")},
}
SMALL = ["cluster.device=cpu", "cluster.devices_per_node=2", "data.batch_size=8", "data.gen_len=4",
         "data.prompt_len=8"]


@pytest.fixture
def profile(tmp_path) -> str:
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(PROFILE))
    return str(path)


@pytest.mark.timeout(240)
def test_validate_prints_predicted_and_measured_time_of_every_call(capsys, profile):
    code = main(["plan", *SMALL, "--strategy", "colocated", "--profile", profile, "--validate",
                 "--validate-iterations", "2"])
    out = capsys.readouterr().out
    assert code == 0, out
    table = out.split("validating:", 1)[1]
    rows = {}
    for line in table.splitlines():
        m = re.match(r"^(\S+)\s+(call|realloc|transfer|iteration)\s+([\d.]+)\s+([\d.]+)\s+(\S.*)$", line)
        if m:
            rows[m.group(1)] = (m.group(2), float(m.group(3)), float(m.group(4)), m.group(5).strip())
    for call in ppo_graph().names:
        assert call in rows, f"{call} missing from the validation table:\n{table}"
        kind, pred, meas, err = rows[call]
        assert kind == "call" and math.isfinite(pred) and pred > 0 and math.isfinite(meas) and meas > 0
        if call != "reward_inf":  # the demo's reward is a rule: no model, no error quoted
            assert re.fullmatch(r"[+-]\d+%", err), err
    assert "n/a (no model)" in rows["reward_inf"][3]
    assert rows["iteration"][2] > max(rows[c][2] for c in ppo_graph().names)  # the iteration holds its calls
    assert re.search(r"median \|error\| \d+%, worst \d+% over 6 calls and the iteration", table)


def test_validate_refuses_more_ranks_than_allowed(capsys, profile):
    assert main(["plan", *SMALL, "--profile", profile, "--validate", "--max-ranks", "1"]) == 2
    err = capsys.readouterr().err
    assert "needs 2 ranks" in err and "--max-ranks" in err


def test_validate_needs_a_profile_and_a_cpu_cluster(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("MESHRL_PROFILE", str(tmp_path / "none.json"))
    assert main(["plan", *SMALL, "--validate"]) == 2
    assert "run `meshrl profile`" in capsys.readouterr().err
    assert main(["plan", "cluster.device=h100-80g", "--validate"]) == 2
    assert "needs cluster.device=cpu" in capsys.readouterr().err
