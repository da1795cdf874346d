"""Write muse_launch/sim/vocab.txt: the simulated engine's word vocabulary.

The words are the most frequent tokens of the complete works of Shakespeare (public domain): the corpus
aiperf draws its synthetic prompts from, so a prompt built with the simulated model's tokenizer is made
of real words (few `<unk>`), and the engine's own count of a prompt or an answer is the tokenizer's.

    .venv/bin/python scripts/make_sim_vocab.py [CORPUS.txt]   # default: aiperf's bundled corpus
"""

from __future__ import annotations

import collections
import re
import sys
from pathlib import Path

SIZE = 6000
TOKEN = re.compile(r"\w+|[^\w\s]")  # the simulated engine's own token (muse_launch/sim/textgen.py)


def main() -> int:
    if len(sys.argv) > 1:
        corpus = Path(sys.argv[1])
    else:
        import aiperf  # the `bench` extra

        corpus = Path(aiperf.__file__).parent / "dataset/generator/assets/shakespeare.txt"
    counts = collections.Counter(TOKEN.findall(corpus.read_text(errors="replace")))
    words = [w for w, _ in counts.most_common() if w.isprintable() and not w.isdigit()][:SIZE]
    out = Path(__file__).resolve().parent.parent / "muse_launch/sim/vocab.txt"
    out.write_text("\n".join(words) + "\n")
    print(f"wrote {out}: {len(words)} tokens from {corpus}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
