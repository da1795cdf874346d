"""SGLang workers: encoder, prefill, decode, aggregated worker, multi-node ranks."""

from __future__ import annotations

from .render import Context, Instance, Rendered, has_flag, last_value, opt
from .spec import Probe, ProbeKind

DEFAULT_LAUNCHER = ("sglang", "serve")
DEFAULT_BOOTSTRAP_PORT = 8998  # --disaggregation-bootstrap-port
DEFAULT_ENCODER_BOOTSTRAP_PORT = 8997  # --encoder-bootstrap-port
# What provides it, and the module its programs run (host/versions.py reads the installed release).
DISTRIBUTIONS = ("sglang",)
MODULES = ("sglang",)
# The first release that accepts each flag, of those topologies/ renders that older releases lack
# (read from the released wheels' sglang/srt sources: 0.5.12, 13, 14, 18, 19, 20, 22 and 23).
FLAG_SINCE = {
    "--encoder-bootstrap-port": "0.5.13",  # the language worker's encoder bootstrap server
    "--cuda-graph-max-bs-decode": "0.5.14",
    "--disable-prefill-cuda-graph": "0.5.14",
    "--enable-layernorm-sp": "0.5.19",
    "--enable-megamoe-for-layernorm-sp": "0.5.23",
}


def parser_entry(module: str | None, rest: tuple[str, ...]) -> str | None:
    """Which of SGLang's entry points a program reaches, as the engine check names them: `sglang serve`
    (the console script, sglang.cli.main) or `python -m sglang.launch_server`; None for anything else."""
    if module == "sglang.launch_server":
        return "sglang.launch_server"
    if module and module.split(".")[:2] == ["sglang", "cli"] and rest[:1] == ("serve",):
        return "sglang serve"
    return None


def render(inst: Instance, ctx: Context) -> Rendered:
    role = inst.role
    args: list[str] = [*opt("--model-path", inst.model), *ctx.topology.args]
    args += [*opt("--tp-size", role.tp), *opt("--ep-size", role.ep), *opt("--dp-size", role.dp),
             *opt("--pp-size", role.pp), *opt("--mem-fraction-static", role.mem_fraction)]
    if inst.kind == "encoder":
        args += ["--encoder-only", *opt("--encoder-transfer-backend", role.encoder_transfer_backend)]
    if inst.encoders:
        args += ["--language-only", "--encoder-urls", *(e.url for e in inst.encoders),
                 *opt("--encoder-transfer-backend", role.encoder_transfer_backend),
                 *opt("--encoder-bootstrap-port", inst.encoder_bootstrap_port)]
    if inst.kind in ("prefill", "decode"):
        args += ["--disaggregation-mode", inst.kind,
                 *opt("--disaggregation-transfer-backend", role.transfer_backend),
                 *opt("--disaggregation-bootstrap-port", inst.bootstrap_port)]
    args += [*opt("--kv-cache-dtype", role.kv_cache_dtype), *opt("--page-size", role.page_size)]
    if inst.nnodes > 1:
        args += ["--nnodes", str(inst.nnodes), "--node-rank", str(inst.node_rank),
                 "--dist-init-addr", f"{inst.dist_init_host}:{inst.dist_init_port}"]
    args += [*role.args, *opt("--host", inst.bind), *opt("--port", inst.port)]
    probe = Probe(ProbeKind.HTTP, ("/health",)) if inst.serves_http else Probe(ProbeKind.PROCESS)
    return Rendered(tuple(args), bound_ports(args, inst), probe)


def bound_ports(args: list[str], inst: Instance) -> dict[str, int]:
    """The ports SGLang 0.5.23 binds for this argv, read from the final argv so that a flag given
    in `args` counts: node rank 0 only; the KV bootstrap server on a prefill, or on any PD
    instance with --enable-pd-role-switch; the encoder bootstrap server on a language worker."""
    if not inst.serves_http:
        return {}
    ports = {"http": inst.port}
    mode = last_value(args, "--disaggregation-mode")
    if mode == "prefill" or (mode == "decode" and has_flag(args, "--enable-pd-role-switch")):
        ports["bootstrap"] = _port(last_value(args, "--disaggregation-bootstrap-port"), DEFAULT_BOOTSTRAP_PORT)
    if has_flag(args, "--language-only"):
        ports["encoder_bootstrap"] = _port(last_value(args, "--encoder-bootstrap-port"), DEFAULT_ENCODER_BOOTSTRAP_PORT)
    dist_init = last_value(args, "--dist-init-addr")
    if inst.nnodes > 1 and dist_init:
        ports["dist_init"] = _port(dist_init.rpartition(":")[2], inst.dist_init_port)
    return {k: v for k, v in ports.items() if v is not None}


def _port(text: str | None, default: int | None) -> int | None:
    return int(text) if text is not None and text.isdigit() else default  # a bad value is the checks' to report
