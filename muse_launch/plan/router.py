"""Routers: sglang-router, smg (its successor, same PD syntax) and vllm-router."""

from __future__ import annotations

from urllib.parse import urlsplit

from . import vllm
from .render import Context, Instance, Rendered, has_flag, opt
from .spec import Probe, ProbeKind

DEFAULT_LAUNCHERS = {
    "sglang-router": ("sglang-router", "launch"),
    "smg": ("smg", "launch"),
    "vllm-router": ("vllm-router",),
}
# What provides each router, and the module its program runs (host/versions.py reads the release;
# note that sglang-router 0.3.2 installs an `smg` program of its own, which runs sglang_router).
DISTRIBUTIONS = {"sglang-router": ("sglang-router",), "smg": ("smg",), "vllm-router": ("vllm-router",)}
MODULES = {"sglang-router": "sglang_router", "smg": "smg", "vllm-router": "vllm_router"}
PD_FLAG = {"sglang-router": "--pd-disaggregation", "smg": "--pd-disaggregation",
           "vllm-router": "--vllm-pd-disaggregation"}
# muse-launch restarts a dead worker on the same URL; these let the router take it back within a
# second of its being ready (scripts/bench_recovery.py: 0.7 s, against 1.7 s with the router's defaults).
RECOVERY_DEFAULTS = (("--health-check-interval-secs", "1"), ("--health-success-threshold", "1"),
                     ("--cb-timeout-duration-secs", "2"))
# vllm-router checks its workers every 30 s while starting; its readiness would lag theirs by as much.
STARTUP_DEFAULTS = {"vllm-router": (("--worker-startup-check-interval", "1"),)}
# Routers answer /health before any worker registers; /readiness waits for the workers.
READY = Probe(ProbeKind.HTTP, ("/readiness",), timeout=600.0)


def render(inst: Instance, ctx: Context) -> Rendered:
    args: list[str] = []
    if inst.prefill or inst.decode:
        args.append(PD_FLAG[inst.engine])
        bootstrap = _prefill_bootstrap_ports(inst, ctx)
        for p, port in zip(inst.prefill, bootstrap):
            args += ["--prefill", p.url]
            if port or inst.engine != "vllm-router":
                args.append(str(port) if port else "none")
        vllm_mooncake = any(ctx.topology.role_engine(r) == "vllm" and vllm.connector_of(r) == "MooncakeConnector"
                            for r in (ctx.topology.roles[n] for n in inst.role.prefill))
        if inst.engine == "vllm-router" and vllm_mooncake:
            args += ["--kv-connector", "mooncake"]
        for d in inst.decode:
            args += ["--decode", d.url]
    elif inst.workers:
        args += ["--worker-urls", *(w.url for w in inst.workers)]
    upstream = (*inst.prefill, *inst.decode, *inst.workers)
    if inst.engine == "smg" and upstream and upstream[0].engine == "vllm":
        args += ["--backend", "vllm"]
    for flag, value in (*RECOVERY_DEFAULTS, *STARTUP_DEFAULTS.get(inst.engine, ())):
        if not has_flag(inst.role.args, flag):  # the routers refuse a flag given twice
            args += [flag, value]
    args += [*inst.role.args, *opt("--host", inst.bind), *opt("--port", inst.port),
             *opt("--prometheus-port", inst.metrics_port)]
    if inst.bind != "0.0.0.0" and inst.metrics_port:
        args += ["--prometheus-host", inst.bind]  # keep metrics on the same interface as the router
    ports = {"http": inst.port, "metrics": inst.metrics_port} if inst.metrics_port else {"http": inst.port}
    return Rendered(tuple(args), ports, READY)


def _prefill_bootstrap_ports(inst: Instance, ctx: Context) -> list[int | None]:
    """Each prefill upstream's KV bootstrap port, in order; vLLM has one only with Mooncake (NIXL needs none)."""
    out: list[int | None] = []
    upstream = iter(inst.prefill)
    for name in inst.role.prefill:
        role = ctx.topology.roles[name]
        for i in range(1 if role.nodes else role.replicas):
            p = next(upstream)
            if ctx.topology.role_engine(role) != "vllm":
                out.append(p.bootstrap_port)
            elif vllm.connector_of(role) == "MooncakeConnector":
                host = urlsplit(p.url).hostname or ""
                out.append(vllm.mooncake_bootstrap_port(ctx.topology, name, host, i if role.replicas > 1 else None,
                                                        p.bootstrap_port))
            else:
                out.append(None)
    return out
