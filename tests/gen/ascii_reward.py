"""A reward that a random policy's samples differ in (so GRPO's advantages are not all zero and the
policy moves): the share of ASCII characters in the response."""


def ascii_share(prompt: str, response: str, answer: str, **row) -> float:
    return sum(ch.isascii() for ch in response) / max(1, len(response))
