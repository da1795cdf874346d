"""Plan-level rules of SPEC section 3.

Each rule reads the argv `up` would run (LaunchSpec.args), so a flag given in `args` counts the
same as the structured key that renders it; findings point at whichever of the two decided.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable, Iterator

from ..plan.sglang import DEFAULT_BOOTSTRAP_PORT
from ..plan.render import has_flag, last_value
from ..plan.spec import LaunchSpec
from .checks import CheckContext, Finding, error, plan_check, warning
from .hardware import CHECKPOINT_VRAM_GB, PROFILES, Vendor
from .load import Path_

ENGINE_WORKERS = ("sglang", "vllm")
ROUTERS = ("sglang-router", "smg", "vllm-router")
UNSPECIFIED = ("0.0.0.0", "::", "[::]")
NVFP4_CHECKPOINT = "meta-models/Muse-Spark-Open-816B-A42B-NVFP4"
MXFP4_CHECKPOINT = "amd/Muse-Spark-Open-816B-A42B-Quark-MXFP4"
DFLASH_DRAFT = "RadixArk/Muse-Spark-Open-DFlash2"
SP = "--enable-layernorm-sp"
MEGAMOE = "--enable-megamoe-for-layernorm-sp"
MIN_HEADROOM = 0.1  # memory share left to a GPU-sharing role without mem_fraction (the cookbook leaves 0.2)

PORT_KEYS = {"http": "port", "bootstrap": "bootstrap_port", "encoder_bootstrap": "encoder_bootstrap_port",
             "metrics": "metrics_port", "side_channel": "side_channel_port", "dist_init": "dist_init_port"}
PORT_NAMES = {"http": "HTTP", "bootstrap": "KV bootstrap", "encoder_bootstrap": "encoder bootstrap",
              "metrics": "metrics", "side_channel": "side-channel", "dist_init": "dist-init"}
# The flag that decides each bound port, per engine (the renderers put --port last, so it is the key's).
PORT_FLAGS = {
    "vllm": {"dist_init": "--master-port"},  # SGLang's plan ports are read from its final argv already
    **{router: {"metrics": "--prometheus-port"} for router in ROUTERS},
}
# Structured keys and the engine flags they render: a flag in `args` overrides its key.
KEY_FLAGS = {
    "sglang": {"model": ("--model-path",), "tp": ("--tp-size", "--tensor-parallel-size"),
               "ep": ("--ep-size", "--expert-parallel-size"), "dp": ("--dp-size", "--data-parallel-size"),
               "pp": ("--pp-size", "--pipeline-parallel-size"), "mem_fraction": ("--mem-fraction-static",),
               "transfer_backend": ("--disaggregation-transfer-backend",),
               "bootstrap_port": ("--disaggregation-bootstrap-port",),
               "encoder_bootstrap_port": ("--encoder-bootstrap-port",),
               "encoder_transfer_backend": ("--encoder-transfer-backend",),
               "kv_cache_dtype": ("--kv-cache-dtype",), "page_size": ("--page-size",)},
    "vllm": {"tp": ("--tensor-parallel-size", "-tp"), "pp": ("--pipeline-parallel-size", "-pp"),
             "dp": ("--data-parallel-size", "-dp"), "mem_fraction": ("--gpu-memory-utilization",),
             "kv_cache_dtype": ("--kv-cache-dtype",), "page_size": ("--block-size",)},
}
# Flags the renderers write after `args`, so that the structured key wins over them.
SHADOWED = {"--host": "bind", "--port": "port", "--prometheus-port": "metrics_port"}
# Wiring muse-launch renders from references; the same flag in args rewires behind the checks' back.
WIRING_FLAGS = {"--encoder-urls": "encoders", "--prefill": "prefill", "--decode": "decode",
                "--worker-urls": "workers"}
INTEGER_FLAGS = ("--tp-size", "--tensor-parallel-size", "--ep-size", "--expert-parallel-size", "--dp-size",
                 "--data-parallel-size", "--pp-size", "--pipeline-parallel-size", "--nnodes", "--page-size",
                 "--block-size", "--speculative-num-draft-tokens", "--disaggregation-bootstrap-port",
                 "--encoder-bootstrap-port", "-tp", "-pp", "-dp")
SGLANG_CHOICES = {
    "--disaggregation-mode": ("null", "prefill", "decode"),
    "--disaggregation-transfer-backend": ("mooncake", "nixl", "ascend", "fake", "mori", "mooncake_tcp"),
    "--encoder-transfer-backend": ("auto", "zmq_to_scheduler", "zmq_to_tokenizer", "mooncake"),
}
VLLM_CONNECTORS = ("NixlConnector", "MooncakeConnector", "ExampleConnector", "LMCacheConnectorV1",
                   "MultiConnector", "OffloadingConnector")


# ---- reading the rendered plan -------------------------------------------------------------

def _value(args: Iterable[str], *flags: str) -> str | None:
    """The value argparse keeps: the last occurrence of any spelling of the option."""
    args = tuple(args)
    found, at = None, -1
    for flag in flags:
        value = last_value(args, flag)
        if value is not None:
            index = _last_index(args, (flag,))
            if index is not None and index > at:
                found, at = value, index
    return found


def _last_index(args: Iterable[str], flags: Iterable[str]) -> int | None:
    flags = tuple(flags)
    found = None
    for i, arg in enumerate(args):
        if any(arg == f or arg.startswith(f + "=") for f in flags):
            found = i
    return found


def _int(text: object) -> int | None:
    try:
        return int(str(text))
    except ValueError:
        return None


def _float(text: object) -> float | None:
    try:
        return float(str(text))
    except ValueError:
        return None


@dataclass(frozen=True)
class Parallel:
    tp: int = 1
    ep: int = 1
    dp: int = 1
    pp: int = 1
    nnodes: int = 1
    dp_attention: bool = False

    @property
    def ranks(self) -> int:
        """GPUs the role occupies: SGLang's attention DP runs on the TP GPUs."""
        return self.tp * self.pp * (1 if self.dp_attention else self.dp)

    def describe(self) -> str:
        if self.dp_attention:
            return f"tp {self.tp} x pp {self.pp} (dp {self.dp} shares the TP GPUs under --enable-dp-attention)"
        return f"tp {self.tp} x dp {self.dp} x pp {self.pp}"


def _parallel(ctx: CheckContext, spec: LaunchSpec) -> Parallel | None:
    """Parallel sizes from argv; None when one is not a positive whole number (integer_options says so)."""
    flags = KEY_FLAGS[spec.engine]
    sizes: dict[str, int] = {}
    for key in ("tp", "ep", "dp", "pp"):
        raw = _value(spec.args, *flags[key]) if key in flags else None
        value = 1 if raw is None else _int(raw)
        if value is None or value < 1:
            return None
        sizes[key] = value
    # vLLM's DP across nodes renders no --nnodes: the role's node list says it.
    nnodes = _int(last_value(spec.args, "--nnodes") or len(ctx.topology.roles[spec.role].nodes) or 1)
    if nnodes is None or nnodes < 1:
        return None
    return Parallel(**sizes, nnodes=nnodes, dp_attention=spec.engine == "sglang"
                    and has_flag(spec.args, "--enable-dp-attention"))


def _model(spec: LaunchSpec) -> str | None:
    if spec.engine == "vllm":
        named = last_value(spec.args, "--model")
        return named or (spec.args[0] if spec.args and not spec.args[0].startswith("-") else None)
    return _value(spec.args, "--model-path", "--model")


def _transfer_backend(spec: LaunchSpec) -> str:
    if spec.engine == "vllm":
        return str(_kv_transfer_config(spec).get("kv_connector", "none"))
    return last_value(spec.args, "--disaggregation-transfer-backend") or "mooncake"  # SGLang's default


def _kv_transfer_config(spec: LaunchSpec) -> dict:
    raw = last_value(spec.args, "--kv-transfer-config")
    try:
        config = json.loads(raw) if raw else {}
    except json.JSONDecodeError:
        return {}
    return config if isinstance(config, dict) else {}


def _mem_fraction(spec: LaunchSpec) -> float | None:
    flag = {"sglang": "--mem-fraction-static", "vllm": "--gpu-memory-utilization"}.get(spec.engine)
    return _float(last_value(spec.args, flag)) if flag and last_value(spec.args, flag) else None


def bound_ports(spec: LaunchSpec) -> dict[str, int]:
    """The ports this process binds, as its final argv says (a port given in `args` wins)."""
    ports = dict(spec.ports)
    for kind, flag in PORT_FLAGS.get(spec.engine, {}).items():
        value = _int(last_value(spec.args, flag)) if kind in ports else None
        if value is not None:
            ports[kind] = value
    return ports


def _is_loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")


def _machine(spec: LaunchSpec) -> str:
    """Which host a process runs on: loopback spellings are all this host."""
    return "this host" if _is_loopback(spec.host) or spec.host in UNSPECIFIED else spec.host


def _roles(ctx: CheckContext, engines: tuple[str, ...] = ENGINE_WORKERS) -> Iterator[LaunchSpec]:
    """One spec per role: replicas and node ranks share their flags, so rules on flags judge one."""
    seen: set[str] = set()
    for spec in ctx.plan.specs:
        if spec.engine in engines and spec.role not in seen:
            seen.add(spec.role)
            yield spec


def _origin(ctx: CheckContext, spec: LaunchSpec, flags: Iterable[str] | str, key: str | None = None) -> Path_:
    """Where the effective value of a flag comes from: the role's args, its key, the top-level args or key."""
    flags = (flags,) if isinstance(flags, str) else tuple(flags)
    role = ctx.topology.roles[spec.role]
    at = _last_index(role.args, flags)
    if at is not None:
        return ("roles", spec.role, "args", at)
    if key and getattr(role, key, None) not in (None, [], {}):
        return ("roles", spec.role, key)
    at = _last_index(ctx.topology.args, flags)
    if at is not None:
        return ("args", at)
    if key in type(ctx.topology).model_fields and getattr(ctx.topology, key) is not None:
        return (key,)
    return ("roles", spec.role, key) if key else ("roles", spec.role, "args")


def _gpu_text(gpus: Iterable[int]) -> str:
    """[0, 1, 2, 3] -> '0-3'; [0, 2] -> '0,2'."""
    gpus = sorted(gpus)
    if len(gpus) > 1 and gpus == list(range(gpus[0], gpus[-1] + 1)):
        return f"{gpus[0]}-{gpus[-1]}"
    return ",".join(map(str, gpus))


def _free_gpus(ctx: CheckContext, spec: LaunchSpec, count: int) -> list[int] | None:
    """`count` GPUs no other process on the spec's host uses; None when too few are free."""
    taken = {g for s in ctx.plan.specs if s.name != spec.name and _machine(s) == _machine(spec) for g in s.gpus}
    free = [g for g in range(ctx.profile.gpus_per_node) if g not in taken]
    return free[:count] if count and len(free) >= count else None


def _free_port(used: set[int], after: int) -> int:
    port = after + 1
    while port in used:
        port += 1
    return port


def _join(names: Iterable[str]) -> str:
    names = list(names)
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


# ---- GPUs and parallelism -------------------------------------------------------------------

@plan_check
def gpu_indices(ctx: CheckContext) -> Iterator[Finding]:
    """GPU indices exist on the profile, appear once per role, and CPU profiles take none."""
    profile = ctx.profile
    for name, role in ctx.topology.roles.items():
        gpus = role.gpus or []
        if gpus and not profile.has_gpus:
            yield warning(("roles", name, "gpus"), f"{ctx.topology.hardware} has no GPUs, so {name}'s gpus are "
                          f"ignored", "remove gpus (CPU serving uses TP across NUMA nodes, not GPU indices)", name)
            continue
        for i, gpu in enumerate(gpus):
            if gpu >= profile.gpus_per_node:
                yield error(("roles", name, "gpus", i), f"GPU {gpu} does not exist: a {profile.name} node has GPUs "
                            f"0-{profile.gpus_per_node - 1}", f"use GPUs 0-{profile.gpus_per_node - 1} (GPUs on "
                            f"other nodes take the same indices under nodes: [...])", name)
            elif gpus.index(gpu) != i:
                yield error(("roles", name, "gpus", i), f"GPU {gpu} is listed twice", "list each GPU once", name)


@plan_check
def gpus_required(ctx: CheckContext) -> Iterator[Finding]:
    """On a GPU profile an engine worker without gpus would see, and grab, every GPU of the host."""
    if not ctx.profile.has_gpus:
        return
    for spec in _roles(ctx):
        if not spec.gpus:
            p = _parallel(ctx, spec)
            count = p.ranks // p.nnodes if p and p.ranks % p.nnodes == 0 else 1
            free = _free_gpus(ctx, spec, count)
            yield error(("roles", spec.role, "gpus"), f"{spec.role} has no gpus on {ctx.topology.hardware}, so it "
                        f"would see every GPU of the host",
                        f"give {spec.role} gpus: {free}" if free else f"give {spec.role} {count} GPUs with gpus: [...]",
                        spec.role)


@plan_check
def parallel_fits_gpus(ctx: CheckContext) -> Iterator[Finding]:
    """TP x DP x PP (per node) against the role's GPUs and the profile's GPUs per node."""
    if not ctx.profile.has_gpus:
        return
    per_host = ctx.profile.gpus_per_node
    for spec in _roles(ctx):
        p = _parallel(ctx, spec)
        if p is None:
            continue
        name = spec.role
        if p.ranks % p.nnodes:
            yield error(("roles", name, "nodes"), f"{p.describe()} = {p.ranks} GPUs do not split evenly over "
                        f"{p.nnodes} nodes", f"use a node count that divides {p.ranks}, or change tp/pp/dp", name)
            continue
        need = p.ranks // p.nnodes
        per_node = " per node" if p.nnodes > 1 else ""
        tp_at = _origin(ctx, spec, KEY_FLAGS[spec.engine]["tp"], "tp")
        if need > per_host:
            nodes = math.ceil(p.ranks / per_host)
            yield error(tp_at, f"{p.describe()} needs {need} GPUs{per_node}, but a {ctx.profile.name} node has "
                        f"{per_host}", f"lower tp, or span {nodes} nodes with nodes: [...]", name)
        elif spec.gpus and need > len(spec.gpus):
            free = _free_gpus(ctx, spec, need)
            yield error(("roles", name, "gpus"), f"{p.describe()} needs {need} GPUs{per_node}, but {name} has "
                        f"{len(spec.gpus)} (GPUs {_gpu_text(spec.gpus)})",
                        f"give {name} {need} GPUs{f' (e.g. {_gpu_text(free)})' if free else ''}, or lower tp to "
                        f"{max(1, len(spec.gpus) // (p.ranks // p.tp))}", name)
        elif spec.gpus and need < len(spec.gpus):
            idle = spec.gpus[need:]
            yield warning(("roles", name, "gpus"), f"{p.describe()} uses {need} of {name}'s {len(spec.gpus)} GPUs; "
                          f"GPUs {_gpu_text(idle)} stay idle",
                          f"give {name} GPUs {_gpu_text(spec.gpus[:need])}, or raise tp to {len(spec.gpus)}", name)


@plan_check
def sglang_parallel_rules(ctx: CheckContext) -> Iterator[Finding]:
    """SGLang refuses MoE EP that does not divide TP, and attention DP that does not divide TP."""
    for spec in _roles(ctx, ("sglang",)):
        p = _parallel(ctx, spec)
        if p is None:
            continue
        if p.tp % p.ep:
            divisors = [d for d in range(1, p.tp + 1) if p.tp % d == 0]
            yield error(_origin(ctx, spec, KEY_FLAGS["sglang"]["ep"], "ep"), f"ep {p.ep} does not divide tp {p.tp}",
                        f"use ep {', '.join(map(str, divisors))} (MoE EP splits the TP group)", spec.role)
        if p.dp_attention and p.tp % p.dp:
            yield error(_origin(ctx, spec, KEY_FLAGS["sglang"]["dp"], "dp"), f"--enable-dp-attention needs dp to "
                        f"divide tp; {spec.role} has tp {p.tp}, dp {p.dp}", f"set dp to a divisor of {p.tp}", spec.role)


@plan_check
def shared_gpus(ctx: CheckContext) -> Iterator[Finding]:
    """GPUs shared by roles need memory budgets that fit (the cookbook: encoder beside prefill at 0.8)."""
    users: dict[tuple[str, int], list[LaunchSpec]] = defaultdict(list)
    for spec in ctx.plan.specs:
        for gpu in spec.gpus:
            users[(_machine(spec), gpu)].append(spec)
    groups: dict[tuple[str, ...], list[int]] = defaultdict(list)
    for (_, gpu), specs in sorted(users.items(), key=lambda kv: kv[0][1]):
        if len(specs) > 1:
            groups[tuple(s.name for s in specs)].append(gpu)
    by_name = {s.name: s for s in ctx.plan.specs}
    for names, gpus in groups.items():
        specs = [by_name[n] for n in names]
        last, others = specs[-1], specs[:-1]
        fractions = {s.name: _mem_fraction(s) for s in specs}
        undeclared = [s for s in specs if fractions[s.name] is None]
        total = sum(f for f in fractions.values() if f is not None)
        budget = " + ".join(f"{n} {f:g}" for n, f in fractions.items() if f is not None)
        shared = f"GPU{'s' if len(gpus) > 1 else ''} {_gpu_text(gpus)} {'are' if len(gpus) > 1 else 'is'} also " \
                 f"used by {_join(s.name for s in others)}"
        free = _free_gpus(ctx, last, len(last.gpus))
        move = f"give {last.role} GPUs {_gpu_text(free)} or " if free else ""
        if len(undeclared) > 1:
            # The cookbook leaves the encoder at its default and budgets the role beside it.
            budgeted = [s for s in undeclared if s.kind != "encoder"][: len(undeclared) - 1] or undeclared[:-1]
            yield error(("roles", last.role, "gpus"), f"{shared}, and {_join(s.name for s in undeclared)} set no "
                        f"mem_fraction, so each takes its engine's default share",
                        f"{move}set {_join(s.role + '.mem_fraction' for s in budgeted)} (the cookbook runs prefill at "
                        f"0.8 beside its encoder)", *names)
        elif total > 1.0:
            top = max((s for s in specs if fractions[s.name] is not None), key=lambda s: fractions[s.name])
            yield error(("roles", last.role, "gpus"), f"{shared}, and their memory budgets add up to {total:g} "
                        f"({budget})", f"{move}lower {top.role}.mem_fraction so the sum stays below 1.0", *names)
        elif undeclared and 1.0 - total < MIN_HEADROOM:
            top = max((s for s in specs if fractions[s.name] is not None), key=lambda s: fractions[s.name])
            most = 1.0 - MIN_HEADROOM - (total - fractions[top.name])
            yield error(("roles", last.role, "gpus"), f"{shared}, and {budget} leaves {1.0 - total:.2f} of their "
                        f"memory to {undeclared[0].name}", f"{move}lower {top.role}.mem_fraction to {most:.2f} or less",
                        *names)


@plan_check
def checkpoint_memory(ctx: CheckContext) -> Iterator[Finding]:
    """The checkpoint's VRAM minimum against the role's GPUs x memory (x nodes); encoders load no experts."""
    profile = ctx.profile
    if not profile.has_gpus:
        return
    for spec in _roles(ctx):
        need = CHECKPOINT_VRAM_GB.get(_model(spec) or "")
        p = _parallel(ctx, spec)
        if spec.kind == "encoder" or need is None or not spec.gpus or p is None:
            continue
        have = len(spec.gpus) * p.nnodes * profile.memory_gb
        if have < need:
            nodes = f" x {p.nnodes} nodes" if p.nnodes > 1 else ""
            least = math.ceil(need / profile.memory_gb)
            span = f" (span {math.ceil(least / profile.gpus_per_node)} nodes)" if least > profile.gpus_per_node else ""
            yield error(("roles", spec.role, "gpus"), f"{_model(spec)} needs at least {need} GB of GPU memory; "
                        f"{spec.role} has {len(spec.gpus)} GPUs{nodes} x {profile.memory_gb} GB = {have} GB on "
                        f"{profile.name}", f"give {spec.role} at least {least} GPUs{span}, or a smaller checkpoint",
                        spec.role)


# ---- ports ----------------------------------------------------------------------------------

@plan_check
def duplicate_ports(ctx: CheckContext) -> Iterator[Finding]:
    """Two servers on one host binding one port, counting only ports a server really binds."""
    bound = {spec.name: bound_ports(spec) for spec in ctx.plan.specs}
    used: dict[str, set[int]] = defaultdict(set)
    for spec in ctx.plan.specs:
        used[_machine(spec)].update(bound[spec.name].values())
    seen: dict[tuple[str, int], tuple[LaunchSpec, str]] = {}
    for spec in ctx.plan.specs:
        for kind, port in bound[spec.name].items():
            key = (_machine(spec), port)
            if key not in seen:
                seen[key] = (spec, kind)
                continue
            other, other_kind = seen[key]
            if kind == other_kind == "encoder_bootstrap":
                continue  # encoder_bootstrap_ports says it the cookbook's way
            port_key = _port_key(kind)
            flag = PORT_FLAGS.get(spec.engine, {}).get(kind, ())
            replicas = ctx.topology.roles[spec.role].replicas
            example = "" if replicas > 1 else f" {_free_port(used[key[0]], port)}"
            yield error(_origin(ctx, spec, flag, port_key),
                        f"{spec.name} binds {_port_name(kind)} port {port}, already the "
                        f"{_port_name(other_kind)} port of {other.name} on {key[0]}",
                        f"give {spec.role} {port_key}{example}" + (" (ports step by one per replica)" if replicas > 1
                                                                   else ""), spec.name, other.name)


@plan_check
def encoder_bootstrap_ports(ctx: CheckContext) -> Iterator[Finding]:
    """Every --language-only worker binds its own encoder bootstrap server: one port each per host."""
    used: dict[str, set[int]] = defaultdict(set)
    for spec in ctx.plan.specs:
        used[_machine(spec)].update(bound_ports(spec).values())
    seen: dict[tuple[str, int], LaunchSpec] = {}
    for spec in ctx.plan.specs:
        port = bound_ports(spec).get("encoder_bootstrap") if spec.engine == "sglang" else None
        if port is None:
            continue
        key = (_machine(spec), port)
        if key not in seen:
            seen[key] = spec
            continue
        other = seen[key]
        free = _free_port(used[key[0]], port)
        used[key[0]].add(free)
        yield error(_origin(ctx, spec, "--encoder-bootstrap-port", "encoder_bootstrap_port"),
                    f"{spec.name} and {other.name} both bind encoder bootstrap port {port} on {key[0]}; each "
                    f"--language-only worker needs its own",
                    f"give {spec.role} encoder_bootstrap_port {free}", spec.name, other.name)


def _port_key(kind: str) -> str:
    """The YAML key of a plan port kind; vLLM numbers extra side channels side_channel_1, _2, ..."""
    return PORT_KEYS.get(kind.rstrip("_0123456789"), "port")


def _port_name(kind: str) -> str:
    return PORT_NAMES.get(kind.rstrip("_0123456789"), kind.replace("_", " "))


def _router_prefills(spec: LaunchSpec) -> Iterator[tuple[str, str | None]]:
    """(URL, bootstrap port or None) of each `--prefill URL [PORT|none]` in a router's argv."""
    args = spec.args
    for i, arg in enumerate(args):
        if arg == "--prefill" and i + 1 < len(args):
            nxt = args[i + 2] if i + 2 < len(args) else None
            yield args[i + 1], nxt if nxt is not None and not nxt.startswith("-") else None


def _router_decodes(spec: LaunchSpec) -> list[str]:
    return [spec.args[i + 1] for i, a in enumerate(spec.args[:-1]) if a == "--decode"]


def _by_url(ctx: CheckContext) -> dict[str, LaunchSpec]:
    return {s.url: s for s in ctx.plan.specs if s.url}


@plan_check
def router_bootstrap_port(ctx: CheckContext) -> Iterator[Finding]:
    """The port the router tells decode to fetch KV from is the one the prefill really binds."""
    by_url = _by_url(ctx)
    for router in _roles(ctx, ("sglang-router", "smg")):
        for url, told in _router_prefills(router):
            prefill = by_url.get(url)
            if prefill is None or prefill.engine != "sglang":
                continue
            binds = _int(last_value(prefill.args, "--disaggregation-bootstrap-port")) or DEFAULT_BOOTSTRAP_PORT
            if _int(told) == binds:
                continue
            router_given = has_flag(ctx.topology.roles[router.role].args, "--prefill")
            at = (_origin(ctx, router, "--prefill") if router_given
                  else _origin(ctx, prefill, "--disaggregation-bootstrap-port", "bootstrap_port"))
            fix = (f"write --prefill {url} {binds} in {router.role}'s args" if router_given else
                   f"set {prefill.role}.bootstrap_port: {binds} and drop --disaggregation-bootstrap-port from its "
                   f"args, so the router is told the same port")
            yield error(at, f"{router.name} tells decode workers to fetch KV from {prefill.name} at bootstrap port "
                        f"{told or 'none'}, but {prefill.name} binds {binds}", fix, router.name, prefill.name)


@plan_check
def args_shadowed(ctx: CheckContext) -> Iterator[Finding]:
    """--host/--port in `args` lose to bind/port (rendered after them); other flags there override their key."""
    for spec in _roles(ctx, ENGINE_WORKERS + ROUTERS):
        role = ctx.topology.roles[spec.role]
        for flag, key in SHADOWED.items():
            given = last_value(role.args, flag)
            effective = last_value(spec.args, flag)
            if given is not None and given != effective:
                yield warning(_origin(ctx, spec, flag), f"{flag} {given} in args is overridden by {key}: "
                              f"{effective}", f"set {key}: {given} and remove {flag} from args", spec.role)
        for flag, ref in WIRING_FLAGS.items():
            if has_flag(role.args, flag) and getattr(role, ref, None):
                yield warning(_origin(ctx, spec, flag), f"args give {flag} by hand while {ref}: "
                              f"{', '.join(getattr(role, ref))} wires it; the engine keeps the last one",
                              f"list the roles in {ref}: and remove {flag} from args", spec.role)
        for key, flags in KEY_FLAGS.get(spec.engine, {}).items():
            declared = getattr(role, key)
            given = _value(role.args, *flags)
            if declared is None or given is None or str(declared) == given or _float(declared) == _float(given):
                continue
            yield warning(_origin(ctx, spec, flags), f"args set {flags[0]} {given}, overriding {key}: {declared}",
                          f"keep one: set {key}: {given} and remove {flags[0]} from args", spec.role)


# ---- prefill/decode pairs -------------------------------------------------------------------

PAIR_FACTS = (
    # (what, structured key, how to read it from a spec)
    ("model", "model", _model),
    ("served model name", None, lambda s: _value(s.args, "--served-model-name") or _model(s)),
    ("transfer backend", "transfer_backend", _transfer_backend),
    ("KV-cache dtype", "kv_cache_dtype", lambda s: last_value(s.args, "--kv-cache-dtype") or "auto"),
    ("page size", "page_size", lambda s: _value(s.args, *KEY_FLAGS[s.engine]["page_size"])),
)
PAIR_FLAGS = {"model": ("--model-path", "--model"), "served model name": ("--served-model-name",),
              "transfer backend": ("--disaggregation-transfer-backend", "--kv-transfer-config"),
              "KV-cache dtype": ("--kv-cache-dtype",), "page size": ("--page-size", "--block-size")}


@plan_check
def pd_pairs_agree(ctx: CheckContext) -> Iterator[Finding]:
    """A router's prefill and decode must hand KV over: same engine, model, backend, dtype, page size."""
    by_url = _by_url(ctx)
    reported: set[tuple[str, str, str]] = set()
    # Read each worker's facts once: a router over P prefills and D decodes makes P x D pairs.
    facts = {s.name: (s.engine, *(read(s) for _, _, read in PAIR_FACTS))
             for s in by_url.values() if s.kind in ("prefill", "decode")}
    for router in _roles(ctx, ROUTERS):
        prefills = [by_url[u] for u, _ in _router_prefills(router) if u in by_url]
        decodes = [by_url[u] for u in _router_decodes(router) if u in by_url]
        for prefill in prefills:
            for decode in decodes:
                if facts[prefill.name] == facts[decode.name]:
                    continue
                if prefill.engine != decode.engine:
                    if (prefill.role, decode.role, "engine") not in reported:
                        reported.add((prefill.role, decode.role, "engine"))
                        yield error(("roles", decode.role, "engine"), f"{decode.role} runs {decode.engine} but its "
                                    f"prefill {prefill.role} runs {prefill.engine}; KV cannot pass between engines",
                                    "run both on one engine", prefill.role, decode.role, router.role)
                    continue
                for i, (what, key, _) in enumerate(PAIR_FACTS, 1):
                    mine, theirs = facts[decode.name][i], facts[prefill.name][i]
                    if mine == theirs or (prefill.role, decode.role, what) in reported:
                        continue
                    reported.add((prefill.role, decode.role, what))
                    if what == "served model name" and (prefill.role, decode.role, "model") in reported \
                            and not any(has_flag(s.args, "--served-model-name") for s in (prefill, decode)):
                        continue  # both names are the model paths, already reported
                    yield error(_origin(ctx, decode, PAIR_FLAGS[what], key),
                                f"{decode.role} has {_fact(what, mine)} but {prefill.role} has "
                                f"{_fact(what, theirs)}; {router.role} pairs them, so KV from one must fit the other",
                                f"give {decode.role} the same {what} as {prefill.role} ({theirs or 'the default'})",
                                prefill.role, decode.role)


def _fact(what: str, value: str | None) -> str:
    return f"{what} {value}" if value is not None else f"the default {what}"


# ---- hardware capability rules from the cookbook ---------------------------------------------

@plan_check
def fp4_trtllm_moe(ctx: CheckContext) -> Iterator[Finding]:
    """`--moe-runner-backend flashinfer_trtllm` runs the FP4 TRT-LLM MoE kernels of Blackwell."""
    if ctx.profile.fp4_trtllm_moe:
        return
    fix = ("use --moe-runner-backend marlin (Marlin W4A16 experts, as the cookbook runs NVFP4 on H200)"
           if ctx.profile.arch == "hopper" else "remove --moe-runner-backend flashinfer_trtllm")
    for spec in _roles(ctx, ("sglang",)):
        if last_value(spec.args, "--moe-runner-backend") == "flashinfer_trtllm":
            yield error(_origin(ctx, spec, "--moe-runner-backend"), f"--moe-runner-backend flashinfer_trtllm needs "
                        f"Blackwell FP4 TRT-LLM MoE kernels, which {ctx.profile.name} lacks", fix, spec.role)


@plan_check
def hopper_nvfp4_marlin(ctx: CheckContext) -> Iterator[Finding]:
    """H200 serves the NVFP4 checkpoint with Marlin W4A16 experts."""
    if ctx.profile.arch != "hopper":
        return
    for spec in _roles(ctx, ("sglang",)):
        nvfp4 = last_value(spec.args, "--quantization") == "modelopt_fp4" or _model(spec) == NVFP4_CHECKPOINT
        backend = last_value(spec.args, "--moe-runner-backend")
        if spec.kind == "encoder" or not nvfp4 or backend in ("marlin", "flashinfer_trtllm"):
            continue  # flashinfer_trtllm: fp4_trtllm_moe already says use marlin
        runner = f"--moe-runner-backend {backend}" if backend else "the default MoE runner"
        yield error(_origin(ctx, spec, "--moe-runner-backend"), f"{ctx.profile.name} has no FP4 MoE kernels: "
                    f"{spec.role} serves NVFP4 with {runner}", f"add --moe-runner-backend marlin to {spec.role}'s args",
                    spec.role)


@plan_check
def prefill_sequence_parallel(ctx: CheckContext) -> Iterator[Finding]:
    """--enable-layernorm-sp and MegaMoE: Blackwell, prefill only, and SGLang 0.5.23's start-up rules."""
    for spec in _roles(ctx, ("sglang",)):
        sp, mega = has_flag(spec.args, SP), has_flag(spec.args, MEGAMOE)
        if not (sp or mega):
            continue
        name, flag = spec.role, SP if sp else MEGAMOE
        at = _origin(ctx, spec, flag)
        if not ctx.profile.prefill_sp:
            blackwell = [p.name for p in PROFILES.values() if p.prefill_sp]
            yield error(at, f"{flag} needs SM100 kernels (Blackwell), which {ctx.profile.name} lacks",
                        f"remove {SP} and {MEGAMOE} from {name}, or use {_join(blackwell).replace(' and ', ' or ')}",
                        name)
            continue
        if spec.kind == "decode":
            yield error(at, f"{flag} on decode worker {name}: sequence parallel and MegaMoE are prefill "
                        f"features, omitted on a PD decode worker", f"remove {SP} and {MEGAMOE} from {name}'s args",
                        name)
            continue
        p = _parallel(ctx, spec) or Parallel()
        problems: list[tuple[Path_, str, str]] = []
        if mega and not sp:
            problems.append((at, f"{MEGAMOE} needs {SP}", f"add {SP} (MegaMoE requires SP to stay on)"))
        if sp:
            if p.tp <= 1 or (p.tp, p.ep) not in ((4, 4), (8, 8)):
                problems.append((_origin(ctx, spec, KEY_FLAGS["sglang"]["ep"], "ep"),
                                 f"{SP} needs attention TP equal to MoE EP, TP4/EP4 or TP8/EP8; {name} has tp {p.tp}, "
                                 f"ep {p.ep}", "set tp and ep both to 4 or both to 8"))
            if last_value(spec.args, "--moe-runner-backend") != "flashinfer_trtllm":
                problems.append((_origin(ctx, spec, "--moe-runner-backend"), f"{SP} needs --moe-runner-backend "
                                 f"flashinfer_trtllm", f"add --moe-runner-backend flashinfer_trtllm to {name}'s args"))
            if last_value(spec.args, "--moe-a2a-backend") != "flashinfer":
                problems.append((_origin(ctx, spec, "--moe-a2a-backend"), f"{SP} needs --moe-a2a-backend flashinfer",
                                 f"add --moe-a2a-backend flashinfer to {name}'s args"))
            quantization = last_value(spec.args, "--quantization")
            if quantization != "modelopt_fp4" and not (quantization is None and mega):
                weights = quantization or "BF16 without MegaMoE"
                problems.append((_origin(ctx, spec, "--quantization"), f"{SP} needs NVFP4 weights (--quantization "
                                 f"modelopt_fp4), or BF16 with MegaMoE; {name} has {weights}",
                                 "serve the NVFP4 checkpoint with --quantization modelopt_fp4"))
            if p.dp_attention:
                problems.append((_origin(ctx, spec, "--enable-dp-attention"), f"{SP} excludes --enable-dp-attention",
                                 f"remove --enable-dp-attention (or {SP}) from {name}"))
            algorithm = last_value(spec.args, "--speculative-algorithm")
            if algorithm is not None and algorithm.upper() != "DFLASH":
                problems.append((_origin(ctx, spec, "--speculative-algorithm"), f"{SP} supports speculative decoding "
                                 f"only with DFLASH; {name} uses {algorithm}",
                                 "use --speculative-algorithm DFLASH, or drop speculative decoding"))
        if p.pp > 1:
            problems.append((_origin(ctx, spec, KEY_FLAGS["sglang"]["pp"], "pp"), f"{flag} excludes pipeline "
                             f"parallelism; {name} has pp {p.pp}", "set pp: 1"))
        if mega and has_flag(spec.args, "--enable-mixed-chunk"):
            problems.append((_origin(ctx, spec, "--enable-mixed-chunk"), f"{MEGAMOE} excludes --enable-mixed-chunk",
                             f"remove --enable-mixed-chunk from {name}"))
        for path, message, fix in problems:
            yield error(path, message, fix, name)


@plan_check
def dflash_speculative(ctx: CheckContext) -> Iterator[Finding]:
    """DFlash: draft model given, draft attention fa4 on NVIDIA / triton on AMD, 1-8 draft tokens."""
    want = ctx.profile.draft_attention
    for spec in _roles(ctx, ("sglang",)):
        algorithm = last_value(spec.args, "--speculative-algorithm")
        if algorithm is None or algorithm.upper() != "DFLASH":
            continue
        name = spec.role
        at = _origin(ctx, spec, "--speculative-algorithm")
        backend = last_value(spec.args, "--speculative-draft-attention-backend")
        if want is None:
            yield error(at, f"DFlash speculative decoding needs GPUs; {ctx.profile.name} has none",
                        f"remove --speculative-algorithm DFLASH from {name}", name)
            continue
        if backend is None:
            yield warning(at, f"{name} runs DFlash without --speculative-draft-attention-backend",
                          f"add --speculative-draft-attention-backend {want} ({ctx.profile.vendor.value})", name)
        elif backend != want:
            yield error(_origin(ctx, spec, "--speculative-draft-attention-backend"),
                        f"DFlash draft attention {backend} does not run on {ctx.profile.name}; "
                        f"{ctx.profile.vendor.value.upper()} GPUs use {want}",
                        f"use --speculative-draft-attention-backend {want}", name)
        if last_value(spec.args, "--speculative-draft-model-path") is None:
            yield error(at, f"{name} runs DFlash without a draft model", f"add --speculative-draft-model-path "
                        f"{DFLASH_DRAFT}", name)
        tokens = last_value(spec.args, "--speculative-num-draft-tokens")
        if tokens is not None and not 1 <= (_int(tokens) or 0) <= 8:
            yield error(_origin(ctx, spec, "--speculative-num-draft-tokens"), f"--speculative-num-draft-tokens "
                        f"{tokens}: DFlash drafts 1 to 8 tokens", "use a value from 1 to 8 (default 8)", name)


@plan_check
def checkpoint_hardware(ctx: CheckContext) -> Iterator[Finding]:
    """The Quark MXFP4 checkpoint runs on MI350X/MI355X; vLLM on AMD runs TP and TP + EP only."""
    amd = ctx.profile.vendor is Vendor.AMD
    for spec in _roles(ctx):
        if _model(spec) == MXFP4_CHECKPOINT and not amd:
            yield error(_origin(ctx, spec, ("--model-path", "--model"), "model"), f"{MXFP4_CHECKPOINT} runs on "
                        f"MI350X/MI355X only, not {ctx.profile.name}", f"serve {NVFP4_CHECKPOINT} on "
                        f"{ctx.profile.name}", spec.role)
        p = _parallel(ctx, spec)
        if amd and spec.engine == "vllm" and p and (p.pp > 1 or p.dp > 1):
            key = "pp" if p.pp > 1 else "dp"
            yield error(_origin(ctx, spec, KEY_FLAGS["vllm"][key], key), f"vLLM on {ctx.profile.name} supports "
                        f"TP and TP + expert parallel only; {spec.role} sets {key} {getattr(p, key)}",
                        f"set {key}: 1 and use tp (with ep) across the GPUs", spec.role)


@plan_check
def vllm_speculative(ctx: CheckContext) -> Iterator[Finding]:
    """vLLM's DSpark drafts at most seven tokens."""
    for spec in _roles(ctx, ("vllm",)):
        raw = last_value(spec.args, "--speculative-config")
        try:
            config = json.loads(raw) if raw else {}
        except json.JSONDecodeError:
            yield error(_origin(ctx, spec, "--speculative-config"), f"--speculative-config is not JSON: {raw}",
                        "write it as one JSON object, e.g. '{\"method\":\"dspark\",...}'", spec.role)
            continue
        tokens = config.get("num_speculative_tokens") if isinstance(config, dict) else None
        if isinstance(config, dict) and config.get("method") == "dspark" and tokens is not None \
                and not 1 <= (_int(tokens) or 0) <= 7:
            yield error(_origin(ctx, spec, "--speculative-config"), f"DSpark num_speculative_tokens {tokens}: "
                        f"it drafts 1 to 7 tokens", "set num_speculative_tokens to 7 or less", spec.role)


@plan_check
def xeon_page_size(ctx: CheckContext) -> Iterator[Finding]:
    """The Xeon intel_amx attention backend wants --page-size 1."""
    if ctx.profile.arch != "xeon":
        return
    for spec in _roles(ctx, ("sglang",)):
        page = last_value(spec.args, "--page-size")
        if page not in (None, "1") and last_value(spec.args, "--attention-backend") in (None, "intel_amx"):
            yield warning(_origin(ctx, spec, "--page-size", "page_size"), f"page size {page} with the intel_amx "
                          f"attention backend (the CPU default)", "set page_size: 1, as the cookbook does on Xeon",
                          spec.role)


# ---- SGLang start-up rules (0.5.23) ---------------------------------------------------------

@plan_check
def integer_options(ctx: CheckContext) -> Iterator[Finding]:
    """Sizes, ports and token counts are positive whole numbers (the engine's parser refuses others)."""
    for spec in _roles(ctx):
        for flag in INTEGER_FLAGS:
            value = last_value(spec.args, flag)
            if value is not None and not (_int(value) or 0) >= 1:
                yield error(_origin(ctx, spec, flag), f"{flag} {value} is not a positive whole number",
                            f"give {flag} a number, e.g. {flag} 4", spec.role)


@plan_check
def sglang_choices(ctx: CheckContext) -> Iterator[Finding]:
    """Values SGLang 0.5.23 and vLLM 0.33 accept for the disaggregation options."""
    for spec in _roles(ctx):
        if spec.engine == "vllm":
            connector = _kv_transfer_config(spec).get("kv_connector")
            if connector is not None and connector not in VLLM_CONNECTORS:
                yield error(_origin(ctx, spec, "--kv-transfer-config", "transfer_backend"), f"vLLM has no KV "
                            f"connector {connector}", "use transfer_backend nixl, mooncake, example or lmcache",
                            spec.role)
            continue
        for flag, choices in SGLANG_CHOICES.items():
            value = last_value(spec.args, flag)
            if value is not None and value not in choices:
                key = {"--disaggregation-transfer-backend": "transfer_backend",
                       "--encoder-transfer-backend": "encoder_transfer_backend"}.get(flag)
                yield error(_origin(ctx, spec, flag, key), f"{flag} {value} is not one SGLang accepts",
                            f"use one of {', '.join(choices)}", spec.role)


@plan_check
def disaggregation_mode_matches_kind(ctx: CheckContext) -> Iterator[Finding]:
    """A --disaggregation-mode in args must not contradict the role's kind (the router wires by kind)."""
    for spec in _roles(ctx, ("sglang",)):
        mode = last_value(spec.args, "--disaggregation-mode")
        if spec.kind in ("prefill", "decode") and mode != spec.kind:
            yield error(_origin(ctx, spec, "--disaggregation-mode"), f"--disaggregation-mode {mode} contradicts "
                        f"kind: {spec.kind}", f"remove --disaggregation-mode from {spec.role}'s args (kind sets it)",
                        spec.role)
        elif spec.kind == "worker" and mode in ("prefill", "decode"):
            yield error(_origin(ctx, spec, "--disaggregation-mode"), f"{spec.role} is kind: worker but its args set "
                        f"--disaggregation-mode {mode}", f"make it kind: {mode} and list it under the router's {mode}",
                        spec.role)


@plan_check
def encoder_only_exclusive(ctx: CheckContext) -> Iterator[Finding]:
    """SGLang: --encoder-only excludes --language-only and --disaggregation-mode prefill|decode."""
    for spec in _roles(ctx, ("sglang",)):
        if not has_flag(spec.args, "--encoder-only"):
            continue
        if has_flag(spec.args, "--language-only"):
            yield error(_origin(ctx, spec, "--language-only"), f"{spec.role} sets both --encoder-only and "
                        f"--language-only", f"keep {spec.role} an encoder: remove --language-only from its args",
                        spec.role)
        mode = last_value(spec.args, "--disaggregation-mode")
        if mode in ("prefill", "decode"):
            yield error(_origin(ctx, spec, "--disaggregation-mode"), f"{spec.role} runs --encoder-only, which "
                        f"excludes --disaggregation-mode {mode}",
                        f"remove --disaggregation-mode from {spec.role}'s args", spec.role)


@plan_check
def language_only_wiring(ctx: CheckContext) -> Iterator[Finding]:
    """--language-only without --encoder-urls makes encoders register themselves, reversing the start order."""
    encoders = [n for n, r in ctx.topology.roles.items() if r.kind == "encoder"]
    for spec in _roles(ctx, ("sglang",)):
        if has_flag(spec.args, "--language-only") and not has_flag(spec.args, "--encoder-urls") \
                and not has_flag(spec.args, "--encoder-only"):
            listed = ", ".join(encoders) or "ENCODER"
            yield warning(_origin(ctx, spec, "--language-only"), f"{spec.role} runs --language-only without "
                          f"--encoder-urls, so encoders must register themselves (--encoder-register-urls), which "
                          f"reverses the start order", f"list {spec.role}.encoders: [{listed}] so muse-launch wires "
                          f"--encoder-urls and starts encoders first", spec.role)


# ---- addresses ------------------------------------------------------------------------------

def _host_path(ctx: CheckContext, spec: LaunchSpec) -> Path_:
    role = ctx.topology.roles[spec.role]
    if role.nodes and spec.node:
        return ("nodes", spec.node, "address")
    return ("roles", spec.role, "host") if role.host else ("host",)


@plan_check
def advertised_host(ctx: CheckContext) -> Iterator[Finding]:
    """Roles advertise `host` to clients and dependents; 0.0.0.0 is a listen address, not a destination."""
    by_path: dict[Path_, list[LaunchSpec]] = defaultdict(list)
    for spec in ctx.plan.specs:
        if spec.host in UNSPECIFIED:
            by_path[_host_path(ctx, spec)].append(spec)
    for path, specs in by_path.items():
        names = list(dict.fromkeys(s.role for s in specs))
        who = f"{_join(names)} {'are' if len(names) > 1 else 'is'}"
        yield error(path, f"{who} advertised as {specs[0].host}: clients and dependents cannot connect to it",
                    f"put {specs[0].host} in bind and a reachable address (e.g. 127.0.0.1) in host", *names)


@plan_check
def multi_node_addresses(ctx: CheckContext) -> Iterator[Finding]:
    """A deployment over several nodes needs addresses the other nodes can reach: no loopback."""
    roles = ctx.topology.roles
    used = list(dict.fromkeys(n for r in roles.values() for n in r.nodes if n in ctx.topology.nodes))
    if len(used) < 2:
        return
    spans = f"the deployment spans nodes {_join(used)}"
    for node in used:
        address = ctx.topology.nodes[node].address
        if _is_loopback(address):
            users = [n for n, r in roles.items() if node in r.nodes]
            yield error(("nodes", node, "address"), f"node {node} has loopback address {address}, but {spans}: the "
                        f"other nodes cannot reach it", f"give {node} its network address (e.g. 10.0.0.1)", *users)
    local: dict[Path_, list[str]] = defaultdict(list)
    for name, role in roles.items():
        host = role.host or ctx.topology.host
        if not role.nodes and _is_loopback(host):
            local[("roles", name, "host") if role.host else ("host",)].append(name)
    for path, names in local.items():
        host = roles[names[0]].host or ctx.topology.host
        yield error(path, f"{_join(names)} advertise{'s' if len(names) == 1 else ''} loopback {host} while {spans}; "
                    f"processes on other nodes cannot reach {'it' if len(names) == 1 else 'them'}",
                    "set host to this node's network address (the one under nodes:)", *names)
