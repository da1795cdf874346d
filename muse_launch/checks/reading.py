"""What the rules read from the rendered plan, through each engine's own argv reader, and how they
point a finding at the key or argument that decided it."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from ..addresses import is_wildcard
from ..engines import ENGINES, WORKER, WORKER_ENGINES
from ..engines.argv import as_int, last_index, last_value
from ..engines.base import Parallel
from ..plan.spec import LaunchSpec
from ..topology.load import Path_
from .findings import CheckContext

THIS_HOST = ("localhost", "127.0.0.1", "::1", "[::1]")


def key_flags(engine: str) -> dict[str, tuple[str, ...]]:
    """Topology key -> the engine's spellings of the flag it renders ({} for routers and commands)."""
    return dict(ENGINES[engine].KEY_FLAGS)


def parallel(ctx: CheckContext, spec: LaunchSpec) -> Parallel | None:
    """Parallel sizes from argv; None when one is not a positive whole number (integer_options says so)."""
    engine = WORKER[spec.engine]
    # vLLM's DP across nodes renders no --nnodes: the role's node list says it.
    nnodes = as_int(engine.nnodes(spec.args) or len(ctx.topology.roles[spec.role].nodes) or 1)
    if nnodes is None or nnodes < 1:
        return None
    return engine.parallel(spec.args, nnodes)


def model(spec: LaunchSpec) -> str | None:
    return WORKER[spec.engine].model(spec.args)


def mem_fraction(spec: LaunchSpec) -> float | None:
    worker = WORKER.get(spec.engine)
    return worker.mem_fraction(spec.args) if worker else None


def bound_ports(spec: LaunchSpec) -> dict[str, int]:
    """The ports this process binds, as its final argv says (a port given in `args` wins)."""
    ports = dict(spec.ports)
    for kind, flag in ENGINES[spec.engine].PORT_FLAGS.items():
        value = as_int(last_value(spec.args, flag)) if kind in ports else None
        if value is not None:
            ports[kind] = value
    return ports


def machine(spec: LaunchSpec) -> str:
    """Which host a process runs on. The usual loopback spellings are all this host; another loopback
    address (127.0.0.2) stands for a machine of its own, as a rehearsal places each node."""
    return "this host" if spec.host in THIS_HOST or is_wildcard(spec.host) else spec.host


def roles(ctx: CheckContext, engines: tuple[str, ...] = WORKER_ENGINES) -> Iterator[LaunchSpec]:
    """One spec per role: replicas and node ranks share their flags, so rules on flags judge one."""
    seen: set[str] = set()
    for spec in ctx.plan.specs:
        if spec.engine in engines and spec.role not in seen:
            seen.add(spec.role)
            yield spec


def origin(ctx: CheckContext, spec: LaunchSpec, flags: Iterable[str] | str, key: str | None = None) -> Path_:
    """Where the effective value of a flag comes from: the role's args, its key, the top-level args or key."""
    flags = (flags,) if isinstance(flags, str) else tuple(flags)
    role = ctx.topology.roles[spec.role]
    at = last_index(role.args, flags)
    if at is not None:
        return ("roles", spec.role, "args", at)
    if key and getattr(role, key, None) not in (None, [], {}):
        return ("roles", spec.role, key)
    at = last_index(ctx.topology.args, flags)
    if at is not None:
        return ("args", at)
    if key in type(ctx.topology).model_fields and getattr(ctx.topology, key) is not None:
        return (key,)
    return ("roles", spec.role, key) if key else ("roles", spec.role, "args")


def gpu_text(gpus: Iterable[int]) -> str:
    """[0, 1, 2, 3] -> '0-3'; [0, 2] -> '0,2'."""
    gpus = sorted(gpus)
    if len(gpus) > 1 and gpus == list(range(gpus[0], gpus[-1] + 1)):
        return f"{gpus[0]}-{gpus[-1]}"
    return ",".join(map(str, gpus))


def free_gpus(ctx: CheckContext, spec: LaunchSpec, count: int) -> list[int] | None:
    """`count` GPUs no other process on the spec's host uses; None when too few are free."""
    taken = {g for s in ctx.plan.specs if s.name != spec.name and machine(s) == machine(spec) for g in s.gpus}
    free = [g for g in range(ctx.profile.gpus_per_node) if g not in taken]
    return free[:count] if count and len(free) >= count else None


def free_port(used: set[int], after: int) -> int:
    port = after + 1
    while port in used:
        port += 1
    return port


def join(names: Iterable[str]) -> str:
    names = list(names)
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
