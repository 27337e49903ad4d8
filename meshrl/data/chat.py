"""Chat templates: render a dataset record through a checkpoint's own template, as
``transformers``' ``apply_chat_template(..., tokenize=False, add_generation_prompt=True)`` does.

The template is ``chat_template.jinja`` in the checkpoint directory, else the ``chat_template``
entry of ``tokenizer_config.json`` (a string, or a list of ``{"name", "template"}`` of which
"default" is used). A template is untrusted code from a model hub, so it runs in Jinja2's
``ImmutableSandboxedEnvironment`` with the same globals and filters transformers gives it
(``raise_exception``, ``strftime_now``, a JSON ``tojson``, ``trim_blocks``/``lstrip_blocks``), and
sees the special tokens (``bos_token``, ``eos_token``, ...) as strings, as in transformers.

    tpl = load_chat_template("ckpt/")                      # UserError if the dir has none
    text = tpl.render({"messages": [{"role": "user", "content": "hi"}]})
    text = tpl.render({"prompt": "hi"})                      # = one user message
    tpl.end_of_turn()                                        # "<|im_end|>", "<|eot_id|>", ... or None

The rendered text already holds whatever the template puts first (often ``bos_token``): encode it
without adding special tokens.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from pathlib import Path

from ..errors import UserError

SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
_SENTINEL = "MESHRL_END_OF_TURN_PROBE"


@dataclass
class ChatTemplate:
    """A checkpoint's chat template: its Jinja source, where it came from, and the special tokens
    (name -> text, e.g. {"eos_token": "</s>"}) the template may use."""

    template: str
    source: str
    special: dict[str, str] = field(default_factory=dict)

    def render(self, record: dict, add_generation_prompt: bool = True) -> str:
        """``{"messages": [{"role", "content"}, ...]}`` or ``{"prompt": str}`` (one user turn,
        after a ``"system"`` turn if the record has that key) -> the prompt text, ending with the
        assistant's turn header when ``add_generation_prompt``."""
        return self.render_messages(messages_of(record, self.source), add_generation_prompt)

    def render_messages(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        import jinja2  # only for chat templates (slow to import)

        try:
            return _compiled(self.template).render(messages=messages, add_generation_prompt=add_generation_prompt,
                                                   tools=None, documents=None, **self.special)
        except jinja2.TemplateError as e:
            raise UserError(f"chat template of {self.source} failed: {e}") from None

    def end_of_turn(self) -> str | None:
        """The text the template writes right after an assistant message (its end-of-turn token,
        e.g. "<|im_end|>"), found by rendering a probe reply; None if it writes nothing there.
        Only the first whitespace-free run is kept ("<|im_end|>\\n" -> "<|im_end|>")."""
        msgs = [{"role": "user", "content": "x"}, {"role": "assistant", "content": _SENTINEL}]
        try:
            text = self.render_messages(msgs, add_generation_prompt=False)
        except UserError:
            return None
        tail = text.split(_SENTINEL, 1)[1] if _SENTINEL in text else ""
        words = tail.split()
        return words[0] if words else None


def messages_of(record: dict, where: str = "record") -> list[dict]:
    """A record's conversation: its "messages", else its "prompt" as one user message."""
    if "messages" in record:
        msgs = record["messages"]
        if not isinstance(msgs, list) or not all(isinstance(m, dict) and "role" in m for m in msgs):
            raise UserError(f"{where}: \"messages\" must be a list of {{\"role\", \"content\"}} objects")
        return msgs
    if "prompt" in record:
        system = [{"role": "system", "content": record["system"]}] if "system" in record else []
        return system + [{"role": "user", "content": str(record["prompt"])}]
    raise UserError(f"{where}: a chat record needs \"messages\" or \"prompt\"")


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: malformed JSON ({e})") from None
    return d if isinstance(d, dict) else {}


def _token_text(value) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def load_chat_template(path: str | Path) -> ChatTemplate:
    """The chat template of checkpoint directory ``path`` (UserError naming the directory if it
    has none)."""
    root = Path(path)
    cfg = _read_json(root / "tokenizer_config.json")
    special: dict[str, str] = {}
    for src in (_read_json(root / "special_tokens_map.json"), cfg):  # tokenizer_config wins
        for k in SPECIAL_KEYS:
            if (t := _token_text(src.get(k))) is not None:
                special[k] = t
    jinja_file = root / "chat_template.jinja"
    if jinja_file.is_file():
        return ChatTemplate(jinja_file.read_text(encoding="utf-8"), str(jinja_file), special)
    tpl = cfg.get("chat_template")
    if isinstance(tpl, list):  # named templates: [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in tpl if isinstance(t, dict)}
        tpl = named.get("default")
    if not isinstance(tpl, str):
        raise UserError(f"{root}: no chat template (neither chat_template.jinja nor a \"chat_template\" "
                        "in tokenizer_config.json); set data.chat_template=false")
    return ChatTemplate(tpl, str(root / "tokenizer_config.json"), special)


@lru_cache(maxsize=16)
def _compiled(template: str):
    """The template compiled in transformers' sandbox (cached: a run renders thousands of records)."""
    import jinja2  # only for chat templates (slow to import)
    import jinja2.ext  # only for chat templates (slow to import)
    from jinja2.sandbox import ImmutableSandboxedEnvironment  # only for chat templates (slow to import)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # Jinja's own tojson escapes HTML characters, which would change the prompt text
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(template)
    except jinja2.TemplateSyntaxError as e:
        raise UserError(f"chat template does not parse: {e}") from None


def end_of_turn_id(path: str | Path, tok) -> int | None:
    """The token id that ends an assistant turn for checkpoint ``path``'s template and tokenizer
    ``tok``: the template's end-of-turn text if it is one token, else the tokenizer's EOS."""
    text = load_chat_template(path).end_of_turn()
    if text is not None:
        ids = token_ids(tok, text)
        if len(ids) == 1:
            return ids[0]
    return tok.eos_token_id


def token_ids(tok, text: str) -> list[int]:
    """Tokens of ``text`` without added special tokens (an HFTokenizer or a transformers one)."""
    inner = getattr(tok, "tok", None)  # meshrl's HFTokenizer wraps a tokenizers.Tokenizer
    if inner is not None:
        return inner.encode(text, add_special_tokens=False).ids
    return tok.encode(text, add_special_tokens=False)
