"""Where an argument of a rendered command comes from in the file: the role's `args`, the top-level
`args`, or the key that renders it. The engine check points its findings there."""

from __future__ import annotations

from collections.abc import Iterable

from ..engines import ENGINES, router, sglang, vllm
from ..plan.spec import LaunchSpec
from ..topology.load import Path_
from ..topology.model import Topology

# Flags the renderers write from keys other than KEY_FLAGS' (the key a finding points at).
RENDERED_FROM = {
    sglang.ENCODER_ONLY: ("kind",),
    sglang.DISAGGREGATION_MODE: ("kind",),
    sglang.LANGUAGE_ONLY: ("encoders",),
    vllm.KV_TRANSFER_CONFIG: ("kv_transfer_config", "transfer_backend"),
    sglang.NNODES: ("nodes",),
    sglang.NODE_RANK: ("nodes",),
    sglang.DIST_INIT_ADDR: ("nodes", "dist_init_port"),
    vllm.MASTER_ADDR: ("nodes",),
    vllm.MASTER_PORT: ("dist_init_port", "nodes"),
    vllm.DP_SIZE_LOCAL: ("dp", "nodes"),
    vllm.DP_ADDRESS: ("nodes",),
    vllm.DP_RPC_PORT: ("dist_init_port", "nodes"),
    vllm.DP_START_RANK: ("nodes",),
    vllm.ENABLE_EXPERT_PARALLEL: ("ep",),
    vllm.HEADLESS: ("nodes",),
    router.METRICS_HOST: ("bind",),
}


def norm(token: str) -> str:
    """vLLM reads --max_num_seqs as --max-num-seqs: compare option names that way."""
    if token.startswith("--"):
        name, eq, value = token.partition("=")
        return name.replace("_", "-") + eq + value
    return token


def find_flag(source: Iterable[str], flags: list[str], value: str | None) -> int | None:
    """Index of the flag in source: the occurrence with this value if one has it, else the first."""
    source = list(source)
    names = {norm(f) for f in flags}
    first = None
    for i, arg in enumerate(source):
        name, eq, inline = norm(arg).partition("=")
        if name in names:
            given = inline if eq else (source[i + 1] if i + 1 < len(source) else None)
            if value is None or given == value:
                return i
            first = i if first is None else first
    return first


def keys_for(engine: str, flags: Iterable[str]) -> list[str]:
    """The topology keys that render these flags, per the engine's KEY_FLAGS, SHADOWED and WIRING."""
    known = ENGINES.get(engine)
    keys: list[str] = []
    for flag in flags:
        if known is not None:
            keys += [key for key, spellings in known.KEY_FLAGS.items() if flag in spellings]
            keys += [table[flag] for table in (known.SHADOWED, known.WIRING) if flag in table]
        keys += RENDERED_FROM.get(flag, ())
    return list(dict.fromkeys(keys))


def locate(topology: Topology, spec: LaunchSpec, flags: Iterable[str], value: str | None) -> Path_:
    """The YAML path of the argument: the role's args, the top-level args, else the key that renders it."""
    role = topology.roles[spec.role]
    flags = [f for f in flags if f]
    for source, prefix in ((role.args, ("roles", spec.role, "args")), (topology.args, ("args",))):
        at = find_flag(source, flags, value)
        if at is not None:
            return prefix + (at,)
    for key in keys_for(spec.engine, flags):
        if getattr(role, key, None) not in (None, [], {}, ()):
            return ("roles", spec.role, key)
        if key in type(topology).model_fields and getattr(topology, key, None) not in (None, [], {}):
            return (key,)
    if value is not None:  # a value rendered from a key: find the key by its value
        for key, given in role.model_dump(exclude_none=True).items():
            if str(given) == value:
                return ("roles", spec.role, key)
    return ("roles", spec.role)


def locate_tokens(topology: Topology, spec: LaunchSpec, tokens: list[str]) -> Path_:
    role = topology.roles[spec.role]
    for token in tokens:
        for source, prefix in ((role.args, ("roles", spec.role, "args")), (topology.args, ("args",))):
            for i, arg in enumerate(source):
                if (
                    norm(arg) == norm(token)
                    or norm(arg).split("=", 1)[0] == norm(token).split("=", 1)[0]
                    and token.startswith("-")
                ):
                    return prefix + (i,)
    return locate(topology, spec, [t for t in tokens if t.startswith("-")], None)
