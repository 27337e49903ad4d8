"""Tokenizers: a built-in byte-level one for the demo, and HF ``tokenizer.json`` files.

Both expose the same small interface: ``encode(str) -> list[int]``, ``decode(list[int]) -> str``,
and ``eos_token_id``, ``pad_token_id``, ``bos_token_id`` (int or None).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from ..errors import UserError
from .byte_tokenizer_file import write_byte_tokenizer

# What a checkpoint directory holds of its tokenizer (HFTokenizer.save_pretrained copies them).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "chat_template.jinja", "chat_template.json")
BYTE_TOKENIZER_CLASS = "meshrl.ByteTokenizer"  # marks a checkpoint dir that uses ByteTokenizer
BYTE_TOKENIZER_KEY = "meshrl_tokenizer"  # where tokenizer_config.json holds the mark (tokenizer_class
# itself says PreTrainedTokenizerFast, for transformers; older checkpoints put the mark there)


class ByteTokenizer:
    """ids 0..255 are the UTF-8 bytes; 256 = pad, 257 = bos, 258 = eos; vocab 264 (the `tiny` preset
    pads it to a multiple of 8 so that a vocabulary-parallel head splits evenly)."""

    pad_token_id = 256
    bos_token_id = 257
    eos_token_id = 258
    vocab_size = 264

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        ids = list(text.encode("utf-8"))
        return [self.bos_token_id, *ids] if add_bos else ids

    def decode(self, ids: list[int]) -> str:
        """Special and unused ids are dropped; invalid UTF-8 becomes U+FFFD."""
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")

    def save_pretrained(self, path: str | os.PathLike) -> None:
        """Write this tokenizer as a Hugging Face fast tokenizer (transformers.AutoTokenizer loads
        it, with the same ids), marked so that load_tokenizer reads it back as a ByteTokenizer."""

        write_byte_tokenizer(Path(path), {BYTE_TOKENIZER_KEY: BYTE_TOKENIZER_CLASS})


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        d = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: malformed JSON ({e})") from None
    return d if isinstance(d, dict) else {}


def _token_content(value) -> str | None:
    """Special tokens appear as "</s>" or {"content": "</s>", ...} in HF's JSON files."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


class HFTokenizer:
    """A ``tokenizers.Tokenizer`` read from ``dir/tokenizer.json``. Special token ids come from
    tokenizer_config.json, then special_tokens_map.json, then config.json's ``*_token_id``."""

    def __init__(self, path: str | os.PathLike) -> None:
        from tokenizers import Tokenizer  # only for a tokenizer.json checkpoint

        root = Path(path)
        self.root = root
        file = root / "tokenizer.json"
        try:
            self.tok = Tokenizer.from_file(str(file))
        except Exception as e:  # tokenizers raises a bare Exception for bad files
            raise UserError(f"{file}: cannot read tokenizer ({e})") from None
        sources = [_read_json(root / "tokenizer_config.json"), _read_json(root / "special_tokens_map.json")]
        model_cfg = _read_json(root / "config.json")
        for kind in ("eos", "pad", "bos"):
            setattr(self, f"{kind}_token_id", self._special_id(kind, sources, model_cfg))

    def _special_id(self, kind: str, sources: list[dict], model_cfg: dict) -> int | None:
        for src in sources:
            content = _token_content(src.get(f"{kind}_token"))
            if content is not None and self.tok.token_to_id(content) is not None:
                return self.tok.token_to_id(content)
        value = model_cfg.get(f"{kind}_token_id")
        if isinstance(value, list):
            value = value[0] if value else None
        return value if isinstance(value, int) else None

    @property
    def vocab_size(self) -> int:
        return self.tok.get_vocab_size()

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=True)

    def save_pretrained(self, path: str | os.PathLike) -> None:
        """Copy this tokenizer's files (and the chat template) from the directory it was read from
        into ``path``, so that an exported model is a complete checkpoint: transformers'
        AutoTokenizer and meshrl read the same ids and template back. Files are copied as they
        are, never re-serialised."""
        out = Path(path)
        for name in TOKENIZER_FILES:
            src, dst = self.root / name, out / name
            if src.is_file() and src.resolve() != dst.resolve():
                shutil.copyfile(src, dst)


def load_tokenizer(path: str | os.PathLike) -> ByteTokenizer | HFTokenizer:
    """The tokenizer of a checkpoint directory: tokenizer.json, or the ByteTokenizer mark."""
    root = Path(path)
    if not root.is_dir():
        raise UserError(f"tokenizer directory {str(root)!r} does not exist")
    tcfg = _read_json(root / "tokenizer_config.json")
    if BYTE_TOKENIZER_CLASS in (tcfg.get(BYTE_TOKENIZER_KEY), tcfg.get("tokenizer_class")):
        return ByteTokenizer()
    if (root / "tokenizer.json").is_file():
        return HFTokenizer(root)
    raise UserError(f"{root}: no tokenizer.json (only Hugging Face fast tokenizers are supported; "
                    "sentencepiece tokenizer.model files are not)")
