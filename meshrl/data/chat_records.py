"""SFT and preference records as chat conversations: the (prompt, response) texts meshrl trains on,
rendered through the checkpoint's chat template (``data.chat_template=true``).

A record's fields are strings (a prompt becomes one user turn, a response one assistant turn) or
lists of ``{"role", "content"}`` messages, TRL's conversational formats (peer_fields.py splits a
whole conversation into them). As TRL does for conversational prompt-completion data, the prompt
text is the template's rendering of the prompt turns with the assistant header
(``add_generation_prompt``), and the response text what rendering the whole conversation adds
after it: the reply, its end-of-turn token and whatever the template writes after that, so the
model learns to end its turn as generation stops (rollout.stop_token_id). A template whose
rendering of the whole conversation does not begin with the prompt's (one that rewrites earlier
turns once a reply follows) is refused, naming the record.
"""

from __future__ import annotations

from ..errors import UserError
from .chat import ChatTemplate


def turns(value: str | list[dict], role: str) -> list[dict]:
    """A field as messages: a string is one turn of ``role``."""
    return [{"role": role, "content": value}] if isinstance(value, str) else value


def render_pair(template: ChatTemplate, prompt: str | list[dict], response: str | list[dict], where: str
                ) -> tuple[str, str]:
    """-> (prompt text ending with the assistant header, the text the response adds after it)."""
    head = turns(prompt, "user")
    first = template.render_messages(head, add_generation_prompt=True)
    whole = template.render_messages(head + turns(response, "assistant"), add_generation_prompt=False)
    if not whole.startswith(first):
        raise UserError(f"{where}: the chat template of {template.source} renders the conversation with its reply "
                        "differently from the prompt alone, so the reply's tokens cannot be told apart")
    return first, whole[len(first):]


def chat_texts(template: ChatTemplate, records: list[dict], side: str) -> tuple[list[str], list[str]]:
    """Records' (prompt texts, ``side`` texts: "response", "chosen" or "rejected")."""
    pairs = [render_pair(template, r["prompt"], r[side], f"record {i}") for i, r in enumerate(records)]
    return [p for p, _ in pairs], [s for _, s in pairs]


def plain_texts(records: list[dict], side: str) -> tuple[list[str], list[str]]:
    """Records' (prompts, ``side``) as they are, without a chat template: strings only."""
    for i, r in enumerate(records):
        if not isinstance(r["prompt"], str) or not isinstance(r[side], str):
            raise UserError(f"record {i} holds chat messages: set data.chat_template=true to render them through "
                            "the model's chat template")
    return [r["prompt"] for r in records], [r[side] for r in records]
