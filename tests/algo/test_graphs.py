"""Each algorithm is a graph of calls whose keys, edges and implementations line up."""

import pytest

from meshrl.algo.graph import graph_for
from meshrl.algo.registry import FIELDS
from meshrl.config import ALGOS
from meshrl.algo.dispatch import implementation


@pytest.mark.parametrize("algo", ALGOS)
def test_every_call_has_code_and_every_key_a_meaning(algo):
    g = graph_for(algo, 4)
    for call in g.calls:
        assert callable(implementation(call, algo))
        for k in call.inputs + call.outputs:
            assert k in FIELDS, f"{algo}: key {k!r} of {call.name} has no tensor meaning"


def test_dataset_keys_and_roles():
    assert graph_for("ppo").dataset_keys == {"prompts", "answers"}
    assert graph_for("ppo").roles() == ["actor", "reward", "ref", "critic"]
    assert "critic" not in graph_for("grpo", 4).roles()
    assert graph_for("grpo", 4).call("actor_gen").n_samples == 4
    assert graph_for("remax").parents("actor_train") == ["actor_gen", "ref_inf", "reward_inf", "reward_inf_greedy"]
    assert graph_for("dpo").names == ["ref_inf", "actor_train"]
    assert graph_for("sft").dataset_keys == {"sft_seqs"} and graph_for("rm").dataset_keys == {"pairs"}
