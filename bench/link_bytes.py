"""Time meshrl.layout.realloc_plan.link_bytes (what the planner calls) for llama2-70b on 128 ranks.

    python bench/link_bytes.py

Prints, per (source, destination) placement pair, the first (cold) call and a cached call, the
number of links and the bytes that cross them (bf16)."""

import time

from meshrl.model.presets import get_preset
from meshrl.layout.mesh import Placement
from meshrl.layout.realloc_plan import link_bytes

PAIRS = [("dp16tp8pp1@0-127", "dp1tp8pp16@0-127"), ("dp2tp8pp8@0-127", "dp4tp4pp8@0-127"),
         ("dp8tp8pp2@0-127", "dp16tp8pp1@0-127"), ("dp4tp8pp2@0-63", "dp8tp8pp1@64-127"),
         ("dp1tp8pp16@0-127", "dp128tp1pp1@0-127")]


def main() -> None:
    cfg = get_preset("llama2-70b")
    for a, b in PAIRS:
        src, dst = Placement.parse(a), Placement.parse(b)
        t0 = time.perf_counter()
        lb = link_bytes(cfg, src, dst)
        t1 = time.perf_counter()
        link_bytes(cfg, src, dst)
        t2 = time.perf_counter()
        print(f"{a:>18} -> {b:<19} cold {(t1 - t0) * 1e3:6.0f} ms  cached {(t2 - t1) * 1e3:6.2f} ms  "
              f"links {len(lb):6d}  {sum(lb.values()) / 1e9:8.1f} GB")


if __name__ == "__main__":
    main()
