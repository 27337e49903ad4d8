"""The demo's byte tokenizer written as a Hugging Face fast tokenizer (``tokenizer.json``), so an
exported checkpoint is complete: ``transformers.AutoTokenizer.from_pretrained(dir)`` loads it and
gives the same ids as ``ByteTokenizer().encode(text, add_bos=True)``.

How bytes become ids 0..255 in the ``tokenizers`` library: the ByteLevel pre-tokenizer maps every
byte to one printable character (GPT-2's byte-to-unicode table) without splitting the text, and a
BPE model with exactly those 256 characters as its vocabulary and no merges turns each character
back into its byte's id. Special tokens take ids 256..258 (pad, bos, eos); 259..263 are unused
placeholders so that the file's vocabulary has the model's 264 entries. A template post-processor
puts bos in front, as training does.
"""

from __future__ import annotations

import json
from pathlib import Path

SPECIAL = {"<pad>": 256, "<s>": 257, "</s>": 258}
UNUSED = [f"<unused{i}>" for i in range(5)]  # ids 259..263


def byte_chars() -> list[str]:
    """GPT-2's byte -> printable character table in byte order (what the ByteLevel pre-tokenizer
    produces: printable Latin-1 bytes stand for themselves, the others for chr(256 + n))."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, cs, strict=True))
    return [chr(table[b]) for b in range(256)]


def byte_tokenizer_json() -> str:
    """The tokenizer.json text for ByteTokenizer (vocab 264)."""
    from tokenizers import (  # only to write a tokenizer.json
        AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors)

    vocab = {ch: b for b, ch in enumerate(byte_chars())}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True) for t in (*SPECIAL, *UNUSED)])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", SPECIAL["<s>"])])
    return tok.to_str(pretty=True)


def write_byte_tokenizer(root: Path, marker: dict) -> None:
    """tokenizer.json, tokenizer_config.json (``marker`` merged in) and special_tokens_map.json."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "tokenizer.json").write_text(byte_tokenizer_json())
    special = {"pad_token": "<pad>", "bos_token": "<s>", "eos_token": "</s>"}
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", **special, "add_bos_token": True,
           "add_eos_token": False, "clean_up_tokenization_spaces": False, **marker}
    (root / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (root / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")
