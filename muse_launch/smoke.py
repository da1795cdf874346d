"""`smoke`: one chat completion through the router, plus reasoning and tool-call checks where on.

The model is the one the router lists at /v1/models (a worker's `--served-model-name` is what it
reports there), so the request names what the deployment really serves. A deployment that is
gone (stopped, its router not answering, dying mid-check) fails with a message and exit 1.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import httpx

from muse_launch.bounded_json import load_answer
from muse_launch.printable import one_line

if TYPE_CHECKING:
    from muse_launch.rundir.state import DeploymentRecord, RoleRecord

SMOKE_FAILURE_CHARS = 800  # a failure is shown at length; a success in one line
PLACEHOLDER_MODELS = {"", "unknown", "default"}  # what a router lists for a worker it knows no name of

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
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


def served_models(client: httpx.Client, base: str) -> list[str]:
    """The model ids the router lists, in its order (raises httpx.HTTPError, ValueError, KeyError)."""
    response = client.get(f"{base}/v1/models")
    response.raise_for_status()
    return [str(m["id"]) for m in load_answer(response.content)["data"]]


def _named(listed: list[str]) -> list[str]:
    return [m for m in listed if m.strip().lower() not in PLACEHOLDER_MODELS]


def list_models(
    client: httpx.Client, base: str, workers: tuple[str, ...] = (), declared: tuple[str, ...] = ()
) -> tuple[str | None, SmokeResult]:
    """The model to ask for, and the check's line saying who reported it.

    The router's /v1/models first. A router that knows no name for its workers lists a placeholder
    (sglang-router in front of vLLM lists "unknown", though the request is routed by the name vLLM
    serves): then the workers' own /v1/models (`workers`: their base URLs), then the names their
    argv declares (`declared`: `--served-model-name`). A router that does not answer fails the check.
    """
    start = time.perf_counter()
    try:
        listed = served_models(client, base)
    except httpx.TransportError as exc:
        return None, SmokeResult(
            "models",
            False,
            f"nothing answers at {base} ({type(exc).__name__}: "
            f"{exc or 'no reply'}); is the deployment still up?",
            total=time.perf_counter() - start,
        )
    except httpx.HTTPStatusError as exc:
        return None, SmokeResult(
            "models",
            False,
            f"GET {base}/v1/models: HTTP {exc.response.status_code}: {exc.response.text[:300]}",
            total=time.perf_counter() - start,
        )
    except (httpx.HTTPError, KeyError, IndexError, TypeError, ValueError) as exc:
        return None, SmokeResult(
            "models",
            False,
            f"GET {base}/v1/models: not an OpenAI model list ({exc!r})",
            total=time.perf_counter() - start,
        )
    named = _named(listed)
    if named:
        others = f" (also listed: {', '.join(named[1:])})" if len(named) > 1 else ""
        return named[0], SmokeResult("models", True, f"{named[0]}{others}", total=time.perf_counter() - start)
    router_says = (
        f"the router lists {', '.join(map(repr, listed))}" if listed else "the router lists no model"
    )
    for worker in workers:
        try:
            from_worker = _named(served_models(client, worker))
        except (httpx.HTTPError, KeyError, IndexError, TypeError, ValueError):
            continue
        if from_worker:
            return from_worker[0], SmokeResult(
                "models",
                True,
                f"{from_worker[0]} (as {worker} serves it; {router_says})",
                total=time.perf_counter() - start,
            )
    if declared:
        return declared[0], SmokeResult(
            "models",
            True,
            f"{declared[0]} (--served-model-name; {router_says}, no worker answered)",
            total=time.perf_counter() - start,
        )
    return None, SmokeResult(
        "models",
        False,
        f"{router_says} at /v1/models and no worker names its model",
        total=time.perf_counter() - start,
    )


def chat_stream(client: httpx.Client, base: str, body: dict) -> SmokeResult:
    """Stream one chat completion; time to the first token and in total."""
    start = time.perf_counter()
    ttft = None
    content, reasoning, finish = [], [], None
    with client.stream("POST", f"{base}/v1/chat/completions", json={**body, "stream": True}) as response:
        if response.status_code != 200:
            response.read()
            return SmokeResult(
                "chat",
                False,
                f"HTTP {response.status_code}: {response.text[:300]}",
                total=time.perf_counter() - start,
            )
        for line in response.iter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            chunk = load_answer(data)
            if "error" in chunk:
                return SmokeResult(
                    "chat", False, f"error in stream: {chunk['error']}", total=time.perf_counter() - start
                )
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
    return SmokeResult(
        "chat",
        ok,
        answer if ok else "the stream carried no tokens",
        ttft,
        total,
        {"reasoning": "".join(reasoning), "finish_reason": finish},
    )


def chat_once(client: httpx.Client, base: str, body: dict) -> tuple[dict | None, float, str]:
    start = time.perf_counter()
    response = client.post(f"{base}/v1/chat/completions", json=body)
    total = time.perf_counter() - start
    if response.status_code != 200:
        return None, total, f"HTTP {response.status_code}: {response.text[:300]}"
    return load_answer(response.content), total, ""


REQUEST_ERRORS = (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError)  # gone, or not OpenAI's shape


def attempt(check: str, request: Callable[[], SmokeResult]) -> SmokeResult:
    """One check; a router that stops answering or answers nonsense fails it instead of raising."""
    start = time.perf_counter()
    try:
        return request()
    except REQUEST_ERRORS as exc:
        gone = " (is the deployment still up?)" if isinstance(exc, httpx.TransportError) else ""
        return SmokeResult(
            check,
            False,
            f"{type(exc).__name__}: {exc or 'no reply'}{gone}",
            total=time.perf_counter() - start,
        )


class FrontAuth(httpx.Auth):
    """The router's own key (`Authorization: Bearer`) on requests to the router, and to no one else."""

    def __init__(self, base: str, headers: dict[str, str]):
        self.base = base.rstrip("/") + "/"
        self.headers = headers

    def auth_flow(self, request: httpx.Request):
        if str(request.url).startswith(self.base):
            request.headers.update(self.headers)
        yield request


def run_smoke(
    base: str,
    reasoning: bool,
    tools: bool,
    timeout: float = 600.0,
    workers: tuple[str, ...] = (),
    declared: tuple[str, ...] = (),
    headers: dict[str, str] | None = None,
) -> list[SmokeResult]:
    """The checks in order: the model the deployment reports (list_models), a streamed chat, then
    reasoning and a tool call. `headers`: what the front router wants on each request (its API key)."""
    from muse_launch.top.deadline import bounded_client

    # each answer whole within `timeout`, however the router trickles it; role URLs are plain HTTP: no CA
    auth = FrontAuth(base, headers or {})
    with bounded_client(timeout, timeout=timeout, auth=auth) as client:
        model, listed = list_models(client, base, workers, declared)
        if model is None:
            return [listed]
        messages = [{"role": "user", "content": "Briefly explain: what is SGLang?"}]
        results = [
            listed,
            attempt(
                "chat",
                lambda: chat_stream(client, base, {"model": model, "messages": messages, "max_tokens": 64}),
            ),
        ]
        if not results[-1].ok:
            return results  # the other checks would fail the same way (or on a breaker the failure opened)
        if reasoning:
            results.append(attempt("reasoning", lambda: reasoning_check(client, base, model, messages)))
        if tools:
            results.append(attempt("tool call", lambda: tool_call_check(client, base, model)))
    return results


def reasoning_check(client: httpx.Client, base: str, model: str, messages: list[dict]) -> SmokeResult:
    body, total, problem = chat_once(
        client, base, {"model": model, "messages": messages, "max_tokens": 64, "reasoning_effort": "low"}
    )
    thought = (body or {}).get("choices", [{}])[0].get("message", {}).get("reasoning_content")
    return SmokeResult(
        "reasoning",
        bool(thought),
        problem
        or (f"reasoning_content: {thought[:60]!r}" if thought else "no reasoning_content in the answer"),
        total=total,
    )


def tool_call_check(client: httpx.Client, base: str, model: str) -> SmokeResult:
    ask = [{"role": "user", "content": "Use get_weather to check the weather in Beijing in Celsius."}]
    body, total, problem = chat_once(
        client,
        base,
        {"model": model, "messages": ask, "tools": [WEATHER_TOOL], "tool_choice": "auto", "max_tokens": 64},
    )
    choice = (body or {}).get("choices", [{}])[0]
    calls = choice.get("message", {}).get("tool_calls") or []
    ok = bool(calls) and choice.get("finish_reason") == "tool_calls"
    detail = problem or (
        f"{calls[0]['function']['name']}({calls[0]['function']['arguments']})"
        if ok
        else f"no tool call (finish_reason {choice.get('finish_reason')!r})"
    )
    return SmokeResult("tool call", ok, detail, total=total)


def front_headers(front: RoleRecord, environ: Mapping[str, str]) -> tuple[dict[str, str], str | None]:
    """The router's API key as state.json gives it (`${env:NAME}`, resolved here in this environment, as `up`
    resolved it), and what is missing to send it: (headers, problem)."""
    from muse_launch.engines import router
    from muse_launch.topology.load import ENV_REF

    if front.api_key is None:
        return {}, None
    unset = [name for name in ENV_REF.findall(front.api_key) if name not in environ]
    if unset:
        return {}, (
            f"{front.name} was started with --api-key from ${{env:{unset[0]}}}, which is not set "
            f"here: export {unset[0]}=... as for `up`, then smoke again"
        )
    key = ENV_REF.sub(lambda m: environ[m.group(1)], front.api_key)
    return router.auth_headers([router.API_KEY, key]), None


def smoke_record(
    record: DeploymentRecord, timeout: float, echo: Callable[[str], None], as_json: bool = False
) -> int:
    """The checks through the record's front role, as its URLs say (on Kubernetes: the pods' addresses);
    `as_json`: one JSON document at the end instead of a line per check (docs/status-json.md)."""
    from muse_launch.engines import WORKER
    from muse_launch.engines.argv import last_value
    from muse_launch.errors import RuntimeFailure, UsageError
    from muse_launch.rundir.lifecycle import DeploymentState
    from muse_launch.rundir.role_addresses import explain_addresses

    if record.state is DeploymentState.STOPPED:
        raise RuntimeFailure(
            f"deployment {record.name!r} is not running: no role of it is alive",
            fix=f"muse-launch up {record.source} -d",
        )
    front = next(iter(record.entry_roles()), None)
    if front is None or front.kind == "command":
        raise UsageError(f"{record.name} has no router or worker with a URL to send a request to")
    workers = [r for r in record.roles if r.kind in ("decode", "worker", "prefill")]
    readers = [(WORKER[r.engine], r.argv) for r in workers if r.engine in WORKER]
    reasoning = any(engine.reasoning(argv) for engine, argv in readers)
    tools = any(engine.tool_calls(argv) for engine, argv in readers)
    behind = tuple(r.url.replace("0.0.0.0", "127.0.0.1") for r in workers if r.url and r is not front)
    # argv starts with the launcher: read the flag only, not the engine's positional model
    declared = tuple(name for engine, argv in readers if (name := last_value(argv, engine.SERVED_MODEL_NAME)))
    base = front.url.replace("0.0.0.0", "127.0.0.1")
    headers, no_key = front_headers(front, os.environ)
    results = run_smoke(base, reasoning, tools, timeout, behind, declared, headers)
    failures = "\n".join(r.detail for r in results if not r.ok)
    where = explain_addresses(failures, record)  # the roles behind the addresses in the errors
    ok = bool(results) and all(r.ok for r in results)
    if as_json:
        checks = [
            {
                "check": r.check,
                "ok": r.ok,
                "ttft_ms": None if r.ttft is None else round(r.ttft * 1000, 1),
                "total_ms": round(r.total * 1000, 1),
                "detail": one_line(r.detail)[: 160 if r.ok else SMOKE_FAILURE_CHARS],
            }
            for r in results
        ]
        doc = {"name": record.name, "through": front.name, "url": base, "ok": ok, "checks": checks}
        echo(json.dumps({**doc, "note": no_key, "where": list(where)}, indent=2))
        return 0 if ok else 1
    echo(f"{record.name}: smoke through {front.name} at {base} ({front.state.value})")
    if no_key:
        echo(f"  note: {no_key}")
    for result in results:
        timing = f"ttft {result.ttft * 1000:.0f} ms, " if result.ttft is not None else ""
        mark = "ok  " if result.ok else "FAIL"
        detail = one_line(result.detail)
        detail = detail[:160] if result.ok else detail[:SMOKE_FAILURE_CHARS]
        echo(f"  {mark} {result.check:<10} {timing}total {result.total * 1000:.0f} ms  {detail}")
    for line in where:
        echo(f"  where: {line}")
    if failures:
        echo(
            f"  fix: `muse-launch status {record.name}` shows each role's health; "
            f"`muse-launch logs {record.name} {front.name}` its log"
        )
    return 0 if ok else 1
