"""Models and a tokenizer the benchmarks share, built here (nothing is downloaded).

``LLAMA_3M`` is the 3.2M-parameter LLaMA of the GRPO benchmark (bench/grpo_vs_trl.py) (hidden 256, 4 layers,
8 heads, 4 KV heads, vocab 512). ``byte_tokenizer`` is a Hugging Face fast tokenizer with one token
per byte (a byte-level BPE without merges) plus <pad>, <s>, </s>, so that meshrl (tokenizer.json)
and transformers/TRL (AutoTokenizer) read the same tokenizer from the same checkpoint directory.
"""

from __future__ import annotations

import json
from pathlib import Path

from meshrl.model.config import ModelConfig
from meshrl.model.presets import PRESETS

LLAMA_3M = ModelConfig(vocab_size=512, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                       num_attention_heads=8, num_key_value_heads=4, rope_theta=10000.0, rms_norm_eps=1e-6,
                       max_position_embeddings=512, model_type="llama", bos_token_id=1, eos_token_id=2,
                       pad_token_id=0)
MODELS = {"llama-3m": LLAMA_3M, **PRESETS}


def save_byte_tokenizer(path: str | Path) -> None:
    """tokenizer.json + tokenizer_config.json: ids 0/1/2 = <pad>/<s>/</s>, then the 256 bytes; BOS
    is added to every encoded text (as LLaMA's tokenizer does)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, **{ch: i + 3 for i, ch in enumerate(sorted(alphabet))}}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<pad>", "<s>", "</s>"])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    root = Path(path)
    tok.save(str(root / "tokenizer.json"))
    (root / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "pad_token": "<pad>", "padding_side": "left"}))
