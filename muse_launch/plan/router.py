"""Routers: sglang-router, smg (its successor, same PD syntax) and vllm-router."""

from __future__ import annotations

from .render import Context, Instance, Rendered, opt
from .spec import Probe, ProbeKind

DEFAULT_LAUNCHERS = {
    "sglang-router": ("sglang-router", "launch"),
    "smg": ("smg", "launch"),
    "vllm-router": ("vllm-router",),
}
PD_FLAG = {"sglang-router": "--pd-disaggregation", "smg": "--pd-disaggregation",
           "vllm-router": "--vllm-pd-disaggregation"}
# Routers answer /health before any worker registers; /readiness waits for the workers.
READY = Probe(ProbeKind.HTTP, ("/readiness",), timeout=600.0)


def render(inst: Instance, ctx: Context) -> Rendered:
    args: list[str] = []
    if inst.prefill or inst.decode:
        args.append(PD_FLAG[inst.engine])
        for p in inst.prefill:
            args += ["--prefill", p.url]
            if inst.engine != "vllm-router":  # vllm-router learns the KV hand-off from the prefill's reply
                args.append(str(p.bootstrap_port) if p.bootstrap_port else "none")
        for d in inst.decode:
            args += ["--decode", d.url]
    elif inst.workers:
        args += ["--worker-urls", *(w.url for w in inst.workers)]
    upstream = (*inst.prefill, *inst.decode, *inst.workers)
    if inst.engine == "smg" and upstream and upstream[0].engine == "vllm":
        args += ["--backend", "vllm"]
    args += [*inst.role.args, *opt("--host", inst.bind), *opt("--port", inst.port),
             *opt("--prometheus-port", inst.metrics_port)]
    if inst.bind != "0.0.0.0" and inst.metrics_port:
        args += ["--prometheus-host", inst.bind]  # keep metrics on the same interface as the router
    ports = {"http": inst.port, "metrics": inst.metrics_port} if inst.metrics_port else {"http": inst.port}
    return Rendered(tuple(args), ports, READY)

