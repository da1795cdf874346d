"""Parse the argv a real engine would receive into a :class:`SimConfig`.

Only the flags the rehearsal engine acts on are read (``parse_known_args``); every other
flag of ``sglang serve`` / ``vllm serve`` is accepted and ignored, so the exact command
line of a GPU deployment can be replayed unchanged.  Where the real engine refuses a
combination at start-up, :func:`startup_errors` reports it so the simulator exits 1 too.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass, field
from typing import Any

from ..engines import sglang as sgl
from ..engines import vllm

# The releases it imitates: those whose command lines the engines write.
SGLANG_VERSION = sgl.ENGINE.RELEASE
VLLM_VERSION = vllm.ENGINE.RELEASE

# The engines' facts (flag spellings, choices, default ports, connectors) come from the engine
# modules the renderers and checks use; tests/unit/test_sim_facts.py asserts the agreement.
SGLANG_FLAGS = sgl.KEY_FLAGS
VLLM_FLAGS = vllm.KEY_FLAGS
# vLLM's KV connectors whose hand-off the simulator models; every other one vLLM registers
# (vllm.KNOWN_CONNECTORS) starts and answers without a hand-off.
NIXL, MOONCAKE, EXAMPLE = (vllm.CONNECTORS[k] for k in ("nixl", "mooncake", "example"))

DEFAULT_CONTEXT_LENGTH = 1048576  # Muse Spark Open: 1M-token context
VLLM_DP_RPC_PORT = 29550  # vLLM's --data-parallel-rpc-port default


class ArgvError(Exception):
    """The engine's own parser would reject this argv (exit status 2)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # type: ignore[override]
        raise ArgvError(f"{self.prog}: error: {message}")


def _bool_flag(p: argparse.ArgumentParser, *names: str, dest: str) -> None:
    p.add_argument(*names, dest=dest, action="store_true", default=False)


@dataclass
class SimConfig:
    engine: str  # "sglang" | "vllm"
    argv: list[str]
    model: str  # model path / HF id as given
    served_model_names: list[str]
    host: str
    port: int
    tokenizer: str | None = None
    tp_size: int = 1
    ep_size: int = 1
    dp_size: int = 1
    pp_size: int = 1
    page_size: int | None = None
    kv_cache_dtype: str = "auto"
    context_length: int = DEFAULT_CONTEXT_LENGTH
    reasoning_parser: str | None = None
    tool_call_parser: str | None = None
    enable_auto_tool_choice: bool = False
    is_embedding: bool = False
    # SGLang PD / EPD
    disaggregation_mode: str = "null"
    transfer_backend: str = "mooncake"
    bootstrap_port: int = sgl.DEFAULT_BOOTSTRAP_PORT
    enable_pd_role_switch: bool = False
    encoder_only: bool = False
    language_only: bool = False
    encoder_urls: list[str] = field(default_factory=list)
    encoder_register_urls: list[str] = field(default_factory=list)
    encoder_bootstrap_port: int = sgl.DEFAULT_ENCODER_BOOTSTRAP_PORT
    encoder_transfer_backend: str = "auto"
    # multi-node
    nnodes: int = 1
    node_rank: int = 0
    dist_init_addr: str | None = None
    headless: bool = False
    # vLLM data parallel across nodes: this node's first global DP rank and its local ranks
    dp_start_rank: int = 0
    dp_size_local: int | None = None
    dp_api_per_node: bool = False  # --data-parallel-hybrid-lb / --data-parallel-external-lb
    # vLLM KV transfer
    kv_transfer_config: dict[str, Any] | None = None
    ignored: list[str] = field(default_factory=list)

    # ----- derived -----
    @property
    def served_model_name(self) -> str:
        return self.served_model_names[0]

    @property
    def kv_connector(self) -> str | None:
        return (self.kv_transfer_config or {}).get("kv_connector")

    @property
    def kv_role(self) -> str | None:
        return (self.kv_transfer_config or {}).get("kv_role")

    @property
    def kv_extra(self) -> dict[str, Any]:
        return (self.kv_transfer_config or {}).get("kv_connector_extra_config") or {}

    @property
    def role(self) -> str:
        """A short label for logs: encoder, prefill, decode, pd, worker."""
        if self.engine == "sglang":
            if self.encoder_only:
                return "encoder"
            if self.disaggregation_mode in ("prefill", "decode"):
                return self.disaggregation_mode
            return "language" if self.language_only else "worker"
        role = self.kv_role
        return {"kv_producer": "prefill", "kv_consumer": "decode", "kv_both": "pd"}.get(role or "", "worker")

    @property
    def advertised_host(self) -> str:
        """The address peers use to reach this server (a wildcard bind means loopback here)."""
        if self.host in ("", "0.0.0.0", "::", "[::]"):
            return "127.0.0.1"
        return self.host

    @property
    def resolved_encoder_transfer_backend(self) -> str:
        b = self.encoder_transfer_backend or "auto"
        return "zmq_to_scheduler" if b == "auto" else b

    @property
    def binds_kv_bootstrap(self) -> bool:
        """SGLang 0.5.23: the KV bootstrap server runs on a prefill (or any PD role with
        --enable-pd-role-switch), never on a plain decode."""
        if self.engine != "sglang" or self.node_rank > 0:
            return False
        if self.disaggregation_mode == "prefill":
            return True
        return self.enable_pd_role_switch and self.disaggregation_mode == "decode"

    @property
    def binds_encoder_bootstrap(self) -> bool:
        return self.engine == "sglang" and self.language_only and self.node_rank == 0

    @property
    def vllm_is_producer(self) -> bool:
        return self.kv_role in ("kv_producer", "kv_both")

    @property
    def vllm_is_consumer(self) -> bool:
        return self.kv_role in ("kv_consumer", "kv_both")

    @property
    def nixl_side_channel(self) -> tuple[str, int] | None:
        if self.engine != "vllm" or self.kv_connector != NIXL:
            return None
        host = os.environ.get(vllm.NIXL_SIDE_CHANNEL_HOST_ENV, "localhost")
        base = int(os.environ.get(vllm.NIXL_SIDE_CHANNEL_PORT_ENV, vllm.NIXL_SIDE_CHANNEL_BASE))
        return host, base + self.dp_start_rank  # vLLM listens at the base + the DP rank

    @property
    def mooncake_bootstrap(self) -> tuple[str, int] | None:
        if self.engine != "vllm" or self.kv_connector != MOONCAKE or not self.vllm_is_producer:
            return None
        return self.host or "0.0.0.0", int(
            os.environ.get(vllm.MOONCAKE_BOOTSTRAP_PORT_ENV, vllm.MOONCAKE_BOOTSTRAP_BASE)
        )

    @property
    def shared_storage_path(self) -> str | None:
        if self.engine != "vllm" or self.kv_connector != EXAMPLE:
            return None
        return str(self.kv_extra.get("shared_storage_path", "/tmp"))

    @property
    def dist_init(self) -> tuple[str, int] | None:
        if self.nnodes <= 1 or not self.dist_init_addr:
            return None
        host, _, port = self.dist_init_addr.rpartition(":")
        return host.strip("[]") or "127.0.0.1", int(port)

    @property
    def serves_http(self) -> bool:
        """vLLM --headless and node ranks > 0 of vLLM serve no API (unless DP load balancing
        puts an API server on every node); SGLang ranks > 0 serve only a dummy health
        endpoint on the same port."""
        if self.engine == "vllm":
            return not self.headless and (self.node_rank == 0 or self.dp_api_per_node)
        return True

    @property
    def local_dp_ranks(self) -> range:
        """The global DP ranks whose engines run in this process (vLLM; one rank otherwise)."""
        return range(self.dp_start_rank, self.dp_start_rank + (self.dp_size_local or self.dp_size))


def _split_urls(values: list[str] | None) -> list[str]:
    out: list[str] = []
    for v in values or []:
        out.extend(u for u in v.replace(",", " ").split() if u)
    return out


def parse_sglang(argv: list[str]) -> SimConfig:
    p = _Parser(prog="sglang serve", add_help=False, allow_abbrev=False)
    p.add_argument(*SGLANG_FLAGS["model"], dest="model_path")
    p.add_argument(*sgl.TOKENIZER, dest="tokenizer_path")
    p.add_argument(sgl.SERVED_MODEL_NAME, dest="served_model_name")
    p.add_argument(sgl.HOST, dest="host", default="127.0.0.1")
    p.add_argument(sgl.PORT, dest="port", type=int, default=30000)
    for key in ("tp", "ep", "dp", "pp"):
        p.add_argument(*SGLANG_FLAGS[key], f"--{key}", dest=f"{key}_size", type=int, default=1)
    p.add_argument(*SGLANG_FLAGS["page_size"], dest="page_size", type=int, default=None)
    p.add_argument(*SGLANG_FLAGS["kv_cache_dtype"], dest="kv_cache_dtype", default="auto")
    p.add_argument("--context-length", dest="context_length", type=int, default=None)
    p.add_argument(sgl.REASONING_PARSER, dest="reasoning_parser")
    p.add_argument(sgl.TOOL_CALL_PARSER, dest="tool_call_parser")
    _bool_flag(p, "--is-embedding", dest="is_embedding")
    p.add_argument(
        sgl.DISAGGREGATION_MODE,
        dest="disaggregation_mode",
        default="null",
        choices=sgl.CHOICES[sgl.DISAGGREGATION_MODE],
    )
    (backend,) = SGLANG_FLAGS["transfer_backend"]
    p.add_argument(
        backend, dest="transfer_backend", default=sgl.DEFAULT_TRANSFER_BACKEND, choices=sgl.CHOICES[backend]
    )
    p.add_argument(
        *SGLANG_FLAGS["bootstrap_port"], dest="bootstrap_port", type=int, default=sgl.DEFAULT_BOOTSTRAP_PORT
    )
    _bool_flag(p, sgl.PD_ROLE_SWITCH, dest="enable_pd_role_switch")
    _bool_flag(p, sgl.ENCODER_ONLY, dest="encoder_only")
    _bool_flag(p, sgl.LANGUAGE_ONLY, dest="language_only")
    p.add_argument(sgl.ENCODER_URLS, dest="encoder_urls", nargs="+", default=[])
    p.add_argument(sgl.ENCODER_REGISTER_URLS, dest="encoder_register_urls", nargs="+", default=[])
    p.add_argument(
        *SGLANG_FLAGS["encoder_bootstrap_port"],
        dest="encoder_bootstrap_port",
        type=int,
        default=sgl.DEFAULT_ENCODER_BOOTSTRAP_PORT,
    )
    (backend,) = SGLANG_FLAGS["encoder_transfer_backend"]
    p.add_argument(backend, dest="encoder_transfer_backend", default="auto", choices=sgl.CHOICES[backend])
    p.add_argument(sgl.NNODES, dest="nnodes", type=int, default=1)
    p.add_argument(sgl.NODE_RANK, dest="node_rank", type=int, default=0)
    p.add_argument(sgl.DIST_INIT_ADDR, "--nccl-init-addr", dest="dist_init_addr")
    ns, rest = p.parse_known_args(argv)
    if not ns.model_path:
        raise ArgvError(
            f"sglang serve: error: the following arguments are required: {SGLANG_FLAGS['model'][0]}"
        )
    served = ns.served_model_name or ns.model_path
    return SimConfig(
        engine="sglang",
        argv=list(argv),
        model=ns.model_path,
        served_model_names=[served],
        host=ns.host,
        port=ns.port,
        tokenizer=ns.tokenizer_path,
        tp_size=ns.tp_size,
        ep_size=ns.ep_size,
        dp_size=ns.dp_size,
        pp_size=ns.pp_size,
        page_size=ns.page_size,
        kv_cache_dtype=ns.kv_cache_dtype,
        context_length=ns.context_length or DEFAULT_CONTEXT_LENGTH,
        reasoning_parser=ns.reasoning_parser,
        tool_call_parser=ns.tool_call_parser,
        is_embedding=ns.is_embedding,
        disaggregation_mode=ns.disaggregation_mode,
        transfer_backend=ns.transfer_backend,
        bootstrap_port=ns.bootstrap_port,
        enable_pd_role_switch=ns.enable_pd_role_switch,
        encoder_only=ns.encoder_only,
        language_only=ns.language_only,
        encoder_urls=_split_urls(ns.encoder_urls),
        encoder_register_urls=_split_urls(ns.encoder_register_urls),
        encoder_bootstrap_port=ns.encoder_bootstrap_port,
        encoder_transfer_backend=ns.encoder_transfer_backend,
        nnodes=ns.nnodes,
        node_rank=ns.node_rank,
        dist_init_addr=ns.dist_init_addr,
        ignored=rest,
    )


def _vllm_parser() -> _Parser:
    """`vllm serve`'s options that the simulated engine acts on; the rest are ignored (and listed)."""
    p = _Parser(prog="vllm serve", add_help=False, allow_abbrev=False)
    p.add_argument(*VLLM_FLAGS["model"], dest="model")
    p.add_argument(*vllm.TOKENIZER, dest="tokenizer")
    p.add_argument(vllm.SERVED_MODEL_NAME, dest="served_model_name", nargs="+")
    p.add_argument(vllm.HOST, dest="host", default=None)
    p.add_argument(vllm.PORT, dest="port", type=int, default=8000)
    for key in ("tp", "pp", "dp"):
        p.add_argument(*VLLM_FLAGS[key], dest=f"{key}_size", type=int, default=1)
    p.add_argument(vllm.DP_SIZE_LOCAL, "-dpl", dest="dp_size_local", type=int, default=None)
    p.add_argument(vllm.DP_START_RANK, "-dpr", dest="dp_start_rank", type=int, default=0)
    p.add_argument(vllm.DP_ADDRESS, "-dpa", dest="dp_address", default=None)
    p.add_argument(vllm.DP_RPC_PORT, "-dpp", dest="dp_rpc_port", type=int, default=VLLM_DP_RPC_PORT)
    hybrid_lb, external_lb = vllm.DP_PER_NODE_API
    _bool_flag(p, hybrid_lb, "-dph", dest="dp_hybrid_lb")
    _bool_flag(p, external_lb, "-dpe", dest="dp_external_lb")
    _bool_flag(p, vllm.ENABLE_EXPERT_PARALLEL, "-ep", dest="enable_expert_parallel")
    p.add_argument(*VLLM_FLAGS["page_size"], dest="block_size", type=int, default=None)
    p.add_argument(*VLLM_FLAGS["kv_cache_dtype"], dest="kv_cache_dtype", default="auto")
    p.add_argument("--max-model-len", dest="max_model_len", type=str, default=None)
    p.add_argument(vllm.REASONING_PARSER, dest="reasoning_parser")
    p.add_argument(vllm.TOOL_CALL_PARSER, dest="tool_call_parser")
    _bool_flag(p, "--enable-auto-tool-choice", dest="enable_auto_tool_choice")
    p.add_argument(vllm.KV_TRANSFER_CONFIG, dest="kv_transfer_config")
    p.add_argument(vllm.NNODES, dest="nnodes", type=int, default=1)
    p.add_argument(vllm.NODE_RANK, dest="node_rank", type=int, default=0)
    p.add_argument(vllm.MASTER_ADDR, dest="master_addr", default="127.0.0.1")
    p.add_argument(vllm.MASTER_PORT, dest="master_port", type=int, default=vllm.DEFAULT_MASTER_PORT)
    _bool_flag(p, vllm.HEADLESS, dest="headless")
    return p


def parse_vllm(argv: list[str]) -> SimConfig:
    args = list(argv)
    if args and args[0] == "serve":  # tolerate "vllm serve ..." passed whole
        args = args[1:]
    positional_model = None
    if args and not args[0].startswith("-"):
        positional_model, args = args[0], args[1:]
    ns, rest = _vllm_parser().parse_known_args(args)
    model = ns.model or positional_model
    if ns.model and positional_model and ns.model != positional_model:
        raise ArgvError(f"vllm serve: error: model given both positionally and with {VLLM_FLAGS['model'][0]}")
    if not model:
        model = "Qwen/Qwen3-0.6B"  # vLLM's own default model
    kvc = _kv_transfer_config(ns.kv_transfer_config)
    max_len = _max_model_len(ns.max_model_len)
    served = ns.served_model_name or [model]
    ep = ns.tp_size * ns.dp_size if ns.enable_expert_parallel else 1
    dist = f"{ns.master_addr}:{ns.master_port}" if ns.nnodes > 1 else None
    nnodes, node_rank = ns.nnodes, ns.node_rank
    local = ns.dp_size_local
    if local and ns.dp_size > local:
        # DP ranks over several nodes (or API servers): they rendezvous with the head (start
        # rank 0) at --data-parallel-address:--data-parallel-rpc-port, as vLLM's DP coordinator.
        if ns.dp_size % local:
            raise ArgvError(
                f"vllm serve: error: {VLLM_FLAGS['dp'][0]} {ns.dp_size} is not a "
                f"multiple of {vllm.DP_SIZE_LOCAL} {local}"
            )
        nnodes, node_rank = ns.dp_size // local, ns.dp_start_rank // local
        dist = f"{ns.dp_address or '127.0.0.1'}:{ns.dp_rpc_port}"
    return SimConfig(
        engine="vllm",
        argv=list(argv),
        model=model,
        served_model_names=list(served),
        host=ns.host if ns.host is not None else "0.0.0.0",
        port=ns.port,
        tokenizer=ns.tokenizer,
        tp_size=ns.tp_size,
        ep_size=ep,
        dp_size=ns.dp_size,
        pp_size=ns.pp_size,
        page_size=ns.block_size,
        kv_cache_dtype=ns.kv_cache_dtype,
        context_length=max_len,
        reasoning_parser=ns.reasoning_parser,
        tool_call_parser=ns.tool_call_parser,
        enable_auto_tool_choice=ns.enable_auto_tool_choice,
        nnodes=nnodes,
        node_rank=node_rank,
        dist_init_addr=dist,
        headless=ns.headless,
        dp_start_rank=ns.dp_start_rank,
        dp_size_local=local,
        dp_api_per_node=ns.dp_hybrid_lb or ns.dp_external_lb,
        kv_transfer_config=kvc,
        ignored=rest,
    )


def _kv_transfer_config(text: str | None) -> dict | None:
    if not text:
        return None
    try:
        kvc = json.loads(text)
    except json.JSONDecodeError as e:
        raise ArgvError(
            f"vllm serve: error: argument {vllm.KV_TRANSFER_CONFIG}: invalid JSON ({e})"
        ) from None
    if not isinstance(kvc, dict):
        raise ArgvError(f"vllm serve: error: argument {vllm.KV_TRANSFER_CONFIG}: expected a JSON object")
    return kvc


def _max_model_len(text: str | None) -> int:
    """--max-model-len as vLLM reads it: 32768, 32k, 1m."""
    if not text:
        return DEFAULT_CONTEXT_LENGTH
    s = text.strip().lower()
    mult = {"k": 1000, "m": 1000000}.get(s[-1:], 1)
    try:
        return int(float(s[:-1] if mult > 1 else s) * mult)
    except ValueError:
        raise ArgvError(f"vllm serve: error: argument --max-model-len: invalid value {text!r}") from None


def parse_engine_args(engine: str, argv: list[str]) -> SimConfig:
    if engine == "sglang":
        return parse_sglang(argv)
    if engine == "vllm":
        return parse_vllm(argv)
    raise ArgvError(f"unknown engine {engine!r} (expected sglang or vllm)")


def startup_errors(cfg: SimConfig) -> list[str]:
    """Start-up rules the real engine enforces (it exits non-zero on these)."""
    errs: list[str] = []
    if cfg.engine == "sglang":
        if cfg.encoder_only and cfg.language_only:
            errs.append(f"{sgl.ENCODER_ONLY} and {sgl.LANGUAGE_ONLY} cannot be used together")
        if cfg.encoder_only and cfg.disaggregation_mode in ("prefill", "decode"):
            errs.append(
                f"{sgl.ENCODER_ONLY} cannot be combined with {sgl.DISAGGREGATION_MODE} "
                f"{cfg.disaggregation_mode}"
            )
        if cfg.encoder_urls and not cfg.language_only:
            errs.append(f"{sgl.ENCODER_URLS} requires {sgl.LANGUAGE_ONLY}")
        if cfg.encoder_register_urls and not cfg.encoder_only:
            errs.append(f"{sgl.ENCODER_REGISTER_URLS} requires {sgl.ENCODER_ONLY}")
        if cfg.nnodes > 1 and not cfg.dist_init_addr:
            errs.append(f"{sgl.DIST_INIT_ADDR} is required when {sgl.NNODES} > 1")
        if not 0 <= cfg.node_rank < max(cfg.nnodes, 1):
            errs.append(f"{sgl.NODE_RANK} {cfg.node_rank} out of range for {sgl.NNODES} {cfg.nnodes}")
    else:
        kvc = cfg.kv_transfer_config
        if kvc is not None:
            conn = kvc.get("kv_connector")
            if conn and not kvc.get("kv_role"):
                errs.append(
                    "Please specify kv_role when kv_connector is set, supported "
                    "roles are ['kv_producer', 'kv_consumer', 'kv_both']"
                )
            if kvc.get("kv_role") and kvc["kv_role"] not in ("kv_producer", "kv_consumer", "kv_both"):
                errs.append(
                    f"Unsupported kv_role: {kvc['kv_role']}. Supported roles are "
                    "['kv_producer', 'kv_consumer', 'kv_both']"
                )
            if conn and conn not in vllm.KNOWN_CONNECTORS and not kvc.get(vllm.CONNECTOR_MODULE_PATH):
                errs.append(f"Unsupported connector type: {conn}")
        if cfg.enable_auto_tool_choice and not cfg.tool_call_parser:
            errs.append(
                f"When `--enable-auto-tool-choice` is set, `{vllm.TOOL_CALL_PARSER}` must be set as well"
            )
        if not 0 <= cfg.node_rank < max(cfg.nnodes, 1):
            errs.append(f"{vllm.NODE_RANK} {cfg.node_rank} out of range for {vllm.NNODES} {cfg.nnodes}")
    return errs
