"""Multi-turn rollouts: every trajectory of a generation call's part advances one turn at a time,
all of them through ONE ``h.generate`` call per turn (the finished ones drop out), inside the one
plan call ``actor_gen``; so a multi-turn run is placed, split and reallocated like any other.

A trajectory is token-exact. Its columns after the prompt hold, turn by turn, the tokens the
policy sampled (kept as sampled ids, never decoded and re-encoded) and the tokens of the
environment's observation, rendered through the chat template as the next turn of the
conversation (``ObsRenderer``); the next turn's prompt is exactly those ids. Masks:

    attention_mask [B, P+N]  1 on the prompt's, the policy's and the observations' tokens
    response_mask  [B, N]    1 on policy tokens only: log-probs, KL, values, advantages and every
                             loss are taken over these, so an observation never gets a gradient
    logp_old       [B, N]    the sampling log-probs of the policy tokens, 0 elsewhere

With per-row seeds, turn 0 samples from ``sample_seed`` and turn k from key_seed(sample_seed, k):
a row draws the same tokens in any batch, under any plan. Environment outputs (calls.py contract,
``env`` key): env_reward [B] (sum of the steps' rewards), env_counts [B, 6] (COUNTS), env_turn_len
[B, env.max_turns] (policy tokens of each turn, 0 for turns not taken).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from ..data.encode import encode_prompts, plain_ids
from .batch import Batch
from .common import CallContext, key_seed
from .env import EnvClass, ToolOutput, load_env, response_width
from .rollout import generation_config, stop_token_id
from .scoring import eval_records, train_records
from ..errors import UserError
from ..data.chat import load_chat_template

COUNTS = ("turns", "tool_calls", "tool_errors", "truncated", "observations", "obs_tokens")
_REPLY, _OBS = "MESHRL_REPLY_PROBE", "MESHRL_OBSERVATION_PROBE"


class ObsRenderer:
    """An observation -> the tokens that follow the policy's turn: with a chat template, the end of
    the assistant turn where the policy did not sample it, the observation as the next message
    (its role: env.obs_role, or the message's own) and the header of the next assistant turn, as
    the template writes them; without one, the observation's text as it is."""

    def __init__(self, cfg, tok) -> None:
        self.tok, self.role, self.template = tok, cfg.env.obs_role, None
        if cfg.data.chat_template:
            self.template = load_chat_template(cfg.models.actor.path)
        self._frames: dict[str, tuple[str, str, str]] = {}

    def frame(self, role: str) -> tuple[str, str, str]:
        """(end of the assistant turn, text before the observation, text after it) for ``role``."""
        if role not in self._frames:
            msgs = [{"role": "user", "content": "x"}, {"role": "assistant", "content": _REPLY},
                    {"role": role, "content": _OBS}]
            text = self.template.render_messages(msgs, add_generation_prompt=True).split(_REPLY, 1)[1]
            eot = self.template.end_of_turn() or ""
            close = eot if text.startswith(eot) else ""
            before, after = text[len(close):].split(_OBS, 1)
            self._frames[role] = (close, before, after)
        return self._frames[role]

    def ids(self, obs: str | dict, ended: bool) -> list[int]:
        """Token ids of ``obs`` after a policy turn that ``ended`` with its stop token (or was cut)."""
        text, role = (obs["content"], obs["role"]) if isinstance(obs, dict) else (str(obs), self.role)
        if self.template is None:
            return plain_ids(self.tok, text)
        close, before, after = self.frame(role)
        return plain_ids(self.tok, ("" if ended else close) + before + str(text) + after)


@dataclass
class Trajectory:
    """One conversation: its prompt ids, then the token ids after it with their masks, and its tallies."""

    prompt: list[int]
    ids: list[int] = field(default_factory=list)
    policy: list[int] = field(default_factory=list)  # 1 = sampled by the policy
    logp: list[float] = field(default_factory=list)
    reward: float = 0.0
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTS, 0))
    turn_len: list[int] = field(default_factory=list)
    done: bool = False

    def add(self, ids: list[int], policy: bool, logp: list[float] | None = None) -> None:
        self.ids += ids
        self.policy += [int(policy)] * len(ids)
        self.logp += logp if logp is not None else [0.0] * len(ids)

    def context(self) -> list[int]:
        return self.prompt + self.ids


def _records(ctx: CallContext) -> list[dict]:
    return eval_records(ctx.cfg) if ctx.algo == "eval" else train_records(ctx.cfg)


def start(env_cls: EnvClass, part: Batch, ctx: CallContext) -> tuple[list[object], list[Trajectory]]:
    """Each row's environment, made from its record and reset, and its trajectory's prompt: what
    reset() gave (encoded as the dataset is) or the row's prompt ids."""
    cfg, tok = ctx.cfg, ctx.tokenizer
    records, envs, trajs = _records(ctx), [], []
    template = ObsRenderer(cfg, tok).template
    for rid, ids, mask in zip(part["row_id"].tolist(), part["prompt_ids"], part["prompt_mask"], strict=True):
        where = f"dataset row {rid}"
        env = env_cls.make(dict(records[rid]), where)
        first = env_cls.reset(env, where)
        if first is None:
            prompt = ids[mask.bool()].tolist()
        else:
            rec = {"prompt": first} if isinstance(first, str) else {"messages": first}
            enc = encode_prompts(tok, [rec], cfg.data.prompt_len, 1, template)
            prompt = enc["prompt_ids"][0][enc["prompt_mask"][0].bool()].tolist()
        envs.append(env)
        trajs.append(Trajectory(prompt))
    return envs, trajs


def turn_seeds(part: Batch, rows: list[int], turn: int) -> list[int]:
    seeds = part["sample_seed"].tolist()
    return [seeds[i] if turn == 0 else key_seed(seeds[i], "turn", turn) for i in rows]


def rollout(h, part: Batch, ctx: CallContext, micro_batches: int, greedy: bool = False) -> list[Trajectory]:
    """Run the part's trajectories to the end: at most env.max_turns turns of one generate call over
    the trajectories still going, each turn's responses stepped through their environments."""
    cfg, tok = ctx.cfg, ctx.tokenizer
    env_cls, width, stop = load_env(cfg.env.fn), response_width(cfg), stop_token_id(cfg, tok)
    envs, trajs = start(env_cls, part, ctx)
    render = ObsRenderer(cfg, tok)
    base = generation_config(cfg, tok, greedy)
    for turn in range(cfg.env.max_turns):
        rows = [i for i, t in enumerate(trajs) if not t.done]
        if not rows:
            break
        budget = min(cfg.data.gen_len, max(width - len(trajs[i].ids) for i in rows))
        out = h.generate([trajs[i].context() for i in rows], replace(base, max_new_tokens=budget),
                         None if greedy else turn_seeds(part, rows, turn), min(micro_batches, len(rows)))
        for j, i in enumerate(rows):
            n = int(out.response_mask[j].sum())
            toks, lps = out.responses[j, :n].tolist(), out.response_logprobs[j, :n].tolist()
            advance(trajs[i], envs[i], env_cls, toks, lps, turn, ctx, render, stop, width,
                    f"dataset row {int(part['row_id'][i])}")
    return trajs


def advance(t: Trajectory, env: object, env_cls: EnvClass, toks: list[int], lps: list[float], turn: int,
            ctx: CallContext, render: ObsRenderer, stop: int | None, width: int, where: str) -> None:
    """One turn of one trajectory: keep the sampled tokens (cut at the trajectory's budget), step
    the environment on their text, append its observation's tokens or end."""
    cfg = ctx.cfg
    room = width - len(t.ids)
    cut = len(toks) > room
    toks, lps = toks[:room], lps[:room]
    t.add(toks, True, lps)
    t.turn_len.append(len(toks))
    t.counts["turns"] += 1
    ended = bool(toks) and toks[-1] == stop
    text = ctx.tokenizer.decode(toks[:-1] if ended else toks)
    obs, reward, done = env_cls.step(env, text, where)
    t.reward += reward
    if isinstance(obs, ToolOutput):
        t.counts["tool_calls"] += 1
        t.counts["tool_errors"] += int(not obs.ok)
    if done or obs is None:
        t.done = True
        return
    ids = render.ids(obs, ended)
    if cut or turn == cfg.env.max_turns - 1 or len(t.ids) + len(ids) >= width:
        t.counts["truncated"] += 1  # out of turns or tokens before the environment said done
        t.done = True
        return
    t.add(ids, False)
    t.counts["observations"] += 1
    t.counts["obs_tokens"] += len(ids)


def pack(trajs: list[Trajectory], part: Batch, cfg, pad: int) -> dict[str, torch.Tensor]:
    """Trajectories -> the RL batch layout (batch.py) plus the env outputs; the prompt region is
    the part's own unless reset() gave another prompt."""
    b, p, n = len(trajs), part["prompt_ids"].shape[1], response_width(cfg)
    ids = torch.full((b, p + n), pad, dtype=torch.long)
    attn = torch.zeros(b, p + n, dtype=torch.long)
    resp = torch.zeros(b, n, dtype=torch.long)
    logp = torch.zeros(b, n, dtype=torch.float64 if cfg.train.dtype == "float64" else torch.float32)
    turn_len = torch.zeros(b, cfg.env.max_turns, dtype=torch.long)
    for i, t in enumerate(trajs):
        if len(t.prompt) > p:
            raise UserError(f"env.fn's reset() gave a prompt of {len(t.prompt)} tokens, more than "
                            f"data.prompt_len={p}")
        k = len(t.ids)
        ids[i, p - len(t.prompt):p], attn[i, p - len(t.prompt):p] = torch.tensor(t.prompt), 1
        ids[i, p:p + k], attn[i, p:p + k] = torch.tensor(t.ids, dtype=torch.long), 1
        resp[i, :k] = torch.tensor(t.policy, dtype=torch.long)
        logp[i, :k] = torch.tensor(t.logp, dtype=logp.dtype)
        turn_len[i, :len(t.turn_len)] = torch.tensor(t.turn_len, dtype=torch.long)
    counts = torch.tensor([[t.counts[c] for c in COUNTS] for t in trajs], dtype=torch.long).view(b, len(COUNTS))
    return {"input_ids": ids, "attention_mask": attn, "response_mask": resp, "logp_old": logp * resp,
            "env_reward": torch.tensor([t.reward for t in trajs], dtype=torch.float32), "env_counts": counts,
            "env_turn_len": turn_len}


def multiturn_rows(h, part: Batch, ctx: CallContext, micro_batches: int, greedy: bool = False) -> Batch:
    """actor_gen of a multi-turn run: prompt_ids, prompt_mask [b, P], sample_seed, row_id [b] ->
    input_ids, attention_mask [b, P+N], response_mask, logp_old [b, N], env_reward [b],
    env_counts [b, 6], env_turn_len [b, env.max_turns] (N = env.max_tokens)."""
    trajs = rollout(h, part, ctx, micro_batches, greedy)
    return Batch(pack(trajs, part, ctx.cfg, ctx.tokenizer.pad_token_id), part.index)


def env_metrics(batch: Batch) -> dict[str, float]:
    """env/* figures of a generated batch: per trajectory, the mean turns, tool calls and tool
    errors, the share truncated (out of turns or tokens before done) and that used a tool; the mean
    tokens of an observation; the mean policy tokens of turn k over the trajectories that took it."""
    c = batch["env_counts"].float()
    col = {name: c[:, i] for i, name in enumerate(COUNTS)}
    out = {"env/turns_mean": float(col["turns"].mean()), "env/tool_calls": float(col["tool_calls"].mean()),
           "env/tool_errors": float(col["tool_errors"].mean()), "env/truncated": float(col["truncated"].mean()),
           "env/tool_use": float((col["tool_calls"] > 0).float().mean()),
           "env/obs_length": float(col["obs_tokens"].sum() / col["observations"].sum().clamp(min=1))}
    lens = batch["env_turn_len"].float()
    taken = (torch.arange(lens.shape[1])[None, :] < col["turns"][:, None]).float()
    for k in range(lens.shape[1]):
        if taken[:, k].sum() > 0:
            out[f"env/turn{k}_length"] = float((lens[:, k] * taken[:, k]).sum() / taken[:, k].sum())
    return out
