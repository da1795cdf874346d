"""The OpenAI and SGLang response shapes around the deterministic output of :mod:`.textgen`:
ids, usage, chat and completion responses and their streamed chunks, /generate meta_info."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

from .textgen import Output


def new_id(engine: str, kind: str) -> str:
    h = uuid.uuid4().hex
    if engine == "vllm":
        return f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{h}"
    return h


def tool_call_id(engine: str) -> str:
    if engine == "vllm":
        return f"chatcmpl-tool-{uuid.uuid4().hex}"
    return f"call_{uuid.uuid4().hex[:24]}"


def usage(prompt: int, completion: int, reasoning: int = 0) -> dict:
    u = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": None,
    }
    if reasoning:
        u["completion_tokens_details"] = {"reasoning_tokens": reasoning}
        u["reasoning_tokens"] = reasoning
    return u


def chat_message(engine: str, out: Output) -> dict:
    msg: dict[str, Any] = {"role": "assistant", "content": out.content or None}
    if out.reasoning:
        msg["reasoning_content"] = out.reasoning
        if engine == "vllm":
            msg["reasoning"] = out.reasoning
    else:
        msg["reasoning_content"] = None
    tcs = []
    if out.tool_call:
        tcs.append(
            {
                "id": tool_call_id(engine),
                "type": "function",
                "index": 0,
                "function": {"name": out.tool_call["name"], "arguments": out.tool_call["arguments"]},
            }
        )
    msg["tool_calls"] = tcs or None
    return msg


def chat_response(
    engine: str, model: str, out: Output, prompt_tokens: int, extra: dict | None = None
) -> dict:
    resp = {
        "id": new_id(engine, "chat"),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": chat_message(engine, out),
                "logprobs": None,
                "finish_reason": out.finish_reason,
                **({"matched_stop": None} if engine == "sglang" else {"stop_reason": None}),
            }
        ],
        "usage": usage(prompt_tokens, out.completion_tokens, out.reasoning_tokens),
    }
    if extra:
        resp.update(extra)
    return resp


def chat_chunks(
    engine: str, model: str, out: Output, prompt_tokens: int, include_usage: bool
) -> Iterator[dict]:
    cid = new_id(engine, "chat")
    created = int(time.time())

    def chunk(delta: dict, finish: str | None = None) -> dict:
        c = {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
        if engine == "sglang":
            c["usage"] = None
        return c

    yield chunk({"role": "assistant", "content": ""})
    for p in out.reasoning_pieces:
        d = {"reasoning_content": p}
        if engine == "vllm":
            d["reasoning"] = p
        yield chunk(d)
    for p in out.content_pieces:
        yield chunk({"content": p})
    if out.tool_call:
        yield chunk(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": tool_call_id(engine),
                        "type": "function",
                        "function": {"name": out.tool_call["name"], "arguments": ""},
                    }
                ]
            }
        )
        yield chunk({"tool_calls": [{"index": 0, "function": {"arguments": out.tool_call["arguments"]}}]})
    yield chunk({}, out.finish_reason)
    if include_usage:
        yield {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [],
            "usage": usage(prompt_tokens, out.completion_tokens, out.reasoning_tokens),
        }


def completion_response(
    engine: str,
    model: str,
    text: str,
    finish: str,
    prompt_tokens: int,
    completion_tokens: int,
    extra: dict | None = None,
) -> dict:
    resp = {
        "id": new_id(engine, "cmpl"),
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": finish,
                **({"matched_stop": None} if engine == "sglang" else {"stop_reason": None}),
            }
        ],
        "usage": usage(prompt_tokens, completion_tokens),
    }
    if extra:
        resp.update(extra)
    return resp


def completion_chunks(
    engine: str, model: str, ps: list[str], finish: str, prompt_tokens: int, include_usage: bool
) -> Iterator[dict]:
    cid = new_id(engine, "cmpl")
    created = int(time.time())
    for p in ps:
        yield {
            "id": cid,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "text": p, "logprobs": None, "finish_reason": None}],
        }
    yield {
        "id": cid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "text": "", "logprobs": None, "finish_reason": finish}],
    }
    if include_usage:
        yield {
            "id": cid,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [],
            "usage": usage(prompt_tokens, len(ps)),
        }


def generate_meta(
    rid: str,
    finish: str,
    prompt_tokens: int,
    completion_tokens: int,
    started: float,
    max_new_tokens: int | None,
) -> dict:
    fr: dict[str, Any] = (
        {"type": "length", "length": completion_tokens}
        if finish == "length"
        else {"type": "stop", "matched": None}
    )
    return {
        "id": rid,
        "finish_reason": fr,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "cached_tokens": 0,
        "weight_version": "default",
        "e2e_latency": round(time.time() - started, 6),
    }
