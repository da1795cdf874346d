"""Is a ready engine worker still alive? What the supervisor reads after ready, to take a hung worker out of
its routers before their own health checks notice, and to stop and restart it.

`/health` is no liveness signal for an engine: SGLang's runs a one-token generation, which waits behind a
long prefill. Its `/metrics` is answered by the HTTP front (vLLM's API server, SGLang's tokenizer manager),
another process than the scheduler, so it answers during the longest prefill: no answer at all is a hang
(SIGSTOP, a dead event loop). A scheduler stuck in a collective or a KV transfer leaves the front
answering; its counters tell: requests running, and no prompt or generated token counted for a while.
Where the gauges say requests are held, the scheduler's own load (SGLang's /v1/loads) is asked too: the gauges
are set only when a batch runs, so an idle SGLang prefill keeps its last batch's running count.
A router is watched the same way, on its /health: hung, it is stopped and restarted (its workers are given
to it again by the wiring).
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx

from muse_launch.engines.metrics import ENGINE_METRICS, METRICS_PATH
from muse_launch.supervise.probe import base_url
from muse_launch.supervise.workers import loaded_in_flight, running_in

LIVENESS_INTERVAL = 0.25  # how often a ready worker is asked: its removal from the routers comes within this
LIVENESS_TIMEOUT = 5.0  # an answer slower than this is no sign of life (it counts from the last one)


@dataclass(frozen=True)
class Sign:
    """What one look saw."""

    answered: bool  # its HTTP front answered (any status: a 404 /metrics without --enable-metrics too)
    running: int | None = None  # requests running or waiting, where it says
    progress: float | None = None  # prompt + generated tokens counted so far, where it says


ROUTER_LIVENESS_PATH = "/health"  # a router answers it from its own state, workers or none


def look(client: httpx.Client, engine: str, host: str, port: int, path: str = METRICS_PATH) -> Sign:
    """One look at a worker's /metrics (a router's /health); never raises."""
    try:
        answer = client.get(base_url(host, port) + path, timeout=LIVENESS_TIMEOUT)
    except httpx.HTTPError:
        return Sign(False)
    metrics = ENGINE_METRICS.get(engine)
    if answer.status_code != 200 or metrics is None or len(answer.content) > 8 << 20:
        return Sign(True)
    text = answer.text
    running = running_in(text, metrics.running)
    queued = running_in(text, metrics.queued)
    prompt = running_in(text, metrics.prompt_tokens)
    generated = running_in(text, metrics.generation_tokens)
    progress = None if prompt is None and generated is None else float((prompt or 0) + (generated or 0))
    held = None if running is None else running + (queued or 0)
    if held and metrics.load_path:
        # The gauges are set when a batch runs: an idle SGLang prefill keeps its last batch's count. Its
        # scheduler's own load answers at once when idle and not at all while it hangs (the gauges stand).
        loaded = loaded_in_flight(client, base_url(host, port), metrics.load_path, LIVENESS_TIMEOUT)
        held = held if loaded is None else loaded
    return Sign(True, held, progress)


@dataclass
class Liveness:
    """A worker's signs of life over time (monotonic seconds); `silent_for` and `stalled_for` say how long
    it has given none."""

    last_answer: float
    last_progress: float
    progress: float | None = None

    def saw(self, sign: Sign, now: float) -> None:
        if not sign.answered:
            return
        self.last_answer = now
        if sign.progress != self.progress or not sign.running:
            self.last_progress = now  # it moved, or it has nothing to do
        self.progress = sign.progress

    def silent_for(self, now: float) -> float:
        return now - self.last_answer

    def stalled_for(self, now: float) -> float:
        return now - self.last_progress
