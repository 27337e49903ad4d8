"""Checkpoint save and load: the resharding format (meshrl/runtime/checkpoint.py) against the
per-rank ``torch.save`` of the same state that meshrl wrote before (it could only be read back
under the same plan and world size), side by side in one process (one gloo rank, in memory).

The state is every role of a PPO run after one iteration (actor, critic with AdamW moments,
reference; weights in ``train.dtype``). Medians of ``--repeats`` saves and loads each.

    python bench/checkpoint_io.py [--preset tiny|small] [--repeats 5] [key=value ...] [--json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist


def old_save(path: Path, roles) -> None:
    """What meshrl wrote before: the rank's home shards and optimizer state_dict, pickled."""
    state = {"rng": torch.get_rng_state(), "roles": {}}
    for name, rm in roles.items():
        pm = rm.models.get(rm.home)
        if pm is not None:
            state["roles"][name] = {"params": {k: v.clone() for k, v in pm.local_state().items()},
                                    "optim": pm.optimizer.state_dict() if pm.optimizer is not None else None}
    torch.save(state, path / "rank0.pt")


def old_load(path: Path, roles) -> None:
    state = torch.load(path / "rank0.pt", weights_only=False)
    for name, saved in state["roles"].items():
        pm = roles[name].models[roles[name].home]
        pm.load_local_state(saved["params"])
        if saved["optim"] is not None:
            pm.optimizer.load_state_dict(saved["optim"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()

    from meshrl.config import load_config
    from meshrl.runtime.checkpoint import load_checkpoint, save_checkpoint
    from meshrl.runtime.plans import resolve_plan
    from meshrl.runtime.run import build

    items = [f"models.actor.preset={args.preset}", "sft.warmup=false", "data.batch_size=4", "data.gen_len=4",
             "train.iterations=1"] + args.overrides
    cfg = load_config(None, items)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=600))
    plan, _ = resolve_plan(cfg, "colocated", 1)
    engine, _ = build(cfg, plan, None, 0, 600.0, lambda _: None, None)
    for _ in engine.iterate(0, 1):  # AdamW moments become non-zero
        pass
    params = sum(p.numel() for rm in engine.roles.values() for pm in rm.models.values() for p in pm.named.values())
    times: dict[str, list[float]] = {"new_save": [], "new_load": [], "old_save": [], "old_load": []}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeats):
            for kind in ("new", "old"):
                out = Path(tmp) / kind
                shutil.rmtree(out, ignore_errors=True)
                out.mkdir()
                t0 = time.perf_counter()
                if kind == "new":
                    save_checkpoint(out, 0, engine.roles, plan.to_json())
                else:
                    old_save(out, engine.roles)
                t1 = time.perf_counter()
                if kind == "new":
                    load_checkpoint(out / "ckpt-000000", engine.roles, plan.to_json())
                else:
                    old_load(out, engine.roles)
                times[f"{kind}_save"].append(t1 - t0)
                times[f"{kind}_load"].append(time.perf_counter() - t1)
        size = {k: sum(f.stat().st_size for f in (Path(tmp) / k).rglob("*") if f.is_file()) for k in ("new", "old")}
    dist.destroy_process_group()
    med = {k: statistics.median(v) for k, v in times.items()}
    res = {"preset": args.preset, "dtype": str(engine.roles["actor"].dtype), "params": params, **med,
           "save_ratio": med["new_save"] / med["old_save"], "load_ratio": med["new_load"] / med["old_load"],
           "new_bytes": size["new"], "old_bytes": size["old"]}
    if args.json:
        print(json.dumps(res))
        return
    print(f"PPO state, preset {args.preset} ({params / 1e6:.1f}M parameters over the roles' models, {res['dtype']}), "
          f"one rank, medians of {args.repeats}:")
    print(f"  save: resharding format {med['new_save']:.3f} s, per-rank torch.save {med['old_save']:.3f} s "
          f"(ratio {res['save_ratio']:.2f})")
    print(f"  load: resharding format {med['new_load']:.3f} s, per-rank torch.load {med['old_load']:.3f} s "
          f"(ratio {res['load_ratio']:.2f})")
    print(f"  bytes on disk: {size['new'] / 2**20:.1f} MiB against {size['old'] / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
