"""GET /metrics of the simulated engine: the metric names SGLang and vLLM expose (engines/metrics.py), with
values from the simulated engine's own live counters, in Prometheus' text format.

What is counted, and where:

* running: requests in flight on a generation endpoint, from arrival until the last byte of the answer
  (a stream counts until it ends, as SGLang and vLLM count a request until its last token);
* queued: the engine's waiting requests (`requests_waiting`, 0 where the simulated engine admits at once);
* prompt and generation tokens: counted by the generation endpoints through :meth:`SimMetrics.count` once
  a request's output is known;
* time to first token: arrival to the first byte of the answer (a stream's first chunk), as a histogram;
* inter-token latency: each decode step after the first token, as a histogram (SGLang's and vLLM's names);
* KV cache use: the prompt and output tokens of the requests in flight, over the token capacity the
  simulated engine reports (`max_total_num_tokens`).
"""

from __future__ import annotations

import contextvars
import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from aiohttp import web

from ..engines.metrics import ENGINE_METRICS, METRICS_PATH, SGLANG

if TYPE_CHECKING:
    from .server import SimEngine

GENERATION_PATHS = ("/v1/chat/completions", "/v1/completions", "/generate")
KV_CAPACITY_TOKENS = 1 << 20  # the `max_total_num_tokens` its /server_info reports
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)  # vLLM's
ITL_BUCKETS = (
    0.002,
    0.004,
    0.006,
    0.008,
    0.01,
    0.015,
    0.02,
    0.025,
    0.03,
    0.035,
    0.04,
    0.06,
    0.08,
    0.1,
    0.2,
    0.4,
    0.6,
    0.8,
    1.0,
    2.0,
    4.0,
    6.0,
    8.0,
)  # SGLang's (vLLM's start at 10 ms: too coarse for the simulated engine's milliseconds)
ITL_HISTOGRAMS = {
    "sglang": "sglang:inter_token_latency_seconds",
    "vllm": "vllm:inter_token_latency_seconds",
}
_Key = getattr(web, "RequestKey", None)  # aiohttp >= 3.13 (a plain string before)
_STARTED = (
    _Key("muse_sim_metrics_started", float) if _Key else "muse_sim_metrics_started"
)  # arrival, monotonic
_FIRST_BYTE = _Key("muse_sim_metrics_first_byte", bool) if _Key else "muse_sim_metrics_first_byte"
_request_tokens: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar(
    "muse_sim_tokens", default=None
)


@dataclass
class Histogram:
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.buckets)

    def observe(self, value: float) -> None:
        self.total += value
        self.count += 1
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1


@dataclass
class SimMetrics:
    running: int = 0
    resident_tokens: int = 0  # prompt + output tokens of the requests in flight
    prompt_tokens: int = 0
    generation_tokens: int = 0
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    itl: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS))  # each token after the first

    def count(self, prompt_tokens: int, generation_tokens: int) -> None:
        """One request's tokens, once its output is known; they stay resident while it runs."""
        self.prompt_tokens += prompt_tokens
        self.generation_tokens += generation_tokens
        held = _request_tokens.get()
        if held is not None:
            held[0] += prompt_tokens + generation_tokens
            self.resident_tokens += prompt_tokens + generation_tokens


def install(app: web.Application, engine: SimEngine) -> None:
    """GET /metrics, and the middleware and response hook that keep the counters, on `app`."""
    metrics = engine.metrics = getattr(engine, "metrics", None) or SimMetrics()
    engine.batch.on_step = metrics.itl.observe

    @web.middleware
    async def track(request: web.Request, handler):
        if request.method != "POST" or request.path not in GENERATION_PATHS:
            return await handler(request)
        request[_STARTED] = time.monotonic()
        held = [0]
        reset = _request_tokens.set(held)
        metrics.running += 1
        try:
            return await handler(request)
        finally:
            metrics.running -= 1
            metrics.resident_tokens -= held[0]
            _request_tokens.reset(reset)

    async def first_byte(request: web.Request, response: web.StreamResponse) -> None:
        started = request.get(_STARTED)
        if started is not None and not request.get(_FIRST_BYTE) and response.status < 400:
            request[_FIRST_BYTE] = True
            metrics.ttft.observe(time.monotonic() - started)

    async def serve(request: web.Request) -> web.Response:
        return web.Response(
            text=exposition(engine),
            content_type="text/plain",
            charset="utf-8",
            headers={"X-Content-Type-Options": "nosniff"},
        )

    app.middlewares.append(track)
    app.on_response_prepare.append(first_byte)
    app.router.add_get(METRICS_PATH, serve)


def label_value(text: str) -> str:
    """A label value in the text format: backslash, quote and newline escaped."""
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    return "+Inf" if value == math.inf else repr(float(value))


def exposition(engine: SimEngine) -> str:
    """The engine's metrics in the text format its real counterpart uses (names, labels, HELP and TYPE)."""
    cfg, m = engine.cfg, engine.metrics
    names = ENGINE_METRICS.get(cfg.engine, SGLANG)
    labels = f'model_name="{label_value(cfg.served_model_name or "")}"'
    if cfg.engine == "vllm":
        labels = f'engine="0",{labels}'  # one sample per DP engine; vllm-router counts them
    out: list[str] = []

    def metric(name: str, kind: str, doc: str, value: float) -> None:
        out.extend((f"# HELP {name} {doc}", f"# TYPE {name} {kind}", f"{name}{{{labels}}} {_number(value)}"))

    n = engine.batch.counters  # running until the last token, queued past max_running, tokens served
    metric(names.running, "gauge", "The number of running requests.", n.running)
    metric(
        names.queued,
        "gauge",
        "The number of requests in the waiting queue.",
        n.queued,
    )
    metric(names.kv_usage, "gauge", "The KV cache in use, 0 to 1.", m.resident_tokens / KV_CAPACITY_TOKENS)
    for name, doc, value in (
        (names.prompt_tokens, "Number of prefill tokens processed.", n.prompt_tokens_total),
        (names.generation_tokens, "Number of generation tokens processed.", n.generation_tokens_total),
    ):
        metric(name, "counter", doc, value)
    for name, doc, hist in (
        (names.ttft, "Histogram of time to first token in seconds.", m.ttft),
        (
            ITL_HISTOGRAMS.get(cfg.engine, ITL_HISTOGRAMS["sglang"]),
            "Histogram of inter-token latency in seconds.",
            m.itl,
        ),
    ):
        out.extend((f"# HELP {name} {doc}", f"# TYPE {name} histogram"))
        for bound, count in zip((*hist.buckets, math.inf), (*hist.counts, hist.count), strict=True):
            out.append(f'{name}_bucket{{{labels},le="{_number(bound)}"}} {_number(count)}')
        out.append(f"{name}_sum{{{labels}}} {_number(hist.total)}")
        out.append(f"{name}_count{{{labels}}} {_number(hist.count)}")
    out.extend(
        (
            "# HELP muse_sim_requests_total Requests the simulated engine answered.",
            "# TYPE muse_sim_requests_total counter",
            f"muse_sim_requests_total {engine.requests_served}",
        )
    )
    return "\n".join(out) + "\n"
