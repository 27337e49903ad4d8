"""Environments for multi-turn rollouts: the user's class behind ``env.fn``, loaded, checked and
called here (the rollout itself is multiturn.py).

    env.fn=path/to/file.py:Name    (or package.module:Name; loaded by user_code.py, as reward.fn)
    env.max_turns=4                policy turns per trajectory at most
    env.max_tokens=128             tokens after the prompt: every turn's response and observation

``Name(row)`` is made once per trajectory from its dataset record (the dict of the JSONL line) and
must have two methods:

    reset() -> str | list[dict] | None
        the first prompt: text (rendered as one user turn, through the chat template under
        data.chat_template), a list of {"role", "content"} messages, or None for the record's own
        prompt as the dataset encodes it;
    step(response_text) -> (observation, reward, done)
        the policy's reply of this turn (its sampled tokens, decoded; the end-of-turn token
        dropped) -> the environment's answer (text, a {"role", "content"} message, or None), a
        number, and whether the trajectory ends. An observation of None also ends it.

The trajectory's reward is the sum of its steps' rewards. A tool is an environment that finds a
call in the response (e.g. ``<calc>...</calc>``, ``tagged_call``), runs it in a subprocess with
limits (tool_sandbox.run_tool) and returns its output, a ``ToolOutput``, which the rollout counts
as a tool call (and as an error when ``ToolOutput.ok`` is false): env/tool_calls, env/tool_errors.

Every rank of the generation call's replica runs the same environments on the same responses, so
a step must depend on (row, responses so far) only; a tool's time limit is the one exception,
which is why limits are set far above a tool's normal run time.
"""

from __future__ import annotations

import inspect
import math
import numbers
import re
from dataclasses import dataclass

from ..errors import UserError
from .user_code import load_user_object
import functools

ALGOS_WITH_ENV = ("ppo", "grpo", "rloo")


class ToolOutput(str):
    """An observation that is a tool's result: the text, plus whether the tool ran cleanly."""

    ok: bool = True

    def __new__(cls, text: str, ok: bool = True) -> ToolOutput:
        out = super().__new__(cls, text)
        out.ok = ok
        return out


def tagged_call(text: str, tag: str) -> str | None:
    """The content of the first ``<tag>...</tag>`` block of ``text`` (stripped), or None. A block
    whose closing tag is missing counts up to the end of the text (a response cut at the stop)."""
    m = re.search(rf"<{tag}>(.*?)(</{tag}>|$)", text, re.S)
    return None if m is None else m.group(1).strip()


@dataclass(frozen=True)
class EnvClass:
    """The loaded ``env.fn``: its class (or factory), its name and where its code lives."""

    cls: type
    name: str
    where: str

    def make(self, row: dict, where_row: str) -> object:
        """``Name(row)`` for one trajectory; UserError naming the class and the row if it raises."""
        try:
            return self.cls(row)
        except Exception as e:
            raise UserError(f"env {self.name} ({self.where}) raised {type(e).__name__}: {e} when made for "
                            f"{where_row}") from None

    def reset(self, env: object, where_row: str) -> str | list[dict] | None:
        try:
            first = env.reset()
        except Exception as e:
            raise UserError(f"env {self.name} ({self.where}).reset() raised {type(e).__name__}: {e} on "
                            f"{where_row}") from None
        if first is not None and not isinstance(first, str) and not _messages(first):
            raise UserError(f"env {self.name} ({self.where}).reset() returned {first!r:.80}, not text, a list of "
                            f"{{\"role\", \"content\"}} messages or None, on {where_row}")
        return first

    def step(self, env: object, response: str, where_row: str) -> tuple[str | dict | None, float, bool]:
        """env.step(response), checked: (observation, reward, done) or one UserError naming the env."""
        name = f"env {self.name} ({self.where}).step()"
        try:
            out = env.step(response)
        except Exception as e:
            raise UserError(f"{name} raised {type(e).__name__}: {e} on {where_row}") from None
        if not isinstance(out, tuple) or len(out) != 3:
            raise UserError(f"{name} returned {out!r:.80}, not (observation, reward, done), on {where_row}")
        obs, reward, done = out
        if obs is not None and not isinstance(obs, str) and not _messages([obs]):
            raise UserError(f"{name} returned the observation {obs!r:.80}: text, a {{\"role\", \"content\"}} "
                            f"message or None expected, on {where_row}")
        if isinstance(reward, bool) or not isinstance(reward, numbers.Real) or not math.isfinite(float(reward)):
            raise UserError(f"{name} returned the reward {reward!r}, not a finite number, on {where_row}")
        return obs, float(reward), bool(done)


def _messages(x: object) -> bool:
    return isinstance(x, list) and bool(x) and all(isinstance(m, dict) and "role" in m and "content" in m
                                                   for m in x)


def _positional(fn, n: int) -> bool:
    """Whether ``fn`` (bound) can be called with n positional arguments."""
    try:
        inspect.signature(fn).bind(*range(n))
    except TypeError:
        return False
    except ValueError:  # no signature to read (a builtin): let the call decide
        return True
    return True


def load_env(spec: str, key: str = "env.fn") -> EnvClass:
    """``file.py:Name`` or ``module:Name`` -> EnvClass, checked: ``Name(row)`` is callable with one
    argument and has ``reset()`` and ``step(response)`` (UserError naming what is wrong)."""
    cls, name, where = load_user_object(spec, key, "class")
    if not _positional(cls, 1):
        raise UserError(f"{key}={spec!r}: {name} ({where}) must be callable as {name}(row)")
    for method, n in (("reset", 0), ("step", 1)):
        fn = getattr(cls, method, None)
        if not callable(fn):
            raise UserError(f"{key}={spec!r}: {name} ({where}) has no method {method}()")
        bound = _unbound(cls, method, fn) if inspect.isclass(cls) else fn
        if not _positional(bound, n):
            want = "reset()" if n == 0 else "step(response_text)"
            raise UserError(f"{key}={spec!r}: {name}.{method} must be callable as {want}")
    return EnvClass(cls, name, where)


def _unbound(cls: type, method: str, fn):
    """A class's method as its instances would see it: without ``self`` (a plain function in the
    class), as is (a staticmethod or classmethod)."""

    raw = inspect.getattr_static(cls, method)
    return functools.partial(fn, None) if inspect.isfunction(raw) else fn


def validate_env(cfg) -> None:
    """Refuse bad env.* settings up front, each error naming its key."""
    e, d = cfg.env, cfg.data
    if d.turns_mean is not None and not 1 <= d.turns_mean <= e.max_turns:
        raise UserError(f"data.turns_mean={d.turns_mean} must be between 1 and env.max_turns={e.max_turns}")
    if d.obs_len_mean is not None and not 0 <= d.obs_len_mean <= e.max_tokens:
        raise UserError(f"data.obs_len_mean={d.obs_len_mean} must be between 0 and env.max_tokens={e.max_tokens}")
    if e.fn is None:
        return
    if cfg.algo not in ALGOS_WITH_ENV:
        raise UserError(f"env.fn is for {', '.join(ALGOS_WITH_ENV)}, not algo={cfg.algo}")
    if e.max_tokens < cfg.data.gen_len:
        raise UserError(f"env.max_tokens={e.max_tokens} must be >= data.gen_len={cfg.data.gen_len} (one turn)")
    if cfg.reward.overlong_buffer > 0:
        raise UserError("reward.overlong_buffer does not apply to multi-turn rollouts (env.fn); the environment "
                        "gives the reward")
    if cfg.reward.fn or cfg.models.reward.path:
        raise UserError("env.fn gives the reward (the sum of its steps'); reward.fn and models.reward.path are "
                        "not used with it: score the response in the environment's step()")
    if not e.obs_role:
        raise UserError("env.obs_role must name a chat role, e.g. user or tool")
    load_env(e.fn)


def response_width(cfg) -> int:
    """N, the columns after the prompt in every RL batch: data.gen_len, or env.max_tokens for a
    multi-turn run (a trajectory's responses and observations)."""
    return cfg.env.max_tokens if cfg.env.fn else cfg.data.gen_len
