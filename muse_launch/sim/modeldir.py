"""The tiny local model directory a simulated worker reports as its model_path and
tokenizer_path (config + a valid WordLevel tokenizer), so a router never downloads anything."""

from __future__ import annotations

import json
import os
import re

from . import vocab
from .config import SimConfig


def tokenizer_json() -> dict:
    """A WordLevel tokenizer over the simulated model's vocabulary, split as the engine counts tokens:
    words, and each punctuation mark on its own (`<unk>` and the special tokens whole)."""
    table = vocab.token_table()
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": table[t],
                "content": t,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": t != "<unk>",
            }
            for t in vocab.SPECIAL
        ],
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "WhitespaceSplit"},
                {
                    "type": "Split",
                    "pattern": {"Regex": r"\w+|[^\w\s]"},
                    "behavior": "Isolated",
                    "invert": False,
                },
            ],
        },
        "post_processor": None,
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": False},  # tokens joined by spaces
        "model": {"type": "WordLevel", "unk_token": "<unk>", "vocab": table},
    }


def _write_atomic(path: str, text: str) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def make_model_dir(root: str, cfg: SimConfig) -> str:
    """A tiny local model directory (config + a valid tokenizer) the workers report as
    their model_path/tokenizer_path, so a router never downloads anything."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "--", cfg.model).strip("-.") or "model"
    d = os.path.join(root, "sim-models", slug)
    os.makedirs(d, exist_ok=True)
    files = {
        "config.json": {
            "architectures": ["MuseSparkForConditionalGeneration"],
            "model_type": "muse_spark",
            "max_position_embeddings": cfg.context_length,
            "vocab_size": len(vocab.token_table()),
            "_name_or_path": cfg.model,
            "muse_launch_sim": True,
        },
        "tokenizer.json": tokenizer_json(),
        "tokenizer_config.json": {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "model_max_length": cfg.context_length,
            "unk_token": "<unk>",
            "bos_token": "<|begin_of_text|>",
            "eos_token": "<|end|>",
        },
        "generation_config.json": {"max_new_tokens": 128},
    }
    for name, obj in files.items():
        p = os.path.join(d, name)
        text = json.dumps(obj, indent=1)
        try:
            with open(p) as f:
                if f.read() == text:
                    continue
        except OSError:
            pass
        _write_atomic(p, text)
    return d
