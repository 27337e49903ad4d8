"""`meshrl plan` and `meshrl profile` from the command line: tables, --json, files, bad input."""

import json
import os
import re

import pytest

from meshrl.cli import main
from meshrl.plan.report import NAMES

BASE = ["cluster.device=h100-80g", "cluster.devices_per_node=8", "models.actor=llama2-7b",
        "models.critic=llama2-7b", "models.ref=llama2-7b", "models.reward=llama2-7b", "data.prompt_len=128",
        "data.gen_len=128", "data.batch_size=64"]


def test_plan_prints_call_table_comparison_and_explanation(capsys, tmp_path):
    trace, png, saved = tmp_path / "t.json", tmp_path / "g.png", tmp_path / "plan.json"
    assert main(["plan", *BASE, "--steps", "200", "--trace", str(trace), "--gantt", str(png),
                 "--save", str(saved)]) == 0
    out = capsys.readouterr().out
    for word in ("actor_gen", "critic_train", "layout", "colocated", "interleaved", "disaggregated",
                 "heuristic", "search", "PFLOP/s", "bottleneck"):
        assert word in out
    assert json.loads(trace.read_text())["traceEvents"]
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert set(json.loads(saved.read_text())["calls"]) == {"actor_gen", "reward_inf", "ref_inf", "critic_inf",
                                                          "actor_train", "critic_train"}


def test_plan_json_schema(capsys):
    assert main(["plan", *BASE, "--json", "--steps", "200"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data) == {"strategies", "search_s", "off_policy"} and data["search_s"] > 0
    assert set(data["strategies"]) == set(NAMES)
    # what each lag k would change: every feasible strategy's plan priced with train.off_policy=k
    assert data["off_policy"]["train.off_policy"] == 0
    by_k = data["off_policy"]["iteration_s_by_k"]
    assert set(by_k) == {"0", "1", "2", "4"}
    for k in ("1", "2", "4"):
        assert set(by_k[k]) == {n for n, e in data["strategies"].items() if e["feasible"]}
    # whole batches one step ahead never cost time (k >= 2 streams by default: its re-prefills may)
    assert all(by_k["1"][n] <= by_k["0"][n] * (1 + 1e-9) for n in by_k["1"])
    assert all(abs(by_k["0"][n] - data["strategies"][n]["iteration_s"]) < 1e-9 for n in by_k["0"])
    for entry in data["strategies"].values():
        assert set(entry) == {"iteration_s", "pflops", "peak_mem_gib", "feasible", "plan", "off_policy"}
        assert entry["off_policy"] == 0
        assert entry["iteration_s"] > 0 and entry["pflops"] > 0 and isinstance(entry["feasible"], bool)
        assert "calls" in entry["plan"]
    feasible = [e["iteration_s"] for n, e in data["strategies"].items() if e["feasible"] and n != "search"]
    assert data["strategies"]["search"]["iteration_s"] <= min(feasible) * (1 + 1e-9)


def test_plan_reports_what_each_lag_would_save(capsys):
    """The table run prices k = 0, 1, 2, 4 iterations of lag and names the config's own."""
    assert main(["plan", *BASE, "--strategy", "disaggregated"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("train.off_policy=k"))
    assert "k=0 (this run)" in line and "k=1 " in line and "k=2 " in line and "k=4 " in line and "x)" in line
    assert main(["plan", *BASE, "train.off_policy=2", "--strategy", "disaggregated"]) == 0
    out = capsys.readouterr().out
    assert "k=2 (this run)" in out and "2 iteration(s) ahead (train.off_policy=2)" in out


def test_one_strategy(capsys):
    assert main(["plan", *BASE, "--strategy", "heuristic", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert list(data["strategies"]) == ["heuristic"] and data["search_s"] == 0
    assert data["strategies"]["heuristic"]["plan"]["calls"]["actor_gen"]["layout"] == "dp1tp8pp1"


@pytest.mark.parametrize("args,message", [
    (["models.actor=llama2-70b", "cluster.devices_per_node=1"], "models.actor (68.98B parameters) fits nowhere"),
    (["cluster.nodes=0"], "cluster.nodes must be >= 1"),
    (["cluster.devices_per_node=16"], "at most 8 devices"),
    (["models.critic=llama3-9000b"], "unknown model preset 'llama3-9000b'"),
    (["cluster.device=tpu"], "unknown device 'tpu'"),
    (["--strategy", "fastest"], "unknown strategy 'fastest'"),
    (["--steps", "0"], "--steps must be >= 1"),
    (["--time-limit", "-1"], "--time-limit must be > 0"),
    (["clusters.nodes=2"], "unknown config key 'clusters'"),
])
def test_bad_input_gets_one_clear_message(capsys, args, message):
    assert main(["plan", "cluster.device=h100-80g", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("meshrl plan: error: ") and message in err and "Traceback" not in err


def test_cpu_without_profile_falls_back_as_train_does_and_says_so(capsys, tmp_path, monkeypatch):
    """Issue 18, item 6: bare `meshrl plan` is useful, with the same fallback as `train --nprocs`."""
    monkeypatch.setenv("MESHRL_PROFILE", str(tmp_path / "none.json"))
    assert main(["plan"]) == 0
    out = capsys.readouterr().out
    assert "no CPU profile" in out and "run `meshrl profile`" in out and "a100-80g" in out
    assert "to plan a cluster" in out and "plan: search" in out
    # the stand-in prices time; the devices are this CPU, each with its share of the machine's RAM
    from meshrl.host_memory import physical_bytes

    assert f"on 1 x 1 cpu with a100-80g costs ({physical_bytes() / 2**30:.0f} GiB each)" in out
    from meshrl.config import load_config
    from meshrl.plan.fallback import planning_config
    from meshrl.runtime.plans import resolve_plan

    _, note = resolve_plan(load_config(None, []), "colocated", 2)
    assert note == planning_config(load_config(None, []))[1] != ""  # one behaviour, one message
    # a profile named on the command line must exist; --validate measures, so it needs one too
    assert main(["plan", "--profile", str(tmp_path / "none.json")]) == 2
    assert "run `meshrl profile`" in capsys.readouterr().err
    assert main(["plan", "--validate", "--strategy", "colocated"]) == 2
    assert "run `meshrl profile`" in capsys.readouterr().err


@pytest.mark.timeout(300)
def test_profile_quick_writes_a_profile_the_planner_reads(capsys, tmp_path):
    path = tmp_path / "profile.json"
    assert main(["profile", "--quick", "--out", str(path)]) == 0
    data = json.loads(path.read_text())
    assert data["device"] == "cpu" and data["mem_bw"] > 0 and data["mem_bytes"] > 0
    assert all(f > 0 for f in data["matmul"].values())
    for kind in ("all_reduce", "all_gather", "p2p"):
        fit = data["collectives"][kind]["2"]
        assert fit["latency_s"] >= 0 and fit["sec_per_byte"] > 0
    assert data["cores"] == len(os.sched_getaffinity(0))
    assert data["threads_per_rank"] == 1  # the curve is for one-thread ranks; the speedup of more:
    speedup = data["thread_scaling"]["speedup"]
    assert set(speedup) == {str(h) for h in map(int, data["layers"])}
    counts = {t for curve in speedup.values() for t in curve}
    assert counts == ({str(data["cores"])} if data["cores"] > 1 else set())
    assert all(s > 0 for curve in speedup.values() for v in curve.values() for s in v.values())
    slow = data["contention"]["slowdown"]
    assert slow["1"] == 1.0 and slow["2"] > 0 and data["contention"]["seconds_per_step_alone"] > 0
    assert data["pipeline"]["hop_s"] >= 0 and set(data["pipeline"]["per_batch"]) == {"8", "32"}
    assert data["optimizer"]["step_s"] > 0 and data["optimizer"]["sec_per_tensor"] >= 0
    assert data["host_gap"]["calls"] == 6 and 0 < data["host_gap"]["call_host_s"] < 1.0
    out = capsys.readouterr().out
    assert "usable cores" in out and "pipeline hop" in out and "host time per call" in out
    assert main(["plan", "cluster.device=cpu", "cluster.devices_per_node=2", "--profile", str(path), "--json",
                 "--steps", "200"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["strategies"]["search"]["feasible"]


def test_the_planner_never_imports_torch():
    """Planning is pure Python: a laptop plans for 1,000 GPUs without torch or a process group."""
    import subprocess
    import sys

    code = ("import sys, meshrl.plan.report, meshrl.plan.search, meshrl.commands.plan, meshrl.commands.profile; "
            "sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0


def test_plan_prices_the_response_lengths_an_earlier_run_measured(capsys, tmp_path):
    """--lengths-from OUT/ reads response/length and response/length_max from OUT/metrics.jsonl:
    shorter responses than the budget make every plan faster; a missing file is named."""
    run = tmp_path / "run"
    run.mkdir()
    recs = [{"iteration": i, "response/length": 30.0 + i, "response/length_max": 60.0} for i in range(3)]
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    common = [*BASE, "--strategy", "colocated", "--json"]
    assert main(["plan", *common]) == 0
    full = json.loads(capsys.readouterr().out)["strategies"]["colocated"]["iteration_s"]
    assert main(["plan", *common, "--lengths-from", str(run)]) == 0
    short = json.loads(capsys.readouterr().out)["strategies"]["colocated"]["iteration_s"]
    assert short < 0.8 * full
    assert main(["plan", *BASE, "--strategy", "colocated", "--lengths-from", str(run)]) == 0
    assert "mean 31.0, longest of a batch 60.0" in capsys.readouterr().out
    assert main(["plan", *common, "--lengths-from", str(tmp_path / "nothing")]) != 0
    assert "metrics.jsonl does not exist" in capsys.readouterr().err


@pytest.mark.timeout(300)
def test_calibrate_refits_a_deliberately_bad_run_and_finds_a_better_plan(capsys, tmp_path):
    """A real 2-rank run of a bad plan (every call pipelined over both ranks, one micro-batch: the
    stages take turns), then --calibrate OUT/: every modelled call gets measured / predicted as its
    factor, the run's plan under the refitted costs lands near its measured iteration, and the
    re-plan is faster than the run's plan under the same refitted costs."""
    from meshrl.plan.calibrate import read_run, refit
    from meshrl.plan.execution_plan import ExecutionPlan
    from meshrl.plan.problem import problem_from_config
    from meshrl.config import load_config
    from meshrl.plan.validate import rule_calls

    from .test_validate import PROFILE

    prof = tmp_path / "profile.json"
    prof.write_text(json.dumps(PROFILE))
    calls = ["actor_gen", "reward_inf", "ref_inf", "critic_inf", "actor_train", "critic_train"]
    bad = {"cluster": {"nodes": 1, "devices_per_node": 2, "device": "cpu"}, "strategy": "bad-pp2",
           "calls": {n: {"mesh": "0-1", "layout": "dp1tp1pp2", "micro_batches": 1} for n in calls}}
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    out = tmp_path / "run"
    assert main(["train", "--nprocs", "2", "--plan", str(tmp_path / "bad.json"), "--out", str(out), "--no-progress",
                 "train.iterations=3", "data.batch_size=8", "data.gen_len=4", "data.prompt_len=8",
                 "sft.warmup=false"]) == 0
    capsys.readouterr()
    saved = tmp_path / "new.json"
    assert main(["plan", "--calibrate", str(out), "--profile", str(prof), "--steps", "300", "--save", str(saved)]) == 0
    text = capsys.readouterr().out
    for word in ("predicted (before the refit) against measured", "refitted cost per call", "re-planned (search)",
                 "against", "gain"):
        assert word in text
    gain = float(re.search(r"gain ([\d.]+)x", text).group(1))
    assert gain > 1.0
    new = ExecutionPlan.load(saved)
    ran = ExecutionPlan.load(out / "plan.json")
    assert set(new.calls) == set(calls) and new.to_dict()["calls"] != ran.to_dict()["calls"]
    # The factors are the run's own measured / predicted seconds.
    cfg_path, plan, records = read_run(out)
    cfg = load_config(str(cfg_path), ["cluster.device=cpu", "cluster.devices_per_node=2"])
    problem = problem_from_config(cfg, str(prof))
    fit = refit(problem, plan, records, rule_calls(cfg, plan))
    for r in fit.rows:
        if r.kind == "call" and r.modelled:
            assert fit.scales[r.name] == pytest.approx(r.measured / r.predicted)
            assert fit.problem.call_estimate(r.name, plan.calls[r.name]).time_s == pytest.approx(r.measured)
    assert main(["plan", "--calibrate", str(tmp_path / "nothing")]) != 0
    assert "config.yaml does not exist" in capsys.readouterr().err


@pytest.mark.parametrize("actor,critic", [("qwen3-30b-a3b", "qwen3-8b"), ("mixtral-8x7b", "llama3.1-8b")])
def test_moe_presets_plan_on_64_gpus(capsys, actor, critic):
    """A PPO iteration with a MoE actor/ref on 8 x 8 H100s: every strategy, the search included, finds a
    feasible plan; the estimator counts the active parameters for FLOPs and every expert for memory."""
    from meshrl.model.config import active_params, num_params
    from meshrl.model.presets import get_preset
    from meshrl.plan.model_costs import model_costs

    args = ["cluster.device=h100-80g", "cluster.devices_per_node=8", "cluster.nodes=8", f"models.actor={actor}",
            f"models.ref={actor}", f"models.critic={critic}", f"models.reward={critic}", "data.prompt_len=256",
            "data.gen_len=256", "data.batch_size=128"]
    assert main(["plan", *args, "--json", "--steps", "300"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert all(e["feasible"] for e in data["strategies"].values())
    cfg = get_preset(actor)
    mc = model_costs(cfg)
    assert mc.total_params == num_params(cfg)  # memory: all experts
    embed = cfg.vocab_size * cfg.hidden_size
    assert mc.matmul_flops_per_token() == pytest.approx(2 * (active_params(cfg) - embed), rel=1e-6)  # top-k only


def test_bare_plan_prices_the_demo_as_it_trains(capsys):
    """With no arguments the planner takes the demo's sizes (64 prompts for ppo, as `meshrl train` runs
    them), and a saving of nothing is said in words, not as '-0%'."""
    assert main(["plan"]) == 0
    out = capsys.readouterr().out
    assert "64 prompts x 1 samples" in out
    assert "-0%" not in out and "no lag would save time here" in out
