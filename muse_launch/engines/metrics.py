"""The Prometheus metrics each engine and router exposes, by their own names, written once: `top` reads them
and the simulated engine exposes them.

SGLang 0.5 (python/sglang/srt/metrics/collector.py) at GET /metrics of its HTTP port, with
`--enable-metrics` only (404 without); vLLM 0.33 (vllm/v1/metrics/loggers.py) at GET /metrics always, a
sample per DP engine (`engine="N"`). The routers serve theirs on a port of their own (`--prometheus-port`,
engines/router.py): sglang-router 0.3.2 and smg 1.13 as `smg_*`, vllm-router 0.1.17 as `vllm_router_*`.
"""

from __future__ import annotations

from dataclasses import dataclass

METRICS_PATH = "/metrics"


@dataclass(frozen=True)
class EngineMetrics:
    running: str  # gauge: requests running now
    queued: str  # gauge: requests waiting to be scheduled
    kv_usage: str  # gauge, 0..1: the KV cache in use
    prompt_tokens: str  # counter: prompt (prefill) tokens processed
    generation_tokens: str  # counter: tokens generated
    ttft: str  # histogram (seconds): time to first token; samples NAME_sum, NAME_count, NAME_bucket
    needs_flag: str | None = None  # the flag without which the engine serves no /metrics
    # Where its scheduler says its load itself: SGLang 0.5.23's GET /v1/loads, `{"loads": [...]}` with one
    # entry per DP rank, `num_running_reqs` (until the last token) and `num_waiting_reqs`. Asked of the
    # scheduler at each call: answered at once when idle, no answer while the scheduler hangs. Its /metrics
    # gauges are set only when a batch runs: an idle prefill keeps its last batch's running count.
    load_path: str | None = None


SGLANG = EngineMetrics(
    running="sglang:num_running_reqs",
    queued="sglang:num_queue_reqs",
    kv_usage="sglang:token_usage",
    prompt_tokens="sglang:prompt_tokens_total",
    generation_tokens="sglang:generation_tokens_total",
    ttft="sglang:time_to_first_token_seconds",
    needs_flag="--enable-metrics",
    load_path="/v1/loads",
)
VLLM = EngineMetrics(
    running="vllm:num_requests_running",
    queued="vllm:num_requests_waiting",
    kv_usage="vllm:kv_cache_usage_perc",
    prompt_tokens="vllm:prompt_tokens_total",
    generation_tokens="vllm:generation_tokens_total",
    ttft="vllm:time_to_first_token_seconds",
)
ENGINE_METRICS = {"sglang": SGLANG, "vllm": VLLM}


@dataclass(frozen=True)
class RouterMetrics:
    worker_label: str  # the label naming the worker (its URL)
    load: tuple[str, ...]  # gauges per worker: requests it has in flight, summed
    health: str | None = None  # gauge per worker: 1 healthy, 0 not
    requests: str | None = None  # counter: requests the router took


SMG = RouterMetrics(
    worker_label="worker",
    load=("smg_worker_requests_active",),
    health="smg_worker_health",
    requests="smg_router_requests_total",
)
ROUTER_METRICS = {
    "sglang-router": SMG,
    "smg": SMG,
    # In PD mode it counts the decode side only; prefills show no load.
    "vllm-router": RouterMetrics(worker_label="worker", load=("vllm_router_pd_active_decode_requests",)),
}
