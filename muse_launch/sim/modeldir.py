"""The tiny local model directory a simulated worker reports as its model_path and
tokenizer_path (config + a valid WordLevel tokenizer), so a router never downloads anything."""

from __future__ import annotations

import json
import os
import re

from .config import SimConfig

TOKENIZER_JSON = {
    "version": "1.0", "truncation": None, "padding": None,
    "added_tokens": [{"id": i, "content": t, "single_word": False, "lstrip": False,
                      "rstrip": False, "normalized": False, "special": True}
                     for i, t in enumerate(["<unk>", "<|begin_of_text|>", "<|end|>"])],
    "normalizer": None, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": None,
    "decoder": None,
    "model": {"type": "WordLevel", "unk_token": "<unk>",
              "vocab": {"<unk>": 0, "<|begin_of_text|>": 1, "<|end|>": 2, "rehearsal": 3,
                        "hello": 4}},
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
        "config.json": {"architectures": ["MuseSparkForConditionalGeneration"],
                        "model_type": "muse_spark", "max_position_embeddings":
                            cfg.context_length, "vocab_size": 5,
                        "_name_or_path": cfg.model, "muse_launch_sim": True},
        "tokenizer.json": TOKENIZER_JSON,
        "tokenizer_config.json": {"tokenizer_class": "PreTrainedTokenizerFast",
                                  "model_max_length": cfg.context_length,
                                  "unk_token": "<unk>", "bos_token": "<|begin_of_text|>",
                                  "eos_token": "<|end|>"},
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
