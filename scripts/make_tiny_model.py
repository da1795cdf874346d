#!/usr/bin/env python3
"""Write a tiny random-weight Llama that vLLM (CPU) can serve, with no network.

    python scripts/make_tiny_model.py DIR [--vocab-size 512] [--seed 0] [--force]

Run it with the vLLM venv's python (scripts/install_vllm_cpu.sh prints its path); it
needs only torch, transformers and tokenizers, all of which that venv has.

DIR gets:
  config.json, model.safetensors, generation_config.json   (LlamaForCausalLM)
  tokenizer.json, tokenizer_config.json (with chat_template), special_tokens_map.json

The model: 2 layers, hidden 64, 2 attention heads, 1 KV head, head_dim 32 (vLLM's CPU
attention needs head_dim >= 32), intermediate 128, float32, random weights from a fixed
seed. The tokenizer: byte-level BPE trained here on a built-in corpus, so any text
encodes (about 3-4 characters per token on English prose). Output is deterministic for
a given seed and vocab size.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

# Never reach for the hub: everything here is made locally.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

BOS = "<|begin_of_text|>"
EOS = "<|end_of_text|>"
PAD = "<|pad|>"
ROLE_TOKENS = ["<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
SPECIAL_TOKENS = [BOS, EOS, PAD, *ROLE_TOKENS]

# One turn per message, then an assistant header when a generation prompt is asked for.
# Content may be a string or a list of {"type": "text", "text": ...} parts.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "<|end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

_BASE_TEXT = """\
The launcher starts a router, a prefill worker and a decode worker on each node.
A prefill worker reads the whole prompt once and writes its key and value cache.
The decode worker loads that cache and produces the answer one token at a time.
Health checks poll every server until it answers, then the router is told about it.
When a process exits, the supervisor stops the others and reports the exit code.
Numbers, names and punctuation: 0 1 2 3 4 5 6 7 8 9, alpha beta gamma delta; (a, b) [c] {d}!
Hello world. How are you today? I am fine, thank you. What is the weather like?
def main(argv): return run(parse(argv)) if argv else 0  # code also appears in prompts
"""


def corpus() -> list[str]:
    """A deterministic training corpus: base text plus simple generated sentences."""
    lines = _BASE_TEXT.splitlines()
    subjects = ["the router", "a worker", "the node", "the model", "each request", "the cache"]
    verbs = ["starts", "waits for", "sends", "reads", "writes", "stops", "checks"]
    objects = ["the port", "a token", "the prompt", "its peers", "the health endpoint", "a block"]
    for i, s in enumerate(subjects):
        for j, v in enumerate(verbs):
            o = objects[(i + j) % len(objects)]
            lines.append(f"{s.capitalize()} {v} {o} after {i * 7 + j} seconds.")
    return lines * 4


def build_tokenizer(vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    return tok


def write_model(out: Path, vocab_size: int, seed: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = build_tokenizer(vocab_size)
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=ROLE_TOKENS,
        model_max_length=2048,
    )
    hf_tok.chat_template = CHAT_TEMPLATE
    hf_tok.save_pretrained(out)

    # Keep the chat template in tokenizer_config.json (the one place every reader looks);
    # newer transformers write it to chat_template.jinja instead, which would win on load.
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = CHAT_TEMPLATE
    # Portable spelling: transformers 5 writes tokenizer_class "TokenizersBackend" and a list
    # under "extra_special_tokens", which transformers 4 cannot read; both versions read these.
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    extra = cfg.pop("extra_special_tokens", None)
    cfg["additional_special_tokens"] = extra if isinstance(extra, list) else list(ROLE_TOKENS)
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    (out / "chat_template.jinja").unlink(missing_ok=True)

    real_vocab = len(hf_tok)  # trained vocab, may be below vocab_size on a small corpus
    config = LlamaConfig(
        vocab_size=real_vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=hf_tok.convert_tokens_to_ids(BOS),
        eos_token_id=hf_tok.convert_tokens_to_ids(EOS),
        pad_token_id=hf_tok.convert_tokens_to_ids(PAD),
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float32).eval()
    model.save_pretrained(out, safe_serialization=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", type=Path, help="output directory (created)")
    ap.add_argument("--vocab-size", type=int, default=512)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--force", action="store_true", help="replace DIR if it is not empty")
    args = ap.parse_args(argv)

    out: Path = args.dir
    if out.exists() and any(out.iterdir()):
        if not args.force:
            if (out / "config.json").exists() and (out / "tokenizer.json").exists():
                print(f"{out}: model already present (use --force to rewrite)", file=sys.stderr)
                print(out.resolve())
                return 0
            print(f"{out}: not empty; use --force", file=sys.stderr)
            return 2
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    write_model(out, args.vocab_size, args.seed)
    print(out.resolve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
