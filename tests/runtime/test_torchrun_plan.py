"""Under torchrun, rank 0 alone resolves the plan once the process group exists and broadcasts it.

The two torchrun ranks are made to disagree: on rank 1 the plan search is replaced by one that
returns another valid plan than the real search (the first strategy's plan that differs from it).
Had every rank resolved --plan
search itself (as before), the ranks would run different step orders and the job would hang or
fail; instead rank 1 never searches (its search raises if called), the job ends, and plan.json is
rank 0's search result."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys

ITEMS = ["algo=ppo", "data.batch_size=4", "data.gen_len=4", "sft.steps=2", "sft.batch_size=8",
         "train.iterations=2"]
WRAPPER = '''
import os, sys
if os.environ["RANK"] != "0":
    import meshrl.plan.search as s

    real_search = s.search

    def diverging(problem, *a, **k):
        from meshrl.plan.strategies import build
        real = real_search(problem, *a, **k).plan
        other = next(p for p in (build(problem, n) for n in ("colocated", "interleaved", "heuristic"))
                     if p.calls != real.calls)
        open(os.environ["DIVERGE_MARK"], "w").write(other.to_json())
        raise SystemExit("rank 1 searched: the plan was not rank 0's alone")

    s.search = diverging
from meshrl.cli import main
sys.exit(main(sys.argv[1:]))
'''


def test_every_rank_runs_rank_0s_plan(tmp_path):
    wrapper = tmp_path / "rank.py"
    wrapper.write_text(WRAPPER)
    port = str(29900 + random.Random(str(tmp_path)).randrange(90))
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
           "--master-addr", "127.0.0.1", "--master-port", port, str(wrapper), "train", *ITEMS,
           "--plan", "search", "--no-progress", "--out", str(out)]
    env = {**os.environ, "DIVERGE_MARK": str(tmp_path / "searched-on-rank-1")}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    try:
        text = proc.communicate(timeout=400)[0]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, text
    assert not (tmp_path / "searched-on-rank-1").exists(), "rank 1 resolved the plan itself"
    assert text.count("plan: search on 2 ranks") == 1, text  # printed once, by rank 0
    plan = json.loads((out / "plan.json").read_text())
    assert plan["strategy"] == "search"
    assert [r["iteration"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())] == [0, 1]
    # rank 1's search would have chosen another plan: the broadcast is what kept them equal
    from meshrl.config import load_config
    from meshrl.plan.strategies import build
    from meshrl.runtime.plans import _problem, run_cluster

    cfg = load_config(None, ITEMS)
    problem = _problem(cfg, run_cluster(cfg, 2))[0]
    assert any(build(problem, n).to_dict()["calls"] != plan["calls"] for n in ("colocated", "interleaved"))
