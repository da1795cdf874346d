"""vLLM workers: TP, TP + expert parallel, data + expert parallel, multi-node, prefill/decode."""

from __future__ import annotations

import json

from .render import Context, Instance, Rendered, opt
from .spec import Probe, ProbeKind

DEFAULT_LAUNCHER = ("vllm", "serve")
CONNECTORS = {"nixl": "NixlConnector", "mooncake": "MooncakeConnector", "example": "ExampleConnector",
              "lmcache": "LMCacheConnectorV1"}
KV_ROLE = {"prefill": "kv_producer", "decode": "kv_consumer"}
# vLLM answers /health before its OpenAI routes are mounted in some versions: wait for both.
READY = Probe(ProbeKind.HTTP, ("/health", "/v1/models"))


def render(inst: Instance, ctx: Context) -> Rendered:
    role = inst.role
    # `vllm serve MODEL` takes the model positionally; the api_server module wants --model.
    model = (inst.model,) if ctx.launcher[-1:] == ("serve",) else ("--model", inst.model)
    args: list[str] = [*(model if inst.model else ()), *ctx.topology.args]
    args += [*opt("--tensor-parallel-size", role.tp), *opt("--pipeline-parallel-size", role.pp),
             *opt("--data-parallel-size", role.dp)]
    if role.ep and role.ep > 1:
        args.append("--enable-expert-parallel")
    args += [*opt("--gpu-memory-utilization", role.mem_fraction), *opt("--kv-cache-dtype", role.kv_cache_dtype),
             *opt("--block-size", role.page_size)]
    ports = {"http": inst.port} if inst.serves_http else {}
    env: dict[str, str] = {}
    if inst.kind in KV_ROLE:
        connector = CONNECTORS.get(role.transfer_backend or "nixl", role.transfer_backend)
        config = {"kv_connector": connector, "kv_role": KV_ROLE[inst.kind], **(role.kv_transfer_config or {})}
        args += ["--kv-transfer-config", json.dumps(config, separators=(",", ":"))]
        if connector == "NixlConnector" and inst.side_channel_port:
            env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(inst.side_channel_port)
            ports["side_channel"] = inst.side_channel_port
    if inst.nnodes > 1:
        args += ["--nnodes", str(inst.nnodes), "--node-rank", str(inst.node_rank),
                 "--master-addr", str(inst.dist_init_host), "--master-port", str(inst.dist_init_port)]
        if inst.node_rank > 0:
            args.append("--headless")
        else:
            ports["dist_init"] = inst.dist_init_port
    args += [*role.args, *opt("--host", inst.bind), *opt("--port", inst.port if inst.serves_http else None)]
    probe = READY if inst.serves_http else Probe(ProbeKind.PROCESS)
    return Rendered(tuple(args), ports, probe, env)
