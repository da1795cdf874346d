"""`init`: a topology for hardware x mode x engine x quantization, like the cookbook's deployment panel.

Only combinations the documents describe (or that follow from them on the same hardware family)
are offered; anything else raises UsageError naming the combinations that work on that hardware.
The flags live in the tables below; tests/unit/test_init.py checks that the files in topologies/
for the same combinations plan exactly the same commands.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import yaml

from .engines import sglang, vllm, vllm_router
from .errors import UsageError
from .plan.build import DEFAULT_DIST_INIT_PORT
from .topology.hardware import (
    BF16_CHECKPOINT,
    CHECKPOINT_VRAM_GB,
    DFLASH_DRAFT,
    INT4_CHECKPOINT,
    MXFP4_CHECKPOINT,
    NVFP4_CHECKPOINT,
    PROFILES,
    HardwareProfile,
    Vendor,
)

MODES = ("epd", "pd", "agg")
ENGINES = (sglang.NAME, vllm.NAME)  # the engines whose recipes the tables below hold
QUANTS = ("nvfp4", "mxfp4", "bf16", "int4")

CHECKPOINTS = {
    "nvfp4": NVFP4_CHECKPOINT,
    "mxfp4": MXFP4_CHECKPOINT,
    "bf16": BF16_CHECKPOINT,
    "int4": INT4_CHECKPOINT,
}  # cookbook section 1
DEFAULT_QUANT = {Vendor.NVIDIA: "nvfp4", Vendor.AMD: "mxfp4", Vendor.INTEL: "int4", Vendor.NONE: "int4"}
QUANTS_BY_VENDOR = {
    Vendor.NVIDIA: ("nvfp4", "bf16"),
    Vendor.AMD: ("mxfp4", "nvfp4", "bf16"),
    Vendor.INTEL: ("int4",),
    Vendor.NONE: ("int4",),
}

# ---- SGLang (the cookbook) -------------------------------------------------------------------
SGLANG_QUANTIZATION = {
    (Vendor.NVIDIA, "nvfp4"): "modelopt_fp4",  # 3.3's commands
    (Vendor.AMD, "nvfp4"): "quark_mxfp4",
}  # section 1: NVFP4 loaded as MXFP4 on MI355X
SGLANG_MOE_RUNNER = {"blackwell": "flashinfer_trtllm", "hopper": "marlin"}  # NVFP4 experts (3.3; section 2)
SGLANG_PARSERS = [sglang.REASONING_PARSER, "muse", sglang.TOOL_CALL_PARSER, "muse"]  # 3.1, 3.2
MOONCAKE_NVLINK_ENV = {
    "MC_INTRANODE_NVLINK": "true",
    "MC_TCP_ENABLE_CONNECTION_POOL": "true",
    "SGLANG_MOONCAKE_CUSTOM_MEM_POOL": "INTRA_NODE_NVLINK",
}  # 3.3, one NVLink host
MOONCAKE_MNNVL_ENV = {
    "NCCL_NVLS_ENABLE": "1",
    "NCCL_MNNVL_ENABLE": "1",
    "NCCL_CUMEM_ENABLE": "1",
    "SGLANG_MOONCAKE_CUSTOM_MEM_POOL": "NVLINK",
    "MC_FORCE_MNNVL": "1",
}  # 3.6, across trays
SGLANG_PORT, PREFILL_PORT, DECODE_PORT, ENCODER_PORT, ROUTER_PORT = 30000, 30001, 30002, 30010, 8000
ENCODER_BOOTSTRAP = sglang.DEFAULT_ENCODER_BOOTSTRAP_PORT  # 3.3: 8997 on prefill, 8999 on decode
XEON_TP = 6  # TP = NUMA nodes; a Xeon 6980P has 2 sockets x 3 sub-NUMA clusters


def dflash(backend: str) -> list[str]:
    """Section 3.5's DFlash V2 flags (the Low Latency strategy): 8 draft tokens, block verification off."""
    return [
        sglang.SPECULATIVE_ALGORITHM,
        "DFLASH",
        sglang.SPECULATIVE_DRAFT_MODEL,
        DFLASH_DRAFT,
        sglang.SPECULATIVE_DRAFT_ATTENTION,
        backend,
        sglang.SPECULATIVE_DRAFT_TOKENS,
        "8",
    ]


# ---- vLLM (the recipe) -----------------------------------------------------------------------
VLLM_FEATURES = [vllm.REASONING_PARSER, "muse", "--enable-auto-tool-choice", vllm.TOOL_CALL_PARSER, "muse"]
DSPARK = {
    "method": "dspark",
    "model": "Inferact/Muse-Spark-Open-DSpark",
    "num_speculative_tokens": 7,
    "draft_sample_method": "probabilistic",
    "rejection_sample_method": "block",
    "enable_adaptive_verification": True,
}  # features.spec_decoding.modes.dspark, on by default for NVFP4
VLLM_ENV = {"VLLM_USE_RUST_FRONTEND": "1"}  # the recipe's default Rust frontend
VLLM_AMD_ARGS = [
    "--dtype",
    "bfloat16",
    "--distributed-executor-backend",
    "mp",
    "--language-model-only",
    "--compilation-config",
    '{"cudagraph_mode":"FULL_AND_PIECEWISE"}',
    "--no-enable-prefix-caching",
    "--enable-chunked-prefill",
]  # hardware_overrides.amd.extra_args
VLLM_AMD_ENV = {
    "VLLM_ROCM_USE_AITER": "1",
    "VLLM_ROCM_MUSE_MOE_REDUCE_DTYPE": "bf16",
    "VLLM_USE_BREAKABLE_CUDAGRAPH": "1",
}  # hardware_overrides.amd.extra_env
VLLM_AMD_VARIANT_ARGS = {  # variants.<v>.hardware_overrides.amd.extra_args
    "mxfp4": [
        vllm.ENGINE.FACTS.attention_backend_flag,
        "ROCM_AITER_FA",
        "--max-model-len",
        "32768",
        "--max-num-seqs",
        "128",
        "--max-num-batched-tokens",
        "8192",
        vllm.ENGINE.FACTS.mem_fraction_flag,
        "0.90",
    ],
    "bf16": [
        "--moe-backend",
        "triton",
        vllm.ENGINE.FACTS.attention_backend_flag,
        "ROCM_AITER_FA",
        "--max-model-len",
        "32768",
        "--max-num-seqs",
        "32",
        "--max-num-batched-tokens",
        "4096",
        vllm.ENGINE.FACTS.mem_fraction_flag,
        "0.95",
    ],
}
VLLM_PORT, VLLM_PREFILL_PORT, VLLM_DECODE_PORT = 8000, 8001, 8002  # vLLM's default; pd_cluster's
VLLM_SIDE_CHANNELS = (5557, 5558)  # pd_cluster's prefill / decode VLLM_NIXL_SIDE_CHANNEL_PORT
VLLM_MASTER_PORT = vllm.DEFAULT_MASTER_PORT
EXAMPLE_ADDRESSES = "10.0.0.{}"  # multi-node files carry example addresses: validate needs no env


class Unsupported(Exception):
    """This combination is not one the documents describe; the message says why."""


@dataclass
class Draft:
    """A topology being built, in the key order a person would write it."""

    description: str
    source: str
    hardware: str
    model: str
    engine: str
    host: str = "127.0.0.1"
    bind: str = "0.0.0.0"
    nodes: int = 1
    launcher: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    args: list[str] = field(default_factory=list)
    roles: dict[str, dict[str, Any]] = field(default_factory=dict)

    def document(self, name: str) -> dict[str, Any]:
        out: dict[str, Any] = {
            "version": 1,
            "name": name,
            "description": self.description,
            "hardware": self.hardware,
            "model": self.model,
            "engine": self.engine,
            "host": self.host,
        }
        if self.bind != self.host:
            out["bind"] = self.bind
        if self.launcher:
            out["launcher"] = self.launcher
        if self.nodes > 1:
            out["nodes"] = {
                f"node{i}": {"address": EXAMPLE_ADDRESSES.format(i + 1)} for i in range(self.nodes)
            }
        if self.env:
            out["env"] = self.env
        if self.args:
            out["args"] = self.args
        out["roles"] = self.roles
        return out


def render_init(hardware: str, mode: str, engine: str, quant: str | None = None) -> str:
    """YAML text of a topology that passes `validate --strict`, with a header naming its sources."""
    hardware, mode, engine = hardware.lower(), mode.lower(), engine.lower()  # `--hardware B300` is b300
    quant = quant.lower() if quant is not None else None
    profile = PROFILES.get(hardware)
    if profile is None:
        raise UsageError(f"unknown hardware {hardware!r}; one of: {', '.join(PROFILES)}")
    if mode not in MODES:
        raise UsageError(f"unknown mode {mode!r}; one of: {', '.join(MODES)}")
    if engine not in ENGINES:
        raise UsageError(f"unknown engine {engine!r}; one of: {', '.join(ENGINES)}")
    if quant is not None and quant not in QUANTS:
        raise UsageError(f"unknown quantization {quant!r}; one of: {', '.join(QUANTS)}")
    quant = quant or DEFAULT_QUANT[profile.vendor]
    try:
        draft = build(profile, mode, engine, quant)
    except Unsupported as exc:
        raise UsageError(
            f"{mode} with {engine} and {quant} on {hardware}: {exc}. "
            f"On {hardware} these work: {'; '.join(supported(hardware)) or 'none'}"
        ) from None
    name = f"{hardware}-{mode}-{engine}-{quant}"
    command = f"muse-launch init --hardware {hardware} --mode {mode} --engine {engine} --quant {quant}"
    header = [
        f"# Generated by `{command}`.",
        *(f"# {line}" for line in draft.source.splitlines()),
        "# Check it with `muse-launch validate FILE --strict`; `muse-launch plan FILE` shows each command.",
    ]
    body = yaml.dump(draft.document(name), Dumper=_Dumper, sort_keys=False, width=100)
    return "\n".join(header) + "\n" + body


class _Dumper(yaml.SafeDumper):
    """Short lists inline (gpus, references), flags one per line, mappings as blocks, no anchors."""

    def ignore_aliases(self, data: Any) -> bool:
        return True

    def represent_list(self, data: list[Any]) -> yaml.Node:
        flow = len(data) <= 2 or all(isinstance(x, int) for x in data)
        return self.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


_Dumper.add_representer(list, _Dumper.represent_list)


def supported(hardware: str) -> list[str]:
    """The combinations init offers on this hardware, e.g. 'agg (sglang: nvfp4, bf16; vllm: nvfp4)'."""
    profile = PROFILES[hardware]
    out = []
    for mode in MODES:
        per_engine = []
        for engine in ENGINES:
            quants = [q for q in QUANTS if _works(profile, mode, engine, q)]
            if quants:
                per_engine.append(f"{engine}: {', '.join(quants)}")
        if per_engine:
            out.append(f"{mode} ({'; '.join(per_engine)})")
    return out


def _works(profile: HardwareProfile, mode: str, engine: str, quant: str) -> bool:
    try:
        build(profile, mode, engine, quant)
    except Unsupported:
        return False
    return True


def build(profile: HardwareProfile, mode: str, engine: str, quant: str) -> Draft:
    if quant not in QUANTS_BY_VENDOR[profile.vendor]:
        raise Unsupported(
            f"{quant} is not a checkpoint for {profile.display}; it takes "
            f"{', '.join(QUANTS_BY_VENDOR[profile.vendor])}"
        )
    builders: dict[tuple[str, str], Callable[[HardwareProfile, str], Draft]] = {
        ("sglang", "agg"): _sglang_agg,
        ("sglang", "pd"): _sglang_pd,
        ("sglang", "epd"): _sglang_epd,
        ("vllm", "agg"): _vllm_agg,
        ("vllm", "pd"): _vllm_pd,
        ("vllm", "epd"): _vllm_epd,
    }
    return builders[(engine, mode)](profile, quant)


# ---- sizing ----------------------------------------------------------------------------------


def _nodes_for(profile: HardwareProfile, quant: str) -> int:
    """Nodes one copy of the checkpoint needs: a power of two, so TP divides the 128 heads."""
    need = CHECKPOINT_VRAM_GB.get(CHECKPOINTS[quant], 0)
    nodes = 1
    while nodes * profile.gpus_per_node * profile.memory_gb < need:
        nodes *= 2
    return nodes


def _half_node_fits(profile: HardwareProfile, quant: str) -> None:
    half = profile.gpus_per_node // 2
    need = CHECKPOINT_VRAM_GB.get(CHECKPOINTS[quant], 0)
    if half * profile.memory_gb < need:
        raise Unsupported(
            f"prefill and decode each get {half} of the {profile.gpus_per_node} GPUs of one "
            f"{profile.display.split(' (')[0]} node, {half * profile.memory_gb} GB, and the "
            f"{quant.upper()} checkpoint needs {need} GB per worker"
        )


def _gpus(count: int, first: int = 0) -> str:
    return f"{first}-{first + count - 1}" if count > 1 else str(first)


# ---- SGLang ----------------------------------------------------------------------------------


def _sglang_args(profile: HardwareProfile, quant: str) -> tuple[list[str], list[str]]:
    """(topology args, worker args) of the panel's Low Latency cell for this hardware."""
    quantization = SGLANG_QUANTIZATION.get((profile.vendor, quant))
    top = [sglang.QUANTIZATION, quantization] if quantization else []
    worker: list[str] = []
    if profile.vendor is Vendor.NVIDIA and quant == "nvfp4":
        worker += [sglang.MOE_RUNNER_BACKEND, SGLANG_MOE_RUNNER[profile.arch]]
    if not profile.has_gpus:
        worker += ["--device", "cpu"]
    worker += SGLANG_PARSERS
    if profile.draft_attention:
        worker += dflash(profile.draft_attention)
    return top, worker


def _sglang_agg(profile: HardwareProfile, quant: str) -> Draft:
    top, worker = _sglang_args(profile, quant)
    source = {
        Vendor.NVIDIA: "SGLang cookbook Deployment panel, Low Latency strategy (DFlash V2, section 3.5)"
        + (", H200 configuration (section 2)" if profile.arch == "hopper" else ""),
        Vendor.AMD: "SGLang cookbook Deployment panel, Low Latency strategy (DFlash V2 with triton draft "
        "attention, section 3.5)" + ("; NVFP4 direct load as MXFP4 (section 1)" if quant == "nvfp4" else ""),
    }.get(
        profile.vendor,
        "SGLang cookbook section 2, Xeon CPU service configuration (--page-size 1, TP = NUMA nodes)",
    )
    draft = Draft(
        f"SGLang {quant.upper()} on {profile.display}",
        source + ".\nDerived from the documented flags; "
        "the panel's full command is not printed in the cookbook.",
        profile.name,
        CHECKPOINTS[quant],
        "sglang",
        args=top,
    )
    role: dict[str, Any] = {"kind": "worker"}
    if profile.has_gpus:
        nodes = _nodes_for(profile, quant)
        tp = profile.gpus_per_node * nodes
        if nodes > 1:
            draft.nodes, draft.host = nodes, EXAMPLE_ADDRESSES.format(1)
            draft.source += (
                "\nThe checkpoint spans nodes; their addresses are examples: put yours under nodes:."
            )
            role["nodes"] = [f"node{i}" for i in range(nodes)]
        role.update(gpus=_gpus(profile.gpus_per_node), port=SGLANG_PORT, tp=tp, ep=tp)
        if nodes > 1:
            role["dist_init_port"] = DEFAULT_DIST_INIT_PORT
    else:
        role["port"] = SGLANG_PORT
        if profile.arch == "xeon":
            role["tp"] = XEON_TP
        role["page_size"] = 1
    role["args"] = worker
    draft.roles["server"] = role
    return draft


def _sglang_pd(profile: HardwareProfile, quant: str) -> Draft:
    if profile.arch == "blackwell" and profile.gpus_per_node == 4:
        return _sglang_pd_trays(profile, quant)
    if profile.arch != "blackwell" or profile.gpus_per_node < 8:
        _half_node_fits(profile, quant)  # says why on a 4-GPU tray or H200
        raise Unsupported(
            "the cookbook runs prefill/decode with Mooncake over NVLink on an 8-GPU Blackwell host (3.3, 3.6)"
        )
    _half_node_fits(profile, quant)
    top, worker = _sglang_args(profile, quant)
    draft = Draft(
        f"SGLang prefill/decode with DFlash V2 on one {profile.display.split(' (')[0]} host",
        "SGLang cookbook Deployment panel, Low Latency, with Playground PD: 3.3's prefill and decode "
        "without the encoder,\nplus DFlash V2 (3.5) on both. Derived from the documented flags.",
        profile.name,
        CHECKPOINTS[quant],
        "sglang",
        args=top,
    )
    half = profile.gpus_per_node // 2
    for kind, first, port in (("prefill", 0, PREFILL_PORT), ("decode", half, DECODE_PORT)):
        draft.roles[kind] = {
            "kind": kind,
            "gpus": _gpus(half, first),
            "port": port,
            "tp": half,
            "ep": half,
            "transfer_backend": "mooncake",
            "bootstrap_port": sglang.DEFAULT_BOOTSTRAP_PORT,
            "env": dict(MOONCAKE_NVLINK_ENV),
            "args": worker,
        }
    draft.roles["router"] = {
        "kind": "router",
        "port": ROUTER_PORT,
        "prefill": ["prefill"],
        "decode": ["decode"],
    }
    return draft


def _sglang_pd_trays(profile: HardwareProfile, quant: str) -> Draft:
    """Prefill on one 4-GPU tray, decode on another, over Mooncake on multi-node NVLink: the pairing of
    cookbook 3.6 (topologies/helion-gb300.yaml) with both workers on the regular path."""
    if _nodes_for(profile, quant) > 1:
        raise Unsupported(
            f"the {quant.upper()} checkpoint needs more than one {profile.name} tray per worker"
        )
    top, worker = _sglang_args(profile, quant)
    tray = profile.display.split(" (")[0]
    draft = Draft(
        f"SGLang prefill/decode on two {tray} trays (Mooncake over multi-node NVLink)",
        "SGLang cookbook 3.6's pairing (topologies/helion-gb300.yaml), both workers on the regular "
        "path (TP4/EP4).\nTray addresses are examples: put yours under nodes:.",
        profile.name,
        CHECKPOINTS[quant],
        "sglang",
        host=EXAMPLE_ADDRESSES.format(1),
        nodes=2,
        args=top,
    )
    gpus = profile.gpus_per_node
    for kind, node, port in (("prefill", "node0", PREFILL_PORT), ("decode", "node1", DECODE_PORT)):
        draft.roles[kind] = {
            "kind": kind,
            "nodes": [node],
            "gpus": _gpus(gpus),
            "port": port,
            "tp": gpus,
            "ep": gpus,
            "transfer_backend": "mooncake",
            "bootstrap_port": sglang.DEFAULT_BOOTSTRAP_PORT,
            "env": dict(MOONCAKE_MNNVL_ENV),
            "args": worker,
        }
    draft.roles["router"] = {
        "kind": "router",
        "port": ROUTER_PORT,
        "prefill": ["prefill"],
        "decode": ["decode"],
    }
    return draft


def _sglang_epd(profile: HardwareProfile, quant: str) -> Draft:
    if profile.name != "b300" or quant != "nvfp4":
        raise Unsupported("the cookbook's EPD recipe (3.3) is NVFP4 on one 8xB300 host")
    top, _ = _sglang_args(profile, quant)
    serving = [sglang.MOE_RUNNER_BACKEND, "flashinfer_trtllm", *SGLANG_PARSERS]
    draft = Draft(
        "EPD on one 8xB300 host (SGLang + Mooncake), cookbook section 3.3",
        "SGLang cookbook 3.3 (Encode Prefill Decode Disaggregation), as printed: encoder TP2 on GPUs 0-1\n"
        "beside prefill TP4/EP4 at 0.8 memory, decode TP4/EP4 on GPUs 4-7, Mooncake over NVLink.",
        profile.name,
        CHECKPOINTS[quant],
        "sglang",
        args=top,
    )
    draft.roles["encoder"] = {
        "kind": "encoder",
        "gpus": [0, 1],
        "port": ENCODER_PORT,
        "tp": 2,
        "encoder_transfer_backend": "zmq_to_tokenizer",
    }
    for kind, gpus, port, fraction, encoder_port in (
        ("prefill", [0, 1, 2, 3], PREFILL_PORT, 0.8, ENCODER_BOOTSTRAP),
        ("decode", [4, 5, 6, 7], DECODE_PORT, 0.75, ENCODER_BOOTSTRAP + 2),
    ):
        draft.roles[kind] = {
            "kind": kind,
            "gpus": gpus,
            "port": port,
            "tp": 4,
            "ep": 4,
            "mem_fraction": fraction,
            "encoders": ["encoder"],
            "encoder_transfer_backend": "zmq_to_tokenizer",
            "encoder_bootstrap_port": encoder_port,
            "transfer_backend": "mooncake",
            "bootstrap_port": sglang.DEFAULT_BOOTSTRAP_PORT,
            "env": dict(MOONCAKE_NVLINK_ENV),
            "args": serving,
        }
    draft.roles["router"] = {
        "kind": "router",
        "port": ROUTER_PORT,
        "prefill": ["prefill"],
        "decode": ["decode"],
    }
    return draft


# ---- vLLM ------------------------------------------------------------------------------------


def _vllm_features(dspark: bool, amd: bool = False) -> list[str]:
    if not dspark:
        return list(VLLM_FEATURES)
    config = (
        {**DSPARK, "enable_adaptive_verification": False, "attention_backend": "ROCM_AITER_FA"}
        if amd
        else DSPARK
    )
    return [*VLLM_FEATURES, vllm.SPECULATIVE_CONFIG, json.dumps(config, separators=(",", ":"))]


def _vllm_agg(profile: HardwareProfile, quant: str) -> Draft:
    if profile.name == "cpu":
        return _vllm_cpu("agg")
    if not profile.has_gpus:
        raise Unsupported("the vLLM recipe serves NVIDIA and AMD GPUs only (vLLM on the CPU: --hardware cpu)")
    if profile.vendor is Vendor.AMD:
        return _vllm_amd(profile, quant)
    if quant == "nvfp4" and profile.arch != "blackwell":
        raise Unsupported("NVFP4 is the recipe's NVIDIA Blackwell path")
    nodes = _nodes_for(profile, quant)
    tp = profile.gpus_per_node * nodes
    dspark = quant == "nvfp4"  # DSpark is on by default for the NVFP4 variant only
    strategy = "multi_node_tep" if nodes > 1 else "single_node_tep"
    draft = Draft(
        f"vLLM TP{tp} + expert parallel{' with DSpark' if dspark else ''}, {quant.upper()} on "
        f"{profile.display}",
        f"vLLM recipe, strategy {strategy}, variant {'default' if quant == 'nvfp4' else quant}"
        f"{', DSpark on' if dspark else ''}.\nThe recipe's recommended_command on B200; elsewhere derived "
        f"from its strategy and features.",
        profile.name,
        CHECKPOINTS[quant],
        "vllm",
        env=dict(VLLM_ENV),
    )
    role: dict[str, Any] = {"kind": "worker"}
    if nodes > 1:
        draft.nodes, draft.host = nodes, EXAMPLE_ADDRESSES.format(1)
        draft.env.update(GLOO_SOCKET_IFNAME="eth0", NCCL_SOCKET_IFNAME="eth0")
        draft.source += (
            "\nNode addresses and the NIC (eth0, the recipe's $IFACE_NAME) are examples: put yours."
        )
        role["nodes"] = [f"node{i}" for i in range(nodes)]
    role.update(gpus=_gpus(profile.gpus_per_node), port=VLLM_PORT, tp=tp, ep=tp)
    if nodes > 1:
        role["dist_init_port"] = VLLM_MASTER_PORT
    role["args"] = _vllm_features(dspark)
    draft.roles["server"] = role
    return draft


def _vllm_amd(profile: HardwareProfile, quant: str) -> Draft:
    if quant not in VLLM_AMD_VARIANT_ARGS:
        raise Unsupported("the vLLM recipe's AMD variants are MXFP4 and BF16")
    tep = quant == "mxfp4"  # the guide: TP + EP for MXFP4 throughput, plain TP for BF16
    gpus = profile.gpus_per_node
    draft = Draft(
        f"vLLM TP{gpus}{' + expert parallel' if tep else ''}, {quant.upper()} on {profile.display}",
        f"vLLM recipe, strategy {'single_node_tep' if tep else 'single_node_tp'}, variant {quant}, with the "
        f"AMD overrides\n(hardware_overrides.amd and variants.{quant}.hardware_overrides.amd). DSpark is "
        f"opt-in on AMD (see topologies/vllm-tep-mi355x.yaml).",
        profile.name,
        CHECKPOINTS[quant],
        "vllm",
        env={**VLLM_ENV, **VLLM_AMD_ENV},
        args=[*VLLM_AMD_ARGS, *VLLM_AMD_VARIANT_ARGS[quant]],
    )
    role: dict[str, Any] = {"kind": "worker", "gpus": _gpus(gpus), "port": VLLM_PORT, "tp": gpus}
    if tep:
        role["ep"] = gpus
    role["args"] = _vllm_features(False)
    draft.roles["server"] = role
    return draft


def _vllm_pd(profile: HardwareProfile, quant: str) -> Draft:
    if profile.name == "cpu":
        return _vllm_cpu("pd")
    if profile.vendor is not Vendor.NVIDIA:
        raise Unsupported(
            "the vLLM recipe runs prefill/decode on NVIDIA only (AMD: TP and TP + expert parallel)"
        )
    if quant == "nvfp4" and profile.arch != "blackwell":
        raise Unsupported("NVFP4 is the recipe's NVIDIA Blackwell path")
    _half_node_fits(profile, quant)
    half = profile.gpus_per_node // 2
    draft = Draft(
        f"vLLM prefill/decode over NIXL on one {profile.display.split(' (')[0]} node behind vllm-router",
        "vLLM recipe, strategy pd_cluster on one node (prefill and decode each on half the GPUs),\n"
        "NixlConnector with per-instance side-channel ports, vllm-router round robin. Derived from the "
        "strategy.",
        profile.name,
        CHECKPOINTS[quant],
        "vllm",
    )
    dspark = quant == "nvfp4"
    for kind, first, port, side in (
        ("prefill", 0, VLLM_PREFILL_PORT, VLLM_SIDE_CHANNELS[0]),
        ("decode", half, VLLM_DECODE_PORT, VLLM_SIDE_CHANNELS[1]),
    ):
        graphs = ["--compilation-config", '{"cudagraph_mode":"FULL_DECODE_ONLY"}'] if kind == "decode" else []
        draft.roles[kind] = {
            "kind": kind,
            "gpus": _gpus(half, first),
            "port": port,
            "tp": half,
            "transfer_backend": "nixl",
            "kv_transfer_config": {"kv_load_failure_policy": "fail"},
            "side_channel_port": side,
            "env": dict(VLLM_ENV),
            "args": [*graphs, *_vllm_features(dspark)],
        }
    draft.roles["router"] = {
        "kind": "router",
        "engine": "vllm-router",
        "port": VLLM_PORT,
        "prefill": ["prefill"],
        "decode": ["decode"],
        "args": ["--policy", "round_robin", "--intra-node-data-parallel-size", "1"],
    }
    return draft


# vLLM on the CPU with a tiny local model (examples/*-vllm-cpu.yaml): both variables come from
# `eval "$(bash scripts/vllm_cpu_setup.sh)"`.
VLLM_CPU_MODEL, VLLM_CPU_PYTHON = "${env:MUSE_LAUNCH_TINY_MODEL}", "${env:MUSE_LAUNCH_VLLM_PYTHON}"
VLLM_CPU_ARGS = [
    vllm.SERVED_MODEL_NAME,
    "tiny",
    "--dtype",
    "float32",
    "--max-model-len",
    "512",
    "--disable-access-log-for-endpoints",
    "/health,/metrics",
]
VLLM_CPU_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
VLLM_CPU_PORTS = {
    "agg": {"worker": 18400, "router": 18410},
    "pd": {"prefill": 18300, "decode": 18301, "router": 18310},
}
VLLM_CPU_KV = "/tmp/muse-launch-pd-vllm-cpu-kv"
SLOW_START = {"timeout": 600}  # a loaded 2-core machine needs 70-90 s cold


def _vllm_cpu(mode: str) -> Draft:
    """examples/agg-vllm-cpu.yaml (a worker behind sglang-router) or examples/pd-vllm-cpu.yaml (prefill and
    decode over ExampleConnector behind vllm-router)."""
    ports = VLLM_CPU_PORTS[mode]
    draft = Draft(
        f"vLLM {'prefill/decode' if mode == 'pd' else 'server'} on the CPU with a tiny local model",
        "examples/" + ("pd" if mode == "pd" else "agg") + "-vllm-cpu.yaml. First: "
        'eval "$(bash scripts/vllm_cpu_setup.sh)"\n(the vLLM-CPU venv and the tiny model: it sets '
        "MUSE_LAUNCH_VLLM_PYTHON and MUSE_LAUNCH_TINY_MODEL).",
        "cpu",
        VLLM_CPU_MODEL,
        "vllm",
        bind="127.0.0.1",
        launcher=[VLLM_CPU_PYTHON, "-m", "vllm.entrypoints.openai.api_server"],
        args=list(VLLM_CPU_ARGS),
    )
    metrics = {"metrics_port": ports["router"] + 1}  # the default (port + 21000) is in the ephemeral range
    if mode == "agg":
        draft.roles["worker"] = {
            "kind": "worker",
            "port": ports["worker"],
            "env": dict(VLLM_CPU_ENV),
            "ready": {"http": "/v1/models", **SLOW_START},
        }
        draft.roles["router"] = {
            "kind": "router",
            "port": ports["router"],
            **metrics,
            "workers": ["worker"],
            "ready": {"http": "/readiness", **SLOW_START},
        }
        return draft
    draft.env = dict(VLLM_CPU_ENV)
    for core, kind in enumerate(("prefill", "decode")):
        draft.roles[kind] = {
            "kind": kind,
            "port": ports[kind],
            "transfer_backend": "example",
            "kv_transfer_config": {"kv_connector_extra_config": {"shared_storage_path": VLLM_CPU_KV}},
            "env": {"VLLM_CPU_OMP_THREADS_BIND": str(core)},
            "ready": {"http": "/v1/models", **SLOW_START},
        }
    draft.roles["router"] = {
        "kind": "router",
        "engine": "vllm-router",
        "port": ports["router"],
        **metrics,
        "prefill": ["prefill"],
        "decode": ["decode"],
        # its readiness follows its workers' within a second (the router's own start-up default)
        "args": [
            "--policy",
            "round_robin",
            *(x for pair in vllm_router.ENGINE.FACTS.startup_defaults for x in pair),
        ],
        "ready": {"http": "/readiness", **SLOW_START},
    }
    return draft


def _vllm_epd(profile: HardwareProfile, quant: str) -> Draft:
    raise Unsupported("the vLLM recipe has no encoder disaggregation (the cookbook's EPD is SGLang on b300)")
