"""Helpers shared by the runtime tests."""

from __future__ import annotations

import random

from meshrl.algo.graph import graph_for
from meshrl.layout.mesh import Layout, Mesh
from meshrl.plan.execution_plan import CallPlan, Cluster, ExecutionPlan
from meshrl.runtime.plans import check_plan

WORLD = 4


def random_plan(cfg, seed: int) -> ExecutionPlan:
    """Each call on a random aligned block of 1, 2 or 4 ranks with a random layout of that size
    (tiny: 8 heads, 8 layers) and 1 or 2 micro-batches."""
    rng = random.Random(seed)
    graph = graph_for(cfg.algo, cfg.data.samples_per_prompt)
    calls = {}
    for c in graph.calls:
        size = rng.choice([1, 2, 4])
        start = rng.randrange(0, WORLD, size)
        shapes = [(dp, tp, size // (dp * tp)) for dp in (1, 2, 4) for tp in (1, 2, 4) if size % (dp * tp) == 0]
        dp, tp, pp = rng.choice(shapes)
        calls[c.name] = CallPlan(Mesh.range(start, size), Layout(dp, tp, pp), rng.choice([1, 2]))
    plan = ExecutionPlan(Cluster(1, WORLD), calls, f"random{seed}")
    check_plan(cfg, plan)
    return plan
