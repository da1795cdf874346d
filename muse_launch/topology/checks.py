"""Checks before anything starts (SPEC section 3): cross-role rules -> Findings.

Structural rules (references, cycles, ports given) run on the Topology; the rest run on the
Plan that `up` would execute, so they judge the real argv (a flag given in `args` counts).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Callable, Iterable, Iterator

from ..plan.build import PlanError, build_plan, role_dependencies
from ..plan.graph import Cycle, waves
from ..plan.spec import Plan
from .hardware import PROFILES, HardwareProfile
from .load import LoadedTopology, Path_, dotted
from .model import Topology

REFERENCE_KINDS = {"encoders": ("encoder",), "prefill": ("prefill",), "decode": ("decode",),
                   "workers": ("worker",), "after": None}
REFERENCE_HOLDERS = {"encoders": ("prefill", "decode", "worker"), "prefill": ("router",),
                     "decode": ("router",), "workers": ("router",)}


class Severity(str, Enum):
    ERROR = "error"
    WARNING = "warning"


@dataclass(frozen=True)
class Finding:
    severity: Severity
    path: Path_
    message: str
    fix: str
    roles: tuple[str, ...] = ()

    def format(self, loaded: LoadedTopology) -> str:
        text = f"{loaded.where(self.path)}: {self.severity.value}: {dotted(self.path)}: {self.message}; fix: {self.fix}"
        return loaded.redact(text)  # messages quote values, and ${env:...} values are secrets

    def to_dict(self, loaded: LoadedTopology) -> dict[str, object]:
        return {"severity": self.severity.value, "file": str(loaded.source), "line": loaded.line_of(self.path),
                "path": dotted(self.path), "roles": list(self.roles), "message": loaded.redact(self.message),
                "fix": loaded.redact(self.fix)}


def error(path: Path_, message: str, fix: str, *roles: str) -> Finding:
    return Finding(Severity.ERROR, path, message, fix, roles)


def warning(path: Path_, message: str, fix: str, *roles: str) -> Finding:
    return Finding(Severity.WARNING, path, message, fix, roles)


@dataclass(frozen=True)
class CheckContext:
    topology: Topology
    plan: Plan
    profile: HardwareProfile = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "profile", PROFILES[self.topology.hardware])


PlanCheck = Callable[[CheckContext], Iterable[Finding]]
PLAN_CHECKS: list[PlanCheck] = []


def plan_check(fn: PlanCheck) -> PlanCheck:
    PLAN_CHECKS.append(fn)
    return fn


def run_checks(loaded: LoadedTopology) -> tuple[list[Finding], Plan | None]:
    """All findings, and the plan when the topology is sound enough to have one."""
    topology = loaded.topology
    findings = list(structural_checks(topology))
    if any(f.severity is Severity.ERROR for f in findings):
        return findings, None
    try:
        plan = build_plan(topology)
    except PlanError as exc:
        return findings + [error((), str(exc), "fix the role named above")], None
    ctx = CheckContext(topology, plan)
    merged: dict[tuple[object, ...], Finding] = {}
    for check in PLAN_CHECKS:
        for f in check(ctx):
            # One cause reached from several roles (a top-level key) is one finding naming them all.
            key = (f.severity, f.path, f.message, f.fix)
            seen = merged.get(key)
            merged[key] = f if seen is None else replace(seen, roles=tuple(dict.fromkeys(seen.roles + f.roles)))
    return findings + list(merged.values()), plan


def structural_checks(topology: Topology) -> Iterator[Finding]:
    roles = topology.roles
    for name, role in roles.items():
        at = ("roles", name)
        for ref, targets in role.references.items():
            holders = REFERENCE_HOLDERS.get(ref)
            if targets and holders and role.kind not in holders:
                yield error(at + (ref,), f"a {role.kind} role cannot list {ref}",
                            f"move {ref} to a {' or '.join(holders)} role, or remove it", name)
            for i, target in enumerate(targets):
                if target not in roles:
                    near = difflib.get_close_matches(target, list(roles), n=1, cutoff=0.5)
                    yield error(at + (ref, i), f"{name}.{ref} refers to {target!r}, which is not a role",
                                f"did you mean {near[0]!r}?" if near else f"use one of: {', '.join(roles)}",
                                name, target)
                elif targets.index(target) != i:
                    yield error(at + (ref, i), f"{name}.{ref} lists {target} twice", "list it once", name, target)
                elif target == name:
                    yield error(at + (ref, i), f"{name} refers to itself", "remove the reference", name)
                elif REFERENCE_KINDS[ref] and roles[target].kind not in REFERENCE_KINDS[ref]:
                    yield error(at + (ref, i), f"{name}.{ref} lists {target}, a {roles[target].kind} role",
                                f"list only {REFERENCE_KINDS[ref][0]} roles in {ref}", name, target)
        if role.kind not in ("command",) and role.port is None:
            yield error(at, f"{name} has no port", "give it a port: (each server role needs one)", name)
        if role.kind == "router" and not (role.prefill or role.decode or role.workers):
            yield error(at, f"router {name} has no workers",
                        "list prefill: and decode: roles, or workers: for aggregated workers", name)
        if role.kind == "router" and bool(role.prefill) != bool(role.decode):
            yield error(at, f"router {name} needs both prefill and decode workers for PD disaggregation",
                        "list both prefill: [...] and decode: [...]", name)
        for port_key in ("port", "bootstrap_port", "encoder_bootstrap_port", "side_channel_port", "metrics_port"):
            value = getattr(role, port_key)
            if isinstance(value, list) and len(value) != role.replicas:
                yield error(at + (port_key,), f"{len(value)} ports given for {role.replicas} replicas",
                            f"give {role.replicas} ports, or one port that steps by one per replica", name)
        if role.replicas > 1 and role.gpus and len(role.gpus) % role.replicas:
            yield error(at + ("gpus",), f"{len(role.gpus)} GPUs do not split evenly into {role.replicas} replicas",
                        f"give a multiple of {role.replicas} GPUs", name)
        for i, node in enumerate(role.nodes):
            if node not in topology.nodes:
                yield error(at + ("nodes", i), f"{name} runs on node {node!r}, which is not declared",
                            f"declare it under top-level nodes: {{{node}: {{address: ...}}}}"
                            f" (declared: {', '.join(topology.nodes) or 'none'})", name)
            elif role.nodes.index(node) != i:
                yield error(at + ("nodes", i), f"node {node} is listed twice", "list each node once", name)
    try:
        waves(role_dependencies(topology))
    except Cycle as cycle:
        first, second = cycle.path[0], cycle.path[1]
        key, index = next((k, refs.index(second)) for k, refs in roles[first].references.items() if second in refs)
        yield error(("roles", first, key, index), f"dependency cycle: {' -> '.join(cycle.path)} "
                    f"({first} waits for {second}, which waits for {first})" if len(cycle.path) == 3 else
                    f"dependency cycle: {' -> '.join(cycle.path)}",
                    f"remove {second} from {first}.{key}, or break the loop elsewhere", *cycle.path[:-1])
    except KeyError:
        pass  # a dangling reference, reported above


def has_errors(findings: Iterable[Finding], strict: bool = False) -> bool:
    return any(f.severity is Severity.ERROR or strict for f in findings)


# Plan-level rules live in rules.py; importing it registers them.
from . import rules  # noqa: E402,F401
