"""`meshrl bench realloc`: the DESIGN.md JSON contract on real local ranks, and bad input refused
with one message before any rank starts."""

import json
import subprocess
import sys

import pytest

from meshrl.cli import main


def test_bench_realloc_json_contract():
    cmd = [sys.executable, "-m", "meshrl.cli", "bench", "realloc", "--model", "tiny",
           "--from", "dp1tp2pp1@0-1", "--to", "dp2tp1pp1@2-3", "--json", "--repeat", "1", "--p2p-mb", "1",
           "--timeout", "300"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    kinds = {"exact": bool, "bytes": int, "seconds": float, "gbps": float, "p2p_gbps": float}
    for key, kind in kinds.items():
        assert isinstance(out[key], kind), key
    assert out["exact"] and out["bytes"] == out["sent_by_ranks"] > 0
    assert out["gbps"] > 0 and out["p2p_gbps"] > 0


@pytest.mark.parametrize("argv,msg", [
    (["--model", "tiny", "--from", "dp2tp1pp1@0-2", "--to", "dp1tp1pp1@3"], "has 2 ranks but mesh 0-2 has 3"),
    (["--model", "tiny", "--from", "dp1tp3pp1@0-2", "--to", "dp1tp1pp1@3"], "tp=3 does not divide"),
    (["--model", "nope", "--from", "dp1tp1pp1@0", "--to", "dp1tp1pp1@1"], "unknown model preset 'nope'"),
    (["--model", "tiny", "--from", "dp1@x", "--to", "dp1tp1pp1@1"], "cannot parse mesh 'x'"),
    (["--model", "/nonexistent/dir", "--from", "dp1tp1pp1@0", "--to", "dp1tp1pp1@1"], "unknown model preset"),
])
def test_bad_input_is_one_message_and_exit_2(capsys, argv, msg):
    assert main(["bench", "realloc", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("meshrl bench: error:") and msg in err, err
