"""The communication module's two planes on real gloo ranks, strict mode on (tests/conftest.py):
control data (float64 statistics, objects, counts) moves on gloo control groups and gives the
right numbers; a data-plane call with a tensor off the compute device, or a control call on a
data-plane group, raises CommError instead of reaching the backend (what NCCL would reject or hang
on, caught on a CPU)."""

import os

import pytest
import torch
import torch.distributed as dist

from meshrl.layout.mesh import Placement
from meshrl.parallel import comm
from meshrl.parallel.groups import GroupCache
from meshrl.runtime.launch import RankPool


def _planes() -> dict:
    rank = dist.get_rank()
    assert comm.strict() and os.environ["MESHRL_STRICT_COMM"] == "1"
    groups = GroupCache(timeout_s=30).for_placement(Placement.parse("dp2tp1pp1@0-1"))
    dp = groups.dp.group
    out: dict = {"sum": comm.reduce_floats([rank + 0.5, 1e-300 * (rank + 1)], dp)}
    out["bcast"] = comm.broadcast_floats([float(rank)], 1, dp)
    box = [None, None]
    comm.all_gather_object(box, {"r": rank}, comm.control(None))
    out["objects"] = box
    x = torch.full((3,), float(rank + 1))
    comm.all_reduce(x, dp)
    out["data"] = x.tolist()
    errors = []
    for what, fn in [
        ("meta tensor", lambda: comm.all_reduce(torch.zeros(2, device="meta"), dp)),
        ("object on data group", lambda: comm.all_gather_object([None, None], 1, dp)),
        ("object on world data group", lambda: comm.gather_object(1, None, 0, None)),
        ("stats on data group", lambda: comm.barrier(dp)),
    ]:
        try:
            fn()
            errors.append((what, "passed"))
        except comm.CommError as e:
            errors.append((what, str(e)[:40]))
    out["errors"] = errors
    comm.set_compute_device("meta")  # as if this rank computed on another device: CPU data is refused
    try:
        comm.isend(torch.zeros(1), 1 - rank, dp)
        out["wrong_device"] = "passed"
    except comm.CommError:
        out["wrong_device"] = "raised"
    finally:
        comm.set_compute_device(None)
    comm.barrier(comm.control(None))
    return out


@pytest.mark.timeout(120)
def test_control_and_data_planes_with_strict_checks():
    with RankPool(2, timeout=60) as pool:
        outs = pool.run(_planes)
    for rank, out in enumerate(outs):
        assert out["sum"] == [0.5 + 1.5, 3e-300]  # float64 survives (1e-300 underflows in float32)
        assert out["bcast"] == [1.0]
        assert out["objects"] == [{"r": 0}, {"r": 1}]
        assert out["data"] == [3.0, 3.0, 3.0]
        assert all(msg != "passed" for _, msg in out["errors"]), (rank, out["errors"])
        assert out["wrong_device"] == "raised"


def test_strict_mode_is_on_in_the_suite():
    assert comm.strict()
