"""Slice loaders (meshrl/parallel/load.py) against the whole-model builders they replace: every
shard of every role equals the same slice of what ``setup.build_roles`` builds whole, for presets
and for checkpoints on disk (independent path: build_model / load_pretrained)."""

import pytest
import torch

from meshrl.algo import setup
from meshrl.config import load_config
from meshrl.layout.mesh import Placement
from meshrl.layout.shardmap import shard_map
from meshrl.model.checkpoint import build_model, load_pretrained
from meshrl.parallel.load import InitLoader, SafetensorsLoader
from meshrl.model.presets import get_preset
from meshrl.plan.problem import problem_from_config
from meshrl.runtime.roles import initial_states

PL = Placement.parse("dp1tp2pp2@0-3")  # 2-way tensor slices and stage splits


def _check_all_shards(loader, model: torch.nn.Module, value_head: bool) -> int:
    """Every slice every rank of PL would load equals the whole model's; returns the count."""
    full, sm, n = model.state_dict(), shard_map(model.config, PL, value_head), 0
    for rank in PL.mesh.ranks:
        for name, sl in sm.params_of(rank).items():
            want = full[name][tuple(slice(a, b) for a, b in sl)]
            got = loader(name, sl)
            assert got.dtype == want.dtype and torch.equal(got, want), (rank, name)
            n += 1
    return n


def test_init_loader_equals_build_model_without_building_it():
    model = build_model("tiny", seed=7)
    loader = InitLoader("tiny", 7)
    assert _check_all_shards(loader, model, False) > 20
    v = build_model("tiny", seed=9, value_head=True)
    _check_all_shards(InitLoader("tiny", 9, value_head=True), v, True)
    bf = InitLoader("tiny", 7, dtype=torch.bfloat16)("lm_head.weight", ((0, 4), (0, 128)))
    assert torch.equal(bf, model.lm_head.weight[:4].to(torch.bfloat16))


def test_safetensors_loader_reads_slices_like_load_pretrained(tmp_path):
    build_model("tiny", seed=1).save_pretrained(tmp_path / "lm")
    _check_all_shards(SafetensorsLoader(tmp_path / "lm"), load_pretrained(tmp_path / "lm"), False)
    v = load_pretrained(tmp_path / "lm", value_head=True, seed=4)  # fresh score from a causal LM
    _check_all_shards(SafetensorsLoader(tmp_path / "lm", value_head=True, seed=4), v, True)


@pytest.mark.parametrize("algo", ["ppo", "rm"])
@pytest.mark.parametrize("paths", [False, True, "presets"])
def test_initial_states_equal_the_whole_models_of_setup(algo, paths, tmp_path):
    over = [f"algo={algo}", "sft.warmup=false", "train.seed=3"]
    if paths == "presets":  # roles with presets of their own (seeded inits, not the actor's backbone)
        over += ["models.critic=tiny-llama3", "models.ref=tiny-qwen3", "models.reward=tiny-llama3"]
    elif paths:
        build_model("tiny", seed=11).save_pretrained(tmp_path / "a")
        build_model("tiny", seed=12, value_head=True).save_pretrained(tmp_path / "r")
        over += [f"models.actor.path={tmp_path / 'a'}", f"models.ref.path={tmp_path / 'a'}",
                 f"models.critic.path={tmp_path / 'a'}"] + ([f"models.reward.path={tmp_path / 'r'}"]
                                                            if algo == "rm" else [])
    cfg = load_config(None, over)
    whole = setup.build_roles(cfg, setup.load_policy(cfg, cfg.train.seed))
    states = initial_states(cfg)
    assert set(states) == set(whole)
    for role, r in whole.items():
        mcfg, loader = states[role]
        if r.model is None:
            assert loader is None
            continue
        _check_all_shards(loader, r.model, role in ("critic", "reward"))


def test_every_shard_is_a_tensor_of_its_own(tmp_path):
    """The roles of a run from one checkpoint (actor, ref and the critic's backbone all read the same
    file) must not share storage: an open safetensors file hands out views of one memory map, and
    a whole-tensor slice (tp = 1) was that view itself, so the actor's optimizer moved the ref and
    the critic's moved the actor (PPO from a checkpoint stopped learning; docs/runtime.md)."""
    build_model("tiny", seed=1).save_pretrained(tmp_path / "a")
    cfg = load_config(None, ["algo=ppo", f"models.actor.path={tmp_path / 'a'}"])
    states = initial_states(cfg)
    full = PL.__class__.parse("dp1tp1pp1@0")  # one rank: every slice is the whole tensor
    seen: dict[int, tuple[str, str]] = {}
    alive = []  # every shard kept, so no address is reused
    for role in ("actor", "ref", "critic"):
        mcfg, loader = states[role]
        for name, sl in shard_map(mcfg, full, role == "critic").params_of(0).items():
            for _ in range(2):  # asked twice (a copy rebuilt), two tensors
                alive.append(loader(name, sl))
                ptr = alive[-1].untyped_storage().data_ptr()
                assert ptr not in seen, f"{role} {name} shares storage with {seen[ptr]}"
                seen[ptr] = (role, name)


@pytest.mark.parametrize("over, want", [
    ([], {"critic": "tiny-qwen3", "ref": "tiny-qwen3"}),  # unset: the actor's
    (["models.critic=tiny", "models.ref=tiny-qwen3"], {"critic": "tiny", "ref": "tiny-qwen3"}),
    (["models.critic.preset=tiny-llama3", "models.ref=tiny"], {"critic": "tiny-llama3", "ref": "tiny"}),
])
def test_the_runtime_builds_each_role_at_the_model_the_planner_prices(over, want):
    """A role with a preset other than the actor's is that preset, in the planner's problem and in
    the runtime's initial states alike; a role with none is the actor's model in both."""
    cfg = load_config(None, ["algo=ppo", "sft.warmup=false", "cluster.device=h100-80g", "models.actor=tiny-qwen3",
                            *over])
    states, priced = initial_states(cfg), problem_from_config(cfg).models
    for role in ("actor", "critic", "ref"):
        preset = want.get(role, "tiny-qwen3")
        assert states[role][0] == priced[role] == get_preset(preset), role
    critic = states["critic"][1]  # the critic starts at values 0 whatever its backbone
    assert not critic("score.weight", ((0, 1), (0, get_preset(want["critic"]).hidden_size))).any()


def test_init_loader_under_a_fake_mode_draws_nothing_and_gives_the_slice(monkeypatch):
    """A fake draw has no values and leaves the generator as it was, so under a fake mode the loader
    draws nothing: it returns a new tensor of the slice's shape in its dtype; a real loader still
    equals build_model."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    import meshrl.parallel.load as load_mod

    drawn, real = [], load_mod.init_tensor
    monkeypatch.setattr(load_mod, "init_tensor", lambda name, shape, gen: drawn.append(name) or real(name, shape, gen))
    loader = InitLoader("tiny", 7, dtype=torch.bfloat16)
    last = loader.order[-1]
    whole = tuple((0, n) for n in loader.shapes[last])
    rows = ((1, 3),)  # the first dimension sliced, the others whole
    with FakeTensorMode():
        t, part = loader(last, whole), loader(last, rows)
    assert isinstance(t, FakeTensor) and tuple(t.shape) == tuple(loader.shapes[last]) and t.dtype == torch.bfloat16
    assert tuple(part.shape) == (2, *loader.shapes[last][1:])
    assert drawn == []
    monkeypatch.undo()
    assert torch.equal(InitLoader("tiny", 7)(last, whole), build_model("tiny", seed=7).state_dict()[last])
