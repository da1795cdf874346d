"""Structural checks on the Topology itself: references, cycles, ports given, replicas and nodes.
They run before there is a plan (a dangling reference has none)."""

from __future__ import annotations

import difflib
from collections.abc import Iterator

from ..plan.build import role_dependencies
from ..plan.graph import Cycle, waves
from ..topology.model import Topology
from .findings import Finding, error

REFERENCE_KINDS = {
    "encoders": ("encoder",),
    "prefill": ("prefill",),
    "decode": ("decode",),
    "workers": ("worker",),
    "after": None,
}
REFERENCE_HOLDERS = {
    "encoders": ("prefill", "decode", "worker"),
    "prefill": ("router",),
    "decode": ("router",),
    "workers": ("router",),
}


def structural_checks(topology: Topology) -> Iterator[Finding]:
    roles = topology.roles
    for name, role in roles.items():
        at = ("roles", name)
        for ref, targets in role.references.items():
            holders = REFERENCE_HOLDERS.get(ref)
            if targets and holders and role.kind not in holders:
                yield error(
                    at + (ref,),
                    f"a {role.kind} role cannot list {ref}",
                    f"move {ref} to a {' or '.join(holders)} role, or remove it",
                    name,
                )
            for i, target in enumerate(targets):
                if target not in roles:
                    near = difflib.get_close_matches(target, list(roles), n=1, cutoff=0.5)
                    yield error(
                        at + (ref, i),
                        f"{name}.{ref} refers to {target!r}, which is not a role",
                        f"did you mean {near[0]!r}?" if near else f"use one of: {', '.join(roles)}",
                        name,
                        target,
                    )
                elif targets.index(target) != i:
                    yield error(
                        at + (ref, i), f"{name}.{ref} lists {target} twice", "list it once", name, target
                    )
                elif target == name:
                    yield error(at + (ref, i), f"{name} refers to itself", "remove the reference", name)
                elif REFERENCE_KINDS[ref] and roles[target].kind not in REFERENCE_KINDS[ref]:
                    yield error(
                        at + (ref, i),
                        f"{name}.{ref} lists {target}, a {roles[target].kind} role",
                        f"list only {REFERENCE_KINDS[ref][0]} roles in {ref}",
                        name,
                        target,
                    )
        if role.kind not in ("command",) and role.port is None:
            yield error(at, f"{name} has no port", "give it a port: (each server role needs one)", name)
        if role.kind == "router" and not (role.prefill or role.decode or role.workers):
            yield error(
                at,
                f"router {name} has no workers",
                "list prefill: and decode: roles, or workers: for aggregated workers",
                name,
            )
        if role.kind == "router" and bool(role.prefill) != bool(role.decode):
            yield error(
                at,
                f"router {name} needs both prefill and decode workers for PD disaggregation",
                "list both prefill: [...] and decode: [...]",
                name,
            )
        for port_key in (
            "port",
            "bootstrap_port",
            "encoder_bootstrap_port",
            "side_channel_port",
            "metrics_port",
        ):
            value = getattr(role, port_key)
            if isinstance(value, list) and len(value) != role.replicas:
                yield error(
                    at + (port_key,),
                    f"{len(value)} ports given for {role.replicas} replicas",
                    f"give {role.replicas} ports, or one port that steps by one per replica",
                    name,
                )
        if role.replicas > 1 and role.gpus and len(role.gpus) % role.replicas:
            yield error(
                at + ("gpus",),
                f"{len(role.gpus)} GPUs do not split evenly into {role.replicas} replicas",
                f"give a multiple of {role.replicas} GPUs",
                name,
            )
        for i, node in enumerate(role.nodes):
            if node not in topology.nodes:
                yield error(
                    at + ("nodes", i),
                    f"{name} runs on node {node!r}, which is not declared",
                    f"declare it under top-level nodes: {{{node}: {{address: ...}}}}"
                    f" (declared: {', '.join(topology.nodes) or 'none'})",
                    name,
                )
            elif role.nodes.index(node) != i:
                yield error(at + ("nodes", i), f"node {node} is listed twice", "list each node once", name)
    try:
        waves(role_dependencies(topology))
    except Cycle as cycle:
        first, second = cycle.path[0], cycle.path[1]
        key, index = next(
            (k, refs.index(second)) for k, refs in roles[first].references.items() if second in refs
        )
        yield error(
            ("roles", first, key, index),
            f"dependency cycle: {' -> '.join(cycle.path)} "
            f"({first} waits for {second}, which waits for {first})"
            if len(cycle.path) == 3
            else f"dependency cycle: {' -> '.join(cycle.path)}",
            f"remove {second} from {first}.{key}, or break the loop elsewhere",
            *cycle.path[:-1],
        )
    except KeyError:
        pass  # a dangling reference, reported above
