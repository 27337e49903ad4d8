"""Build what a run needs from the config: tokenizer, role models and optimizers, datasets.

Without paths this is the built-in demo: the ``tiny`` preset, the byte tokenizer, and the
synthetic task of meshrl/data/demo.py.
"""

from __future__ import annotations

import copy

import torch

from ..config import Config, own_model
from ..data import demo
from ..data.chat_records import chat_texts, plain_texts
from ..data.encode import encode_prompts, encode_sequences
from ..data.dataset_file import read_dataset
from ..errors import UserError
from ..model.checkpoint import build_model, load_pretrained
from ..model.tokenizer import ByteTokenizer, load_tokenizer
from .batch import Batch
from .common import Role, make_optimizer
from .scoring import train_records
from ..data.chat import load_chat_template

DEMO_SFT_RECORDS = 2000  # noisy demonstrations for the warm-up / algo=sft
DEMO_PAIRS = 2000  # training preference pairs (algo=rm, algo=dpo)
DEMO_HELDOUT_PAIRS = 400  # held-out pairs for the reward model's accuracy
# The reward model's fresh score head learns at RM_HEAD_LR_SCALE x the backbone's lr (optim.critic_lr)
# and starts random (std 0.02), not at 0: a zero head passes no gradient to the backbone, and with
# one learning rate for all the head lagged. Measured on the demo in docs/algorithms.md.
RM_HEAD_LR_SCALE = 10.0


def tokenizer_for(cfg: Config):
    """The actor checkpoint's tokenizer, else (a preset) the byte tokenizer."""
    return load_tokenizer(cfg.models.actor.path) if cfg.models.actor.path else ByteTokenizer()


def load_policy(cfg: Config, seed: int) -> torch.nn.Module:
    spec = cfg.models.actor
    return load_pretrained(spec.path) if spec.path else build_model(spec.preset or "tiny", seed=seed)


def value_model_like(actor: torch.nn.Module, cfg: Config, role: str, seed: int, zero_head: bool = True
                     ) -> torch.nn.Module:
    """A critic / reward model: its own model (config/models.py ``own_model``: a checkpoint, or a
    preset other than the actor's, drawn from ``seed``), else the actor's backbone + a fresh head
    (InstructGPT initialises the critic from the reward model or the policy). ``zero_head`` keeps
    build_model's random head (std 0.02) when False; a checkpoint's head is its own."""
    spec = getattr(cfg.models, role)
    if spec.path:
        return load_pretrained(spec.path, value_head=True, seed=seed)
    own = own_model(cfg.models, role)
    model = build_model(spec.preset if own else actor.config, seed=seed, value_head=True)
    model = model.to(next(actor.parameters()).dtype)
    if not own:
        model.model.load_state_dict(actor.model.state_dict())
    if zero_head:
        with torch.no_grad():
            model.score.weight.zero_()  # start every value at 0, so early advantages are the rewards
    return model


def reward_optimizer(rm: torch.nn.Module, cfg: Config) -> torch.optim.Optimizer:
    """AdamW for reward-model training: backbone at optim.critic_lr, score head RM_HEAD_LR_SCALE x that."""
    (lr, scales) = role_lr(cfg, "reward")
    (prefix, scale), = scales
    head = [p for n, p in rm.named_parameters() if n.startswith(prefix)]
    body = [p for n, p in rm.named_parameters() if not n.startswith(prefix)]
    return torch.optim.AdamW([{"params": body, "lr": lr}, {"params": head, "lr": lr * scale}],
                             betas=(0.9, 0.95), weight_decay=cfg.optim.weight_decay, eps=1e-8)


def role_lr(cfg: Config, role: str) -> tuple[float, tuple[tuple[str, float], ...]]:
    """A trained role's learning rate and its (parameter-name prefix, lr multiplier) pairs: the
    actor at sft.lr (algo=sft) or optim.lr, the critic and the reward model at optim.critic_lr, the
    reward model's score head at RM_HEAD_LR_SCALE x that. One source for both trainers."""
    if role in ("critic", "reward"):
        return cfg.optim.critic_lr, ((("score.", RM_HEAD_LR_SCALE),) if role == "reward" else ())
    return (cfg.sft.lr if cfg.algo == "sft" else cfg.optim.lr), ()


def warmup_plan(cfg: Config) -> tuple[str | None, str]:
    """What the SFT warm-up before RL / rm / dpo trains on: "demo", the user's ``sft.path``, or None
    (no warm-up); and a note for the console ("" when there is nothing to say)."""
    if cfg.algo == "sft" or not cfg.sft.warmup:
        return None, ""
    if cfg.sft.path:  # the user's demonstrations: on a preset actor or on their own checkpoint
        return cfg.sft.path, ""
    if cfg.models.actor.path:
        return None, (f"SFT warm-up skipped: the actor is your checkpoint {cfg.models.actor.path}; "
                      "sft.path=FILE.jsonl ({\"prompt\", \"response\"} lines) would warm it up first")
    if cfg.data.path:
        return None, ("SFT warm-up skipped: your data.path has no SFT demonstrations for it, and the built-in "
                      f"demo's are never mixed into your run; RL starts from the untrained {cfg.models.actor.preset} "
                      "preset. Give sft.path=FILE.jsonl ({\"prompt\", \"response\"} lines) or "
                      "models.actor.path=DIR (a trained actor)")
    return "demo", ""


def warms_up(cfg: Config) -> bool:
    """Whether the run starts with a quick SFT: RL, DPO and the reward model (initialised from the
    SFT model, as in InstructGPT) on a preset actor with the demo's data, or on any actor with the
    user's sft.path, unless sft.warmup is off (``warmup_plan``)."""
    return warmup_plan(cfg)[0] is not None


def reference_like(actor: torch.nn.Module, cfg: Config, seed: int) -> torch.nn.Module:
    """The reference policy: its own model (a checkpoint, or a preset other than the actor's, drawn
    from ``seed``), else the actor itself (to be copied)."""
    spec = cfg.models.ref
    if not own_model(cfg.models, "ref"):
        return actor
    if spec.path:
        return load_pretrained(spec.path)
    return build_model(spec.preset, seed=seed).to(next(actor.parameters()).dtype)


def frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    ref = copy.deepcopy(model)
    ref.requires_grad_(False)
    return ref.eval()


def build_roles(cfg: Config, actor: torch.nn.Module) -> dict[str, Role]:
    """Roles for ``cfg.algo`` around an initialised actor (after any SFT warm-up)."""
    seed, algo = cfg.train.seed, cfg.algo
    roles: dict[str, Role] = {}
    if algo == "rm":  # from models.reward.path, else the (SFT) actor's backbone with a fresh head
        rm = value_model_like(actor, cfg, "reward", seed + 3, zero_head=False)
        roles["reward"] = Role(rm, reward_optimizer(rm, cfg))
        return roles
    roles["actor"] = Role(actor, make_optimizer(actor, role_lr(cfg, "actor")[0], cfg.optim.weight_decay))
    if algo == "sft":
        return roles
    roles["ref"] = Role(frozen_copy(reference_like(actor, cfg, seed + 2)))
    if algo == "dpo":
        return roles
    if algo == "ppo":
        critic = value_model_like(actor, cfg, "critic", seed + 1)
        roles["critic"] = Role(critic, make_optimizer(critic, role_lr(cfg, "critic")[0], cfg.optim.weight_decay))
    rpath = cfg.models.reward.path
    roles["reward"] = Role(frozen_copy(load_pretrained(rpath, value_head=True)) if rpath else None)
    return roles


def prompt_records(cfg: Config) -> list[dict[str, str]]:
    """The run's prompt records (scoring.train_records: the file is read once a process, and the
    rewards read the same records), checked for what the rule reward needs."""
    recs = train_records(cfg)
    rule = cfg.models.reward.path is None and not cfg.reward.fn
    if cfg.data.path and cfg.algo not in ("sft", "rm", "dpo") and rule and any("answer" not in r for r in recs):
        raise UserError(f"{cfg.data.path}: the rule reward {cfg.reward.rule!r} needs an \"answer\" on "
                        "every line (or set models.reward.path to use a reward model)")
    return recs


def sft_records(cfg: Config, warmup: bool = False) -> list[dict[str, str]]:
    """SFT demonstrations: algo=sft's data.path, the warm-up's sft.path, else (a run with no data of
    its own) the demo's. A user's run never gets the demo's (the warm-up is skipped instead)."""
    if cfg.data.path and cfg.algo == "sft" and not warmup:
        return read_dataset(cfg.data.path, "sft", cfg.data.renames())
    if cfg.sft.path and warmup:
        return read_dataset(cfg.sft.path, "sft", cfg.data.renames())
    if cfg.data.path:
        raise UserError(f"no SFT data for this run: data.path={cfg.data.path} holds your task, and the demo's "
                        "demonstrations are never mixed in; set sft.path=FILE.jsonl")
    return demo.sft_records(cfg.train.seed, DEMO_SFT_RECORDS)


def pair_records(cfg: Config, heldout: bool = False) -> list[dict[str, str]]:
    if cfg.data.path and not heldout:
        return read_dataset(cfg.data.path, "pairs", cfg.data.renames())
    # held-out pairs reject other wrong answers (see demo.py): none of them is a training pair
    return demo.preference_records(cfg.train.seed + (10_007 if heldout else 0),
                                   DEMO_HELDOUT_PAIRS if heldout else DEMO_PAIRS, heldout=heldout)


def encode_prompt_batch(cfg: Config, tok, records: list[dict]) -> Batch:
    """Prompt records -> the prompt batch, through the actor checkpoint's chat template when
    data.chat_template is on."""
    template = _template(cfg)
    if template is None and any("prompt" not in r for r in records):
        raise UserError("a record has \"messages\" but no \"prompt\": set data.chat_template=true to render "
                        "messages through the model's chat template")
    return Batch(encode_prompts(tok, records, cfg.data.prompt_len, cfg.data.gen_len, template))


def encode_sft_batch(cfg: Config, tok, records: list[dict]) -> Batch:
    return Batch(_encode_side(cfg, tok, records, "response", _template(cfg)))


def encode_pair_batch(cfg: Config, tok, records: list[dict]) -> Batch:
    data, template = {}, _template(cfg)
    for side in ("chosen", "rejected"):
        data.update({f"{side}_{k}": v for k, v in _encode_side(cfg, tok, records, side, template).items()})
    return Batch(data)


def _template(cfg: Config):
    """The actor's chat template where data.chat_template is on, else None."""
    return load_chat_template(cfg.models.actor.path) if cfg.data.chat_template else None


def _encode_side(cfg: Config, tok, records: list[dict], side: str, template) -> dict:
    """(prompt, ``side``) sequences, rendered through ``template`` where there is one
    (data/chat_records.py)."""
    prompts, texts = plain_texts(records, side) if template is None else chat_texts(template, records, side)
    return encode_sequences(tok, prompts, texts, cfg.data.prompt_len, cfg.data.gen_len, chat=template is not None)
