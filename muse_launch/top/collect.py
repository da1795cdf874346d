"""`top`'s numbers: each role's own Prometheus metrics, read every interval, and the rates between two reads.

A number the backend does not give is None with the reason beside it ("n/a" on screen, null in JSON),
never 0: an engine without /metrics, a rank that serves no HTTP, a metric the engine does not have, a
rate before the second read or across a counter that went back (a restart).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx

from muse_launch.engines import ROUTER_ENGINES
from muse_launch.engines.metrics import ENGINE_METRICS, METRICS_PATH, ROUTER_METRICS
from muse_launch.rundir.state import DeploymentRecord, RoleRecord

from .prom import FetchError, Parsed, fetch, parse

# Inter-token latency histograms (seconds), where the engine has one: vLLM's newer name, its older
# (time per output token), SGLang's. The simulated engine serves the same names.
ITL_HISTOGRAMS = {
    "vllm": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    "sglang": ("sglang:inter_token_latency_seconds",),
}
QUANTILES = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))

# The sample names read of each engine and router: the rest of an answer is skipped unparsed.
WANTED = {
    **{
        e: frozenset(
            (
                m.running,
                m.queued,
                m.kv_usage,
                m.prompt_tokens,
                m.generation_tokens,
                f"{m.ttft}_sum",
                f"{m.ttft}_count",
                f"{m.ttft}_bucket",
                *(f"{h}_bucket" for h in ITL_HISTOGRAMS.get(e, ())),
            )
        )
        for e, m in ENGINE_METRICS.items()
    },
    **{r: frozenset(n for n in (*m.load, m.health, m.requests) if n) for r, m in ROUTER_METRICS.items()},
}


@dataclass(frozen=True)
class Reading:
    """One role's metrics at one moment; `error` says why there are none."""

    at: float
    url: str | None
    values: Mapping[str, float | None] = field(default_factory=dict)
    workers: Mapping[str, Mapping[str, float | None]] = field(default_factory=dict)  # a router's, by URL
    error: str | None = None
    histograms: Mapping[str, Mapping[float, float]] = field(default_factory=dict)  # "ttft"/"itl": le -> count


def metrics_url(role: RoleRecord) -> tuple[str | None, str | None]:
    """Where the role's metrics are, or why it has none."""
    if role.engine in ROUTER_ENGINES:
        port = role.ports.get("metrics")
        return (
            (f"http://{_host(role.probe_host)}:{port}{METRICS_PATH}", None)
            if port
            else (None, "no metrics port")
        )
    if role.engine not in ENGINE_METRICS:
        return None, f"{role.engine or role.kind} exposes no metrics"
    port = role.ports.get("http")
    if not port:
        return None, "serves no HTTP (a node rank past 0)"
    return f"http://{_host(role.probe_host)}:{port}{METRICS_PATH}", None


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def read_role(role: RoleRecord, client: httpx.Client, clock=time.monotonic) -> Reading:
    url, why = metrics_url(role)
    if url is None:
        return Reading(clock(), None, error=why)
    if not role.live:  # (on SLURM a live role has no process of this host's)
        return Reading(clock(), url, error=f"not running ({role.state.value})")
    try:
        text = fetch(client, url)
    except FetchError as exc:
        hint = ENGINE_METRICS[role.engine].needs_flag if role.engine in ENGINE_METRICS else None
        if str(exc) == "HTTP 404" and hint:
            return Reading(clock(), url, error=f"no /metrics: {role.engine} serves it with {hint}")
        return Reading(clock(), url, error=f"metrics: {exc}")
    parsed = parse(text, WANTED.get(role.engine))
    if role.engine in ROUTER_METRICS:
        return Reading(
            clock(), url, values=_router_values(parsed, role.engine), workers=_workers(parsed, role.engine)
        )
    return Reading(
        clock(), url, values=_engine_values(parsed, role.engine), histograms=_histograms(parsed, role.engine)
    )


def _buckets(parsed: Parsed, name: str) -> dict[float, float]:
    """A histogram's cumulative counts by upper bound, summed over its label sets (DP engines, ranks)."""
    out: dict[float, float] = {}
    for s in parsed.samples:
        if s.name == name and "le" in s.labels:
            try:
                bound = float(s.labels["le"])
            except ValueError:
                continue
            out[bound] = out.get(bound, 0.0) + s.value
    return out


def _histograms(parsed: Parsed, engine: str) -> dict[str, dict[float, float]]:
    out = {"ttft": _buckets(parsed, f"{ENGINE_METRICS[engine].ttft}_bucket")}
    for name in ITL_HISTOGRAMS.get(engine, ()):
        found = _buckets(parsed, f"{name}_bucket")
        if found:
            out["itl"] = found
            break
    return {k: v for k, v in out.items() if v}


def quantile(q: float, buckets: Mapping[float, float]) -> float | None:
    """Prometheus's histogram_quantile: linear within the bucket the q-th observation falls in; None with no
    observation. The +Inf bucket's share is given its lower bound (as Prometheus does)."""
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] <= 0:
        return None
    total = buckets[bounds[-1]]
    rank = q * total
    prev_bound, prev_count = 0.0, 0.0
    for b in bounds:
        count = buckets[b]
        if count >= rank:
            if math.isinf(b):
                return prev_bound
            if count == prev_count:
                return b
            return prev_bound + (b - prev_bound) * (rank - prev_count) / (count - prev_count)
        prev_bound, prev_count = b, count
    return prev_bound


def window_quantiles(now: Reading, before: Reading | None, key: str) -> dict[str, float | None] | None:
    """p50/p90/p99 (seconds) of the observations made between two readings (the counts' difference); None
    where the engine gives no such histogram or before the second reading; values None with no new one."""
    if before is None or before.error or now.error:
        return None
    a, b = before.histograms.get(key), now.histograms.get(key)
    if not b:
        return None
    a = a or {}
    delta = {le: c - a.get(le, 0.0) for le, c in b.items()}
    if any(v < 0 for v in delta.values()):  # a counter went back: the engine restarted
        return None
    return {name: quantile(q, delta) for name, q in QUANTILES}


def _sum(parsed: Parsed, name: str) -> float | None:
    values = parsed.values(name)
    return sum(values) if values else None


def _mean(parsed: Parsed, name: str) -> float | None:
    values = parsed.values(name)
    return sum(values) / len(values) if values else None


def _engine_values(parsed: Parsed, engine: str) -> dict[str, float | None]:
    names = ENGINE_METRICS[engine]
    return {
        "running": _sum(parsed, names.running),
        "queued": _sum(parsed, names.queued),
        "kv_cache_usage": _mean(parsed, names.kv_usage),  # one sample per DP engine or rank: their mean
        "prompt_tokens": _sum(parsed, names.prompt_tokens),
        "generation_tokens": _sum(parsed, names.generation_tokens),
        "ttft_sum": _sum(parsed, f"{names.ttft}_sum"),
        "ttft_count": _sum(parsed, f"{names.ttft}_count"),
    }


def _router_values(parsed: Parsed, engine: str) -> dict[str, float | None]:
    names = ROUTER_METRICS[engine]
    return {"requests": _sum(parsed, names.requests) if names.requests else None}


def _workers(parsed: Parsed, engine: str) -> dict[str, dict[str, float | None]]:
    names = ROUTER_METRICS[engine]
    load: dict[str, float] = {}
    for metric in names.load:
        for url, value in parsed.by_label(metric, names.worker_label).items():
            load[url.rstrip("/")] = load.get(url.rstrip("/"), 0.0) + value
    health = parsed.by_label(names.health, names.worker_label) if names.health else {}
    urls = list(dict.fromkeys([*load, *(u.rstrip("/") for u in health)]))
    return {u: {"load": load.get(u), "healthy": health.get(u, health.get(u + "/"))} for u in urls}


def read_all(record: DeploymentRecord, client: httpx.Client, pool: ThreadPoolExecutor) -> dict[str, Reading]:
    """Every role's reading, read side by side (each bounded in time and size)."""
    futures = {r.name: pool.submit(read_role, r, client) for r in record.roles}
    return {name: f.result() for name, f in futures.items()}


def _rate(now: Reading, before: Reading | None, key: str) -> float | None:
    if before is None or before.error or now.error:
        return None
    a, b = before.values.get(key), now.values.get(key)
    dt = now.at - before.at
    if a is None or b is None or dt <= 0 or b < a:  # b < a: the counter went back (the role restarted)
        return None
    return (b - a) / dt


def _ttft(now: Reading, before: Reading | None) -> float | None:
    """Mean time to first token of the requests that got their first token since the last reading."""
    if before is None or before.error or now.error:
        return None
    s0, s1 = before.values.get("ttft_sum"), now.values.get("ttft_sum")
    c0, c1 = before.values.get("ttft_count"), now.values.get("ttft_count")
    if None in (s0, s1, c0, c1) or c1 <= c0 or s1 < s0:  # type: ignore[operator]
        return None
    return (s1 - s0) / (c1 - c0)  # type: ignore[operator]


def role_row(role: RoleRecord, now: Reading, before: Reading | None, health: str | None) -> dict[str, Any]:
    """One role of `top --json` (docs/top.md)."""
    v = now.values
    count_now, count_before = v.get("ttft_count"), (before.values.get("ttft_count") if before else None)
    idle = count_now is not None and count_before is not None and count_now == count_before
    row: dict[str, Any] = {
        "name": role.name,
        "kind": role.kind,
        "engine": role.engine,
        "state": role.state.value,
        "health": None if health is None else "ok" if health == "ok" else "failing",
        "health_detail": health,
        "restarts": role.restarts,
        "url": role.url,
        "metrics_url": now.url,
        "metrics_unavailable": now.error,
    }
    if role.engine in ROUTER_ENGINES:
        loads = [w.get("load") for w in now.workers.values() if w.get("load") is not None]
        row.update(
            requests_per_s=_rate(now, before, "requests"), in_flight=_int(sum(loads)) if loads else None
        )
        return row
    row.update(
        running=_int(v.get("running")),
        queued=_int(v.get("queued")),
        kv_cache_usage=v.get("kv_cache_usage"),
        prompt_tokens_per_s=_rate(now, before, "prompt_tokens"),
        generation_tokens_per_s=_rate(now, before, "generation_tokens"),
        ttft_s=_ttft(now, before),
        ttft_idle=idle,
        ttft_quantiles_s=window_quantiles(now, before, "ttft"),
        itl_quantiles_s=window_quantiles(now, before, "itl"),
        prompt_tokens_total=_int(v.get("prompt_tokens")),
        generation_tokens_total=_int(v.get("generation_tokens")),
    )
    return row


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)


def router_loads(
    record: DeploymentRecord, readings: Mapping[str, Reading], before: Mapping[str, Reading] | None = None
) -> list[dict[str, Any]]:
    """Each router's load per worker, the worker named by its role where its URL is one of ours."""
    by_url = {r.url.rstrip("/"): r.name for r in record.roles if r.url}
    out = []
    for role in record.roles:
        if role.engine not in ROUTER_ENGINES:
            continue
        reading = readings[role.name]
        workers = [
            {
                "url": url,
                "role": by_url.get(url),
                "load": _int(w.get("load")),
                "healthy": None if w.get("healthy") is None else w.get("healthy") == 1,
            }
            for url, w in reading.workers.items()
        ]
        out.append(
            {
                "router": role.name,
                "metrics_unavailable": reading.error,
                "workers": workers,
                "requests_per_s": _rate(reading, (before or {}).get(role.name), "requests"),
            }
        )
    return out


def snapshot(
    record: DeploymentRecord,
    now: Mapping[str, Reading],
    before: Mapping[str, Reading] | None,
    health: Mapping[str, str | None],
    interval: float,
) -> dict[str, Any]:
    """The whole of `top --json`: the deployment, its roles and its routers' view of their workers."""
    return {
        "name": record.name,
        "state": record.state.value,
        "interval_s": interval,
        "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "roles": [
            role_row(r, now[r.name], (before or {}).get(r.name), health.get(r.name)) for r in record.roles
        ],
        "routers": router_loads(record, now, before),
    }
