"""SGLang workers: encoder, prefill, decode, aggregated worker, multi-node ranks."""

from __future__ import annotations

from .render import Context, Instance, Rendered, has_flag, opt
from .spec import Probe, ProbeKind

DEFAULT_LAUNCHER = ("sglang", "serve")


def render(inst: Instance, ctx: Context) -> Rendered:
    role = inst.role
    args: list[str] = [*opt("--model-path", inst.model), *ctx.topology.args]
    args += [*opt("--tp-size", role.tp), *opt("--ep-size", role.ep), *opt("--dp-size", role.dp),
             *opt("--pp-size", role.pp), *opt("--mem-fraction-static", role.mem_fraction)]
    ports = {"http": inst.port} if inst.serves_http else {}
    if inst.kind == "encoder":
        args += ["--encoder-only", *opt("--encoder-transfer-backend", role.encoder_transfer_backend)]
    if inst.encoders:
        args += ["--language-only", "--encoder-urls", *(e.url for e in inst.encoders),
                 *opt("--encoder-transfer-backend", role.encoder_transfer_backend),
                 *opt("--encoder-bootstrap-port", inst.encoder_bootstrap_port)]
        if inst.node_rank == 0:
            ports["encoder_bootstrap"] = inst.encoder_bootstrap_port
    if inst.kind in ("prefill", "decode"):
        args += ["--disaggregation-mode", inst.kind,
                 *opt("--disaggregation-transfer-backend", role.transfer_backend),
                 *opt("--disaggregation-bootstrap-port", inst.bootstrap_port)]
        # SGLang binds the KV bootstrap server on prefill only, unless PD role switching is on.
        binds_bootstrap = inst.kind == "prefill" or has_flag(role.args, "--enable-pd-role-switch")
        if binds_bootstrap and inst.bootstrap_port and inst.node_rank == 0:
            ports["bootstrap"] = inst.bootstrap_port
    args += [*opt("--kv-cache-dtype", role.kv_cache_dtype), *opt("--page-size", role.page_size)]
    if inst.nnodes > 1:
        args += ["--nnodes", str(inst.nnodes), "--node-rank", str(inst.node_rank),
                 "--dist-init-addr", f"{inst.dist_init_host}:{inst.dist_init_port}"]
        if inst.node_rank == 0:
            ports["dist_init"] = inst.dist_init_port
    args += [*role.args, *opt("--host", inst.bind), *opt("--port", inst.port)]
    probe = Probe(ProbeKind.HTTP, ("/health",)) if inst.serves_http else Probe(ProbeKind.PROCESS)
    return Rendered(tuple(args), ports, probe)
