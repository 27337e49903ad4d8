"""Every input of a run, checked before anything trains or is written: model directories,
datasets (read *and* encoded, so a too-long prompt is found now, not after the warm-up), the
SFT warm-up's data, the reward rule (a plan file: by the train command). Each problem is one
UserError naming the culprit (the key, the file and line).
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

from ..config import Config
from ..errors import UserError
from ..model.checkpoint import _check_shapes, _weight_files, read_config
from ..model.config import param_shapes
from . import setup
from .evaluate import eval_batch
from .graph import graph_of
from .iteration import dataset
from .rewards import get_rule
from .setup import warmup_plan


def check_inputs(cfg: Config) -> None:
    """Raise UserError for the first bad input of ``cfg``; read nothing twice into memory for long."""
    if cfg.algo == "sft" and cfg.sft.path:
        raise UserError("sft.path is the SFT warm-up's data for the other algorithms; algo=sft trains on "
                        "data.path")
    for key in ("data.path", "sft.path"):
        check_file(key, getattr(cfg, key.split(".")[0]).path)
    roles = set(graph_of(cfg).roles()) | {"actor"}
    for role in ("actor", "ref", "critic", "reward"):
        spec = getattr(cfg.models, role)
        if spec.path and role in roles:
            check_checkpoint(spec.path, f"models.{role}.path", value_head=role in ("critic", "reward"))
    tok = setup.tokenizer_for(cfg)
    if cfg.models.reward.path is None and cfg.algo not in ("sft", "rm", "dpo"):
        get_rule(cfg.reward.rule)
    with naming_lines(cfg.data.path):
        dataset(cfg, tok)  # the records the iterations draw from, encoded as training will
    if cfg.eval.path is not None:
        with naming_lines(cfg.eval.path):
            eval_batch(cfg, tok)  # the held-out prompts, encoded as evaluation will
    source, _ = warmup_plan(cfg)
    if source is not None and source != "demo":
        with naming_lines(source):
            setup.encode_sft_batch(cfg, tok, setup.sft_records(cfg, warmup=True))


@contextlib.contextmanager
def naming_lines(path: str | None):
    """Turn the encoder's 'prompt 3: ...' / 'record 3: ...' (the index among the records) into
    'FILE:LINE: ...' for a user's JSONL file (blank lines are not records)."""
    try:
        yield
    except UserError as e:
        m = re.match(r"(prompt|record) (\d+): (.*)", str(e), re.S)
        if path is None or m is None:
            raise
        lines = [n for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1) if line.strip()]
        raise UserError(f"{path}:{lines[int(m.group(2))]}: {m.group(3)}") from None


def check_file(key: str, path: str | None) -> None:
    """A data file the run will read: it exists, is a file, and can be read."""
    if path is None:
        return
    p = Path(path)
    if not p.exists():
        raise UserError(f"{key}: no file at {path}")
    if not p.is_file():
        raise UserError(f"{key}: {path} is not a file")
    try:
        p.read_text(encoding="utf-8")  # datasets are small next to a run; a bad byte is found now
    except OSError as e:
        raise UserError(f"{key}: cannot read {path} ({e.strerror})") from None
    except UnicodeDecodeError as e:
        raise UserError(f"{key}: {path} is not UTF-8 text (byte {e.start})") from None


def check_checkpoint(path: str, key: str, value_head: bool) -> None:
    """A Hugging Face checkpoint directory that load_pretrained will accept: config.json, weights
    whose names and shapes match it (headers only; no tensor is read)."""
    if not Path(path).is_dir():
        raise UserError(f"{key}: no checkpoint directory at {path}")
    try:
        mcfg, _ = read_config(path)
        files = _weight_files(Path(path))
        expected = param_shapes(mcfg, value_head)
        missing = [n for n in expected if n not in files and not (value_head and n == "score.weight")]
        if missing:
            raise UserError(f"{path}: checkpoint lacks tensor {missing[0]!r}")
        _check_shapes(files, expected)
    except UserError as e:
        raise UserError(f"{key}: {e}") from None
