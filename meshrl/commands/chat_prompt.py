"""``meshrl generate --chat``: a conversation rendered through the checkpoint's own chat template.

The template is meshrl/data/chat.py's (sandboxed Jinja, as transformers' ``apply_chat_template``
with ``add_generation_prompt=True``). Until that module is on this branch, a minimal renderer with
the same sandbox and the same template sources stands in for it.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import UserError


def render_chat(model_dir: str, messages: list[dict]) -> str:
    """messages [{"role", "content"}, ...] -> prompt text ending with the assistant's turn header."""
    try:
        from ..data.chat import load_chat_template
    except ImportError:
        return _render_minimal(Path(model_dir), messages)
    return load_chat_template(model_dir).render_messages(messages, add_generation_prompt=True)


def _render_minimal(root: Path, messages: list[dict]) -> str:
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    cfg_file = root / "tokenizer_config.json"
    cfg = json.loads(cfg_file.read_text(encoding="utf-8")) if cfg_file.is_file() else {}
    jinja_file = root / "chat_template.jinja"
    template = jinja_file.read_text(encoding="utf-8") if jinja_file.is_file() else cfg.get("chat_template")
    if not isinstance(template, str):
        raise UserError(f"{root}: no chat template (neither chat_template.jinja nor a \"chat_template\" in "
                        "tokenizer_config.json)")
    special = {k: (v.get("content") if isinstance(v, dict) else v) for k, v in cfg.items()
               if k.endswith("_token") and isinstance(v, (str, dict))}

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    try:
        return env.from_string(template).render(messages=messages, add_generation_prompt=True, **special)
    except jinja2.TemplateError as e:
        raise UserError(f"chat template of {root} failed: {e}") from None
