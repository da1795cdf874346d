"""A steady, bounded load through a router while a test changes the deployment: N concurrent streaming
chats, each started as soon as the last one of its lane ended, every answer checked. A request fails on
anything but HTTP 200, a stream that breaks or ends without `data: [DONE]`, an SSE `{"error": ...}` event
(smg ends a cut stream with one and then `[DONE]`: a client that checks only `[DONE]` counts it as a
success), no content (unless `need_content` is off: a tiny model with random weights may answer only
tokens that decode to nothing), or no finish_reason.

    with SteadyLoad("http://127.0.0.1:8000", model) as load:
        ...change the deployment...
        load.wait_for(5)  # at least 5 more requests have ended
    assert load.failures == [] and load.ok > 0
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field

import httpx

CONCURRENCY = 4
MAX_TOKENS = 24


@dataclass
class SteadyLoad:
    url: str
    model: str
    concurrency: int = CONCURRENCY
    max_tokens: int = MAX_TOKENS
    headers: dict[str, str] = field(default_factory=dict)
    need_content: bool = True  # off for a model with random weights: an empty text is then no failure
    ok: int = 0
    failures: list[str] = field(default_factory=list)
    longest_s: float = 0.0  # the longest successful request, start to last byte
    failed_began: list[float] = field(default_factory=list)  # when each failed request began (monotonic)
    ended: list[tuple[float, float, bool]] = field(default_factory=list)  # (began, first byte, ok) for each

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._lane, args=(i,), daemon=True, name=f"load-{i}")
            for i in range(self.concurrency)
        ]

    def __enter__(self) -> SteadyLoad:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def done(self) -> int:
        with self._lock:
            return self.ok + len(self.failures)

    def stop(self) -> None:
        """Stop starting requests; the ones in flight end (and are checked) first."""
        self._stop.set()
        for thread in self._threads:
            thread.join(120)

    def wait_for(self, more: int, timeout: float = 120.0) -> None:
        """Until `more` requests beyond those ended now have ended."""
        target = self.done + more
        deadline = time.monotonic() + timeout
        while self.done < target:
            if time.monotonic() > deadline:
                raise AssertionError(f"the load ended {self.done}, not {target}, in {timeout:g}s")
            time.sleep(0.05)

    def _lane(self, lane: int) -> None:
        with httpx.Client(timeout=httpx.Timeout(60.0, connect=10.0)) as client:
            n = 0
            while not self._stop.is_set():
                n += 1
                began = time.monotonic()
                first: list[float] = []
                problem = self._one(client, f"lane {lane} request {n}: say something", first)
                took = time.monotonic() - began
                with self._lock:
                    self.ended.append((began, first[0] if first else float("nan"), not problem))
                    if problem:
                        self.failures.append(f"lane {lane} #{n}: {problem}")
                        self.failed_began.append(began)
                    else:
                        self.ok += 1
                        self.longest_s = max(self.longest_s, took)

    def _one(self, client: httpx.Client, prompt: str, first: list[float]) -> str | None:
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": self.max_tokens,
            "stream": True,
        }
        try:
            with client.stream(
                "POST", f"{self.url}/v1/chat/completions", json=body, headers=self.headers
            ) as answer:
                if answer.status_code != 200:
                    return f"HTTP {answer.status_code}: {answer.read()[:200]!r}"
                return check_stream(_noting_first(answer.iter_lines(), first), self.need_content)
        except httpx.HTTPError as exc:
            return f"{type(exc).__name__}: {exc}"


def _noting_first(lines, first: list[float]):
    """`lines`, noting when the first token's event came (its time to first token)."""
    for line in lines:
        if not first and '"content"' in line:
            first.append(time.monotonic())
        yield line


def check_stream(lines, need_content: bool = True) -> str | None:
    """None for a whole, good chat stream; else what is wrong with it."""
    content, finished, done = "", None, False
    for line in lines:
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            done = True
            continue
        try:
            event = json.loads(payload)
        except ValueError:
            return f"an event that is not JSON: {payload[:100]!r}"
        if not isinstance(event, dict) or "error" in event:
            return f"an error event: {payload[:200]}"
        for choice in event.get("choices") or []:
            content += (choice.get("delta") or {}).get("content") or ""
            finished = choice.get("finish_reason") or finished
    if not done:
        return "the stream ended without [DONE]"
    if not content and need_content:
        return "no content"
    if not finished:
        return "no finish_reason"
    return None
