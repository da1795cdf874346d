"""The simulated model's vocabulary: its tokenizer's words, and the words it pads an answer with.

vocab.txt holds the most frequent words of the corpus aiperf draws synthetic prompts from
(scripts/make_sim_vocab.py writes it), so a benchmark's prompts are real words, each one token for the
tokenizer in the model directory and for the engine's own count alike.
"""

from __future__ import annotations

import functools
from pathlib import Path

SPECIAL = ("<unk>", "<|begin_of_text|>", "<|end|>")
# What the engine's answers use besides words (textgen.py's fixed sentences, JSON of tool calls).
PUNCTUATION = tuple(".,;:!?'\"()[]{}<>/\\-_=+*&%$#@|~`^")


@functools.lru_cache(maxsize=1)
def words() -> tuple[str, ...]:
    text = (Path(__file__).parent / "vocab.txt").read_text()
    return tuple(w for w in text.split() if w.isalnum())


@functools.lru_cache(maxsize=1)
def token_table() -> dict[str, int]:
    """Token -> id, for tokenizer.json: the special tokens first, punctuation, then the words."""
    table: dict[str, int] = {}
    for tok in (*SPECIAL, *PUNCTUATION, *words()):
        table.setdefault(tok, len(table))
    return table


def filler(seed: int, count: int) -> list[str]:
    """`count` output pieces (" word"), the same for the same seed: an answer continued past its end."""
    ws = words()
    return [" " + ws[(seed + i * 7919) % len(ws)] for i in range(max(count, 0))]
