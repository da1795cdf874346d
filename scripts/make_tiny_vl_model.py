#!/usr/bin/env python3
"""Write a tiny random-weight Qwen2.5-VL (vision encoder + language model) that SGLang serves on the
CPU as encoder, prefill and decode, with no network.

    python scripts/make_tiny_vl_model.py DIR [--seed 0] [--force]

Run it with the SGLang venv's python (scripts/install_sglang_cpu.sh prints its path). The language
model: 2 layers, hidden 64, 2 heads, 1 KV head; the vision tower: 2 blocks, hidden 32, patch 14,
merge 2. The tokenizer is scripts/make_tiny_model.py's byte-level BPE plus Qwen's vision tokens.
Deterministic for a given seed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import make_tiny_model as text  # noqa: E402

VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}"
    "{% elif part['type'] == 'image' or part['type'] == 'image_url' %}"
    "<|vision_start|><|image_pad|><|vision_end|>{% endif %}"
    "{% endfor %}{% endif %}"
    "<|end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def write_model(out: Path, seed: int) -> None:
    import torch
    from tokenizers import AddedToken
    from transformers import (
        PreTrainedTokenizerFast,
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2_5_VLProcessor,
        Qwen2VLImageProcessor,
        Qwen2VLVideoProcessor,
    )

    tok = text.build_tokenizer(512)
    tok.add_special_tokens([AddedToken(t, special=True) for t in VISION_TOKENS])
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=text.BOS,
        eos_token=text.EOS,
        pad_token=text.PAD,
        additional_special_tokens=[*text.ROLE_TOKENS, *VISION_TOKENS],
        model_max_length=4096,
    )
    hf_tok.chat_template = CHAT_TEMPLATE
    image_processor = Qwen2VLImageProcessor(
        min_pixels=56 * 56, max_pixels=112 * 112, patch_size=14, merge_size=2, temporal_patch_size=2
    )
    video_processor = Qwen2VLVideoProcessor(
        min_pixels=56 * 56, max_pixels=112 * 112, patch_size=14, merge_size=2, temporal_patch_size=2
    )
    processor = Qwen2_5_VLProcessor(
        image_processor=image_processor,
        tokenizer=hf_tok,
        video_processor=video_processor,
        chat_template=CHAT_TEMPLATE,
    )
    processor.save_pretrained(out)
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = CHAT_TEMPLATE
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")

    ids = {t: hf_tok.convert_tokens_to_ids(t) for t in VISION_TOKENS}
    config = Qwen2_5_VLConfig(
        text_config=dict(
            vocab_size=len(hf_tok),
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            max_position_embeddings=4096,
            rope_theta=10000.0,
            rope_scaling={"type": "mrope", "mrope_section": [4, 6, 6]},
            tie_word_embeddings=False,
            torch_dtype="float32",
            bos_token_id=hf_tok.convert_tokens_to_ids(text.BOS),
            eos_token_id=hf_tok.convert_tokens_to_ids(text.EOS),
            pad_token_id=hf_tok.convert_tokens_to_ids(text.PAD),
        ),
        vision_config=dict(
            depth=2,
            hidden_size=32,
            intermediate_size=64,
            num_heads=2,
            out_hidden_size=64,
            patch_size=14,
            spatial_merge_size=2,
            temporal_patch_size=2,
            window_size=56,
            fullatt_block_indexes=[1],
            in_chans=3,
        ),
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        bos_token_id=hf_tok.convert_tokens_to_ids(text.BOS),
        eos_token_id=hf_tok.convert_tokens_to_ids(text.EOS),
        pad_token_id=hf_tok.convert_tokens_to_ids(text.PAD),
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen2_5_VLForConditionalGeneration(config).to(torch.float32).eval()
    model.save_pretrained(out, safe_serialization=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", type=Path, help="output directory (created)")
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
    write_model(out, args.seed)
    print(out.resolve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
