"""`smoke`: one chat completion through the router, plus reasoning and tool-call checks where on."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import httpx

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"location": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["location", "unit"],
        },
    },
}


@dataclass
class SmokeResult:
    check: str
    ok: bool
    detail: str
    ttft: float | None = None
    total: float = 0.0
    extra: dict = field(default_factory=dict)


def discover_model(client: httpx.Client, base: str) -> str:
    response = client.get(f"{base}/v1/models")
    response.raise_for_status()
    return response.json()["data"][0]["id"]


def chat_stream(client: httpx.Client, base: str, body: dict) -> SmokeResult:
    """Stream one chat completion; time to the first token and in total."""
    start = time.perf_counter()
    ttft = None
    content, reasoning, finish = [], [], None
    with client.stream("POST", f"{base}/v1/chat/completions", json={**body, "stream": True}) as response:
        if response.status_code != 200:
            response.read()
            return SmokeResult("chat", False, f"HTTP {response.status_code}: {response.text[:300]}",
                               total=time.perf_counter() - start)
        for line in response.iter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if "error" in chunk:
                return SmokeResult("chat", False, f"error in stream: {chunk['error']}", total=time.perf_counter() - start)
            for choice in chunk.get("choices", []):
                delta = choice.get("delta") or {}
                piece = delta.get("content") or ""
                thought = delta.get("reasoning_content") or ""
                if (piece or thought) and ttft is None:
                    ttft = time.perf_counter() - start
                content.append(piece)
                reasoning.append(thought)
                finish = choice.get("finish_reason") or finish
    total = time.perf_counter() - start
    answer = "".join(content).strip()
    ok = bool(answer) and ttft is not None
    return SmokeResult("chat", ok, answer if ok else "the stream carried no tokens", ttft, total,
                       {"reasoning": "".join(reasoning), "finish_reason": finish})


def chat_once(client: httpx.Client, base: str, body: dict) -> tuple[dict | None, float, str]:
    start = time.perf_counter()
    response = client.post(f"{base}/v1/chat/completions", json=body)
    total = time.perf_counter() - start
    if response.status_code != 200:
        return None, total, f"HTTP {response.status_code}: {response.text[:300]}"
    return response.json(), total, ""


def run_smoke(base: str, reasoning: bool, tools: bool, timeout: float = 600.0,
              model: str | None = None) -> list[SmokeResult]:
    """`model`: the workers' served name when they set one (a router may list it as "unknown")."""
    results: list[SmokeResult] = []
    with httpx.Client(timeout=timeout) as client:
        try:
            model = model or discover_model(client, base)
        except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
            return [SmokeResult("models", False, f"GET {base}/v1/models failed: {exc}")]
        messages = [{"role": "user", "content": "Briefly explain: what is SGLang?"}]
        results.append(chat_stream(client, base, {"model": model, "messages": messages, "max_tokens": 64}))
        if not results[-1].ok:
            return results  # the other checks would fail the same way (or on a breaker the failure opened)
        if reasoning:
            body, total, problem = chat_once(client, base, {"model": model, "messages": messages, "max_tokens": 64,
                                                             "reasoning_effort": "low"})
            thought = (body or {}).get("choices", [{}])[0].get("message", {}).get("reasoning_content")
            results.append(SmokeResult("reasoning", bool(thought), problem or (
                f"reasoning_content: {thought[:60]!r}" if thought else "no reasoning_content in the answer"),
                total=total))
        if tools:
            ask = [{"role": "user", "content": "Use get_weather to check the weather in Beijing in Celsius."}]
            body, total, problem = chat_once(client, base, {"model": model, "messages": ask, "tools": [WEATHER_TOOL],
                                                             "tool_choice": "auto", "max_tokens": 64})
            choice = (body or {}).get("choices", [{}])[0]
            calls = choice.get("message", {}).get("tool_calls") or []
            ok = bool(calls) and choice.get("finish_reason") == "tool_calls"
            detail = problem or (f"{calls[0]['function']['name']}({calls[0]['function']['arguments']})" if ok
                                 else f"no tool call (finish_reason {choice.get('finish_reason')!r})")
            results.append(SmokeResult("tool call", ok, detail, total=total))
    return results
