"""The routers' shared command line (sglang-router, smg and vllm-router take the same wiring
options), its reader, and RouterEngine, the engine class of a router. Each router's own facts are in its
module: sglang_router, smg, vllm_router."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar
from urllib.parse import urlsplit

from ..readiness import Probe, ProbeKind
from ..topology.defaults import METRICS_PORT_OFFSET
from . import vllm
from .argv import has_flag, last_value, opt, values_after
from .base import Context, Engine, Instance, Rendered

PREFILL, DECODE, WORKER_URLS = "--prefill", "--decode", "--worker-urls"
WIRING = {PREFILL: "prefill", DECODE: "decode", WORKER_URLS: "workers"}  # rendered from references
HOST, PORT = "--host", "--port"
# Given a key, sglang-router and smg answer 401 on /workers and on inference without `Authorization: Bearer
# KEY` (/health and /readiness stay open); vllm-router answers its worker list either way.
API_KEY = "--api-key"
METRICS_PORT, METRICS_HOST = "--prometheus-port", "--prometheus-host"
SHADOWED = {HOST: "bind", PORT: "port", METRICS_PORT: "metrics_port"}  # rendered after `args`: the key wins
PORT_FLAGS = {"metrics": METRICS_PORT}  # port kind -> the flag of the final argv that decides it
# muse-launch restarts a dead worker on the same URL; these let the router take it back within a
# second of its being ready (scripts/bench_recovery.py: 0.7 s, against 1.7 s with the router's defaults).
RECOVERY_DEFAULTS = (
    ("--health-check-interval-secs", "1"),
    ("--health-success-threshold", "1"),
    ("--cb-timeout-duration-secs", "2"),
)
# Routers answer /health before any worker registers; /readiness waits for the workers.
READY = Probe(ProbeKind.HTTP, ("/readiness",), timeout=600.0)


@dataclass(frozen=True)
class RouterFacts:
    """What differs between the routers."""

    name: str
    default_launcher: tuple[str, ...]
    pd_flag: str
    startup_defaults: tuple[tuple[str, str], ...] = ()
    bootstrap_none: bool = True  # takes `--prefill URL none` for a prefill without a bootstrap port
    backend_flag: tuple[str, str] | None = None  # (flag, value) that points it at vLLM workers
    kv_connector_flag: str | None = None  # vllm-router: which KV hand-off protocol to drive
    # Its worker list: sglang-router 0.3.2 and smg answer {"workers": [{"url", "worker_type", "is_healthy"},
    # ...]}
    # (a worker that never registered is absent, while /readiness is 200 once one prefill and one decode are
    # in);
    # vllm-router 0.1.17 answers {"urls": [...]} at /list_workers, without health.
    workers_path: str = "/workers"
    shipped_in: str | None = None  # the worker engine whose container image carries it
    # Workers added and removed while it runs: sglang-router 0.3.2 and smg 1.13 take `POST /workers` (a JSON
    # body from `worker_entry`) and `DELETE /workers/{id}` (the id its list gives); vllm-router 0.1.17 in PD
    # mode refuses a worker added at run time (400): its set changes only by a restart with a new command
    # line.
    adds_workers: bool = True
    # On a worker's death or hang (measured with each router; docs/failover.md). The supervisor
    # takes a dead or hung worker out of a router that `adds_workers` within a liveness tick and puts it
    # back once ready; a router that cannot take it back keeps it, and relies on its own health check.
    # `retries_unstarted`: a request it sent to a worker that refused the connection goes to another (only
    # before a token streamed: a cut stream is the client's failure with every router).
    retries_unstarted: bool = True
    cut_stream: str = "breaks"  # how a stream cut by its worker's death ends: "breaks" (an incomplete
    # chunked read), "error-event" (an SSE {"error": ...} then [DONE])
    unhealthy_after_s: float | None = None  # measured: a killed worker marked unhealthy by its own check


class RouterEngine(Engine):
    """A router: the shared command line above, told apart by its RouterFacts."""

    FACTS: ClassVar[RouterFacts]
    KEY_FLAGS: ClassVar[dict[str, tuple[str, ...]]] = {}  # no topology key renders a router flag of its own
    SHADOWED = SHADOWED
    WIRING = WIRING
    PORT_FLAGS = PORT_FLAGS

    def render(self, inst: Instance, ctx: Context) -> Rendered:
        return render(inst, ctx, self.FACTS)


def auth_headers(argv: tuple[str, ...] | list[str]) -> dict[str, str]:
    """What a request to the router's worker list or inference must carry, given the command line it runs
    with (its key in clear: from the plan in memory or the live process, never from state.json)."""
    key = last_value(argv, API_KEY)
    return {"Authorization": f"Bearer {key}"} if key else {}


def listed_workers(answer: object) -> dict[str, bool]:
    """A router's worker list, either shape: URL (without a trailing slash) -> healthy."""
    if not isinstance(answer, dict):
        return {}
    if isinstance(answer.get("workers"), list):
        return {
            str(w.get("url", "")).rstrip("/"): w.get("is_healthy", True) is True
            for w in answer["workers"]
            if isinstance(w, dict)
        }
    if isinstance(answer.get("urls"), list):
        return {str(u).rstrip("/"): True for u in answer["urls"]}
    return {}


WORKER_API = "/workers"  # POST to add, DELETE WORKER_API/{id} to remove (no drain: no new requests at once)
# After a DELETE, sglang-router 0.3.2 sends the worker no new request within 0.5 s (measured): an idle count
# read on the worker before that may still be followed by one last dispatch.
REMOVAL_SETTLE_S = 0.5
ROUTED_TYPES = {"prefill": "prefill", "decode": "decode", "worker": "regular"}  # `worker_type` by kind


def worker_entry(kind: str, url: str, bootstrap_port: int | None) -> dict[str, object]:
    """The body of `POST /workers` for one worker: without `worker_type` it registers as `regular` and gets
    no PD traffic; a prefill names its KV bootstrap port."""
    entry: dict[str, object] = {"url": url, "worker_type": ROUTED_TYPES.get(kind, "regular")}
    if kind == "prefill" and bootstrap_port:
        entry["bootstrap_port"] = bootstrap_port
    return entry


def worker_ids(answer: object) -> dict[str, str]:
    """URL (without a trailing slash) -> the id `DELETE /workers/{id}` takes, from `GET /workers`."""
    if not isinstance(answer, dict) or not isinstance(answer.get("workers"), list):
        return {}
    out = {}
    for w in answer["workers"]:
        if isinstance(w, dict):
            wid = w.get("id", w.get("worker_id"))
            if isinstance(wid, str) and re.fullmatch(r"[A-Za-z0-9._:-]{1,128}", wid):
                out[str(w.get("url", "")).rstrip("/")] = wid
    return out


def render(inst: Instance, ctx: Context, facts: RouterFacts) -> Rendered:
    args: list[str] = []
    if inst.prefill or inst.decode:
        args.append(facts.pd_flag)
        for p, port in zip(inst.prefill, _prefill_bootstrap_ports(inst, ctx), strict=True):
            args += [PREFILL, p.url]
            if port or facts.bootstrap_none:
                args.append(str(port) if port else "none")
        vllm_mooncake = any(
            ctx.topology.role_engine(r) == vllm.NAME and vllm.connector_of(r) == "MooncakeConnector"
            for r in (ctx.topology.roles[n] for n in inst.role.prefill)
        )
        if facts.kv_connector_flag and vllm_mooncake:
            args += [facts.kv_connector_flag, "mooncake"]
        for d in inst.decode:
            args += [DECODE, d.url]
    elif inst.workers:
        args += [WORKER_URLS, *(w.url for w in inst.workers)]
    upstream = (*inst.prefill, *inst.decode, *inst.workers)
    if facts.backend_flag and upstream and upstream[0].engine == vllm.NAME:
        args += facts.backend_flag
    for flag, value in (*RECOVERY_DEFAULTS, *facts.startup_defaults):
        if not has_flag(inst.role.args, flag):  # the routers refuse a flag given twice
            args += [flag, value]
    args += [
        *inst.role.args,
        *opt(HOST, inst.bind),
        *opt(PORT, inst.port),
        *opt(METRICS_PORT, inst.metrics_port),
    ]
    if inst.bind != "0.0.0.0" and inst.metrics_port:
        args += [METRICS_HOST, inst.bind]  # keep metrics on the same interface as the router
    ports = {"http": inst.port, "metrics": inst.metrics_port} if inst.metrics_port else {"http": inst.port}
    return Rendered(tuple(args), ports, READY)


def default_metrics_port(port: int | None) -> int | None:
    return port + METRICS_PORT_OFFSET if port else None


def _prefill_bootstrap_ports(inst: Instance, ctx: Context) -> list[int | None]:
    """Each prefill upstream's KV bootstrap port, in order; vLLM has one only with Mooncake (NIXL needs
    none)."""
    out: list[int | None] = []
    upstream = iter(inst.prefill)
    for name in inst.role.prefill:
        role = ctx.topology.roles[name]
        for i in range(1 if role.nodes else role.replicas):
            p = next(upstream)
            if ctx.topology.role_engine(role) != vllm.NAME:
                out.append(p.bootstrap_port)
            elif vllm.connector_of(role) == "MooncakeConnector":
                host = urlsplit(p.url).hostname or ""
                out.append(
                    vllm.mooncake_bootstrap_port(
                        ctx.topology, name, host, i if role.replicas > 1 else None, p.bootstrap_port
                    )
                )
            else:
                out.append(None)
    return out


# ---- reading a rendered router argv ------------------------------------------------------------


def prefills(args: tuple[str, ...]) -> Iterator[tuple[str, str | None]]:
    """(URL, bootstrap port or None) of each `--prefill URL [PORT|none]`."""
    for i, arg in enumerate(args):
        if arg == PREFILL and i + 1 < len(args):
            nxt = args[i + 2] if i + 2 < len(args) else None
            yield args[i + 1], nxt if nxt is not None and not nxt.startswith("-") else None


def decodes(args: tuple[str, ...]) -> list[str]:
    return [args[i + 1] for i, a in enumerate(args[:-1]) if a == DECODE]


def workers(args: tuple[str, ...]) -> list[str]:
    return values_after(args, WORKER_URLS)
