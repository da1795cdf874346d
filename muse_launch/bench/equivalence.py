"""`bench --check-equivalence REF`: the same prompts, greedily (temperature 0), to the deployment and to a
reference one (an aggregated deployment of the same model); any answer that differs fails the check.
Disaggregation must not change what the model says."""

from __future__ import annotations

from collections.abc import Callable

import httpx

from muse_launch.top.deadline import bounded_client

from .target import Target

PROMPTS = (
    "Name three primary colours.",
    "What is the capital of France?",
    "Write one sentence about the sea.",
    "Count from one to ten in words.",
    "Explain in one line what a compiler does.",
    "Give a synonym for happy.",
    "What comes after Tuesday?",
    "Describe a cat in five words.",
)
MAX_TOKENS = 32
SHOWN = 160


def prompt(i: int) -> str:
    base = PROMPTS[i % len(PROMPTS)]
    return base if i < len(PROMPTS) else f"{base} (variant {i // len(PROMPTS)})"


def greedy(client: httpx.Client, t: Target, text: str, max_tokens: int) -> tuple[str | None, str]:
    """The answer's text, or None and why it failed."""
    body = {
        "model": t.model,
        "messages": [{"role": "user", "content": text}],
        "temperature": 0,
        "top_p": 1,
        "seed": 0,
        "max_tokens": max_tokens,
        "stream": False,
    }
    try:
        r = client.post(t.url + "/v1/chat/completions", json=body)
    except httpx.HTTPError as exc:
        return None, f"{type(exc).__name__}: {exc}"
    if r.status_code != 200:
        return None, f"HTTP {r.status_code}: {r.text[:200]}"
    try:
        msg = r.json()["choices"][0]["message"]
    except (ValueError, KeyError, IndexError, TypeError):
        return None, f"not an OpenAI chat answer: {r.text[:200]}"
    return str(msg.get("content") or "") + str(msg.get("reasoning_content") or ""), ""


def check_against(
    target: Target, reference: Target, count: int, osl: int, echo: Callable[[str], None]
) -> int:
    max_tokens = min(osl, MAX_TOKENS)
    echo(
        f"equivalence: {count} prompts, temperature 0, {max_tokens} tokens, {target.name} ({target.url}) "
        "against "
        f"{reference.name} ({reference.url})"
    )
    differ = 0
    with bounded_client(600.0, timeout=600.0) as client:
        for i in range(count):
            text = prompt(i)
            got, why = greedy(client, target, text, max_tokens)
            want, why_ref = greedy(client, reference, text, max_tokens)
            if got is None or want is None:
                differ += 1
                echo(
                    f"  FAIL {i + 1}: {text!r}: {target.name if got is None else reference.name}: "
                    f"{why or why_ref}"
                )
            elif got != want:
                differ += 1
                echo(
                    f"  FAIL {i + 1}: {text!r}\n        {target.name}: {got[:SHOWN]!r}\n"
                    f"        {reference.name}: {want[:SHOWN]!r}"
                )
            else:
                echo(f"  ok   {i + 1}: {text!r}: {got[:60]!r}")
    if differ:
        echo(f"NOT equivalent: {differ} of {count} answers differ")
        return 1
    echo(f"equivalent: {count} of {count} answers identical")
    return 0
