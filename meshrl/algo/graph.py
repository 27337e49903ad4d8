"""``Call`` and ``Graph``: one RLHF iteration as a DAG of model function calls (pure data).

A call declares its role, its kind and the batch keys it reads and writes; edges are derived from
the keys, and keys that no call produces come from the dataset. The planner places each call on
its own devices; the runtime runs them. Nothing here touches torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..errors import UserError

KINDS = ("generate", "inference", "train")
ROLES = ("actor", "critic", "ref", "reward")


@dataclass(frozen=True)
class Call:
    """A model function call. ``name`` is unique in its graph (e.g. 'actor_gen', 'critic_train')."""

    name: str
    role: str
    kind: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    # Tokens per sequence the call processes, as multiples of the config's sizes; the estimator
    # reads them. e.g. generation: prompt_len prefill + gen_len decode steps.
    n_samples: int = 1  # sequences per prompt this call sees (GRPO: n; ReMax greedy baseline: 1)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise UserError(f"call {self.name}: kind {self.kind!r} is not one of {KINDS}")
        if self.role not in ROLES:
            raise UserError(f"call {self.name}: role {self.role!r} is not one of {ROLES}")


@dataclass
class Graph:
    """The calls of one iteration, in a valid topological order."""

    calls: list[Call]
    producers: dict[str, str] = field(init=False)  # key -> name of the call that writes it

    def __post_init__(self) -> None:
        names = [c.name for c in self.calls]
        if len(set(names)) != len(names):
            raise UserError(f"duplicate call names in graph: {names}")
        self.producers = {}
        for c in self.calls:
            for k in c.outputs:
                if k in self.producers:
                    raise UserError(f"key {k!r} is produced by both {self.producers[k]} and {c.name}")
                self.producers[k] = c.name
        self.calls = self._toposort()

    def call(self, name: str) -> Call:
        for c in self.calls:
            if c.name == name:
                return c
        raise UserError(f"no call named {name!r}; calls are {[c.name for c in self.calls]}")

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.calls]

    @property
    def dataset_keys(self) -> set[str]:
        """Keys read by some call and produced by none: they come from the dataset."""
        return {k for c in self.calls for k in c.inputs if k not in self.producers}

    def parents(self, name: str) -> list[str]:
        """Calls whose outputs ``name`` reads, in graph order, without repeats."""
        c = self.call(name)
        out: list[str] = []
        for k in c.inputs:
            p = self.producers.get(k)
            if p is not None and p not in out:
                out.append(p)
        return out

    def edges(self) -> list[tuple[str, str, str]]:
        """(producer, consumer, key) for every key passed between calls."""
        return [(self.producers[k], c.name, k) for c in self.calls for k in c.inputs if k in self.producers]

    def roles(self) -> list[str]:
        seen: list[str] = []
        for c in self.calls:
            if c.role not in seen:
                seen.append(c.role)
        return seen

    def _toposort(self) -> list[Call]:
        by_name = {c.name: c for c in self.calls}
        done: list[Call] = []
        state: dict[str, int] = {}

        def visit(n: str, path: tuple[str, ...]) -> None:
            if state.get(n) == 2:
                return
            if state.get(n) == 1:
                raise UserError(f"call graph has a cycle: {' -> '.join(path + (n,))}")
            state[n] = 1
            for k in by_name[n].inputs:
                p = self.producers.get(k)
                if p is not None and p != n:
                    visit(p, path + (n,))
            state[n] = 2
            done.append(by_name[n])

        for c in self.calls:  # keep the declared order where dependencies allow
            visit(c.name, ())
        return done


def ppo_graph() -> Graph:
    """PPO (InstructGPT / ReaL): six calls. Training calls write the updated weights only."""
    return Graph([
        Call("actor_gen", "actor", "generate", ("prompts",), ("seqs", "logp_old")),
        Call("reward_inf", "reward", "inference", ("seqs", "answers"), ("scores",)),
        Call("ref_inf", "ref", "inference", ("seqs",), ("logp_ref",)),
        Call("critic_inf", "critic", "inference", ("seqs",), ("values",)),
        Call("actor_train", "actor", "train", ("seqs", "logp_old", "logp_ref", "scores", "values"),
             ("actor_stats",)),
        Call("critic_train", "critic", "train", ("seqs", "logp_old", "logp_ref", "scores", "values"),
             ("critic_stats",)),
    ])


def grpo_graph(n_samples: int) -> Graph:
    """GRPO: no critic; n samples per prompt, group-normalised rewards, KL loss to the reference.
    RLOO has the same calls (only the advantage differs): see ``rloo_graph``."""
    return Graph([
        Call("actor_gen", "actor", "generate", ("prompts",), ("seqs", "logp_old"), n_samples),
        Call("reward_inf", "reward", "inference", ("seqs", "answers"), ("scores",), n_samples),
        Call("ref_inf", "ref", "inference", ("seqs",), ("logp_ref",), n_samples),
        Call("actor_train", "actor", "train", ("seqs", "logp_old", "logp_ref", "scores"),
             ("actor_stats",), n_samples),
    ])


def rloo_graph(n_samples: int) -> Graph:
    """RLOO: GRPO's calls; each sample's baseline is the mean reward of its prompt's other samples."""
    return grpo_graph(n_samples)


def remax_graph() -> Graph:
    """ReMax: no critic; a second, greedy generation whose reward is the baseline."""
    return Graph([
        Call("actor_gen", "actor", "generate", ("prompts",), ("seqs", "logp_old")),
        Call("actor_gen_greedy", "actor", "generate", ("prompts",), ("seqs_greedy",)),
        Call("reward_inf", "reward", "inference", ("seqs", "answers"), ("scores",)),
        Call("reward_inf_greedy", "reward", "inference", ("seqs_greedy", "answers"), ("scores_greedy",)),
        Call("ref_inf", "ref", "inference", ("seqs",), ("logp_ref",)),
        Call("actor_train", "actor", "train", ("seqs", "logp_old", "logp_ref", "scores", "scores_greedy"),
             ("actor_stats",)),
    ])


def sft_graph() -> Graph:
    """Supervised fine-tuning: one train call on (prompt, response) sequences from the dataset."""
    return Graph([Call("actor_train", "actor", "train", ("sft_seqs",), ("actor_stats",))])


def rm_graph() -> Graph:
    """Bradley-Terry reward-model training on preference pairs from the dataset."""
    return Graph([Call("reward_train", "reward", "train", ("pairs",), ("reward_stats",))])


def dpo_graph() -> Graph:
    """DPO: the frozen reference scores both sides of each pair once, then the actor trains."""
    return Graph([
        Call("ref_inf", "ref", "inference", ("pairs",), ("ref_pair_logps",)),
        Call("actor_train", "actor", "train", ("pairs", "ref_pair_logps"), ("actor_stats",)),
    ])


def with_env(graph: Graph) -> Graph:
    """A multi-turn run's graph (env.fn): generation also reads each row's record (``answers``:
    row_id) to make its environment and writes the environment's outputs (``env``), which the
    reward call turns into scores and the actor's train call reports."""
    extra_in = {"actor_gen": ("answers",), "reward_inf": ("env",), "actor_train": ("env",)}
    extra_out = {"actor_gen": ("env",)}
    return Graph([replace(c, inputs=c.inputs + extra_in.get(c.name, ()), outputs=c.outputs + extra_out.get(c.name, ()))
                  for c in graph.calls])


def graph_of(cfg) -> Graph:
    """The call graph of a run config: its algorithm's, multi-turn under env.fn."""
    g = graph_for(cfg.algo, cfg.data.samples_per_prompt)
    return with_env(g) if getattr(getattr(cfg, "env", None), "fn", None) else g


def graph_for(algo: str, n_samples: int = 1) -> Graph:
    """The call graph of one iteration of ``algo`` (ppo|grpo|remax|rloo|dpo|sft|rm)."""
    graphs = {"ppo": ppo_graph, "grpo": lambda: grpo_graph(n_samples), "rloo": lambda: rloo_graph(n_samples),
              "remax": remax_graph, "sft": sft_graph, "rm": rm_graph, "dpo": dpo_graph}
    if algo not in graphs:
        raise UserError(f"algo={algo!r} is not one of {', '.join(graphs)}")
    return graphs[algo]()
