"""Addresses: nobody advertised as a wildcard, nothing on loopback when the deployment spans nodes."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

from ..addresses import is_loopback, is_wildcard
from ..plan.spec import LaunchSpec
from ..topology.load import Path_
from .findings import CheckContext, Finding, error, placement_check, plan_check
from .reading import join


def _host_path(ctx: CheckContext, spec: LaunchSpec) -> Path_:
    role = ctx.topology.roles[spec.role]
    if role.nodes and spec.node:
        return ("nodes", spec.node, "address")
    return ("roles", spec.role, "host") if role.host else ("host",)


@placement_check
def advertised_host(ctx: CheckContext) -> Iterator[Finding]:
    """Roles advertise `host` to clients and dependents; 0.0.0.0 is a listen address, not a destination."""
    by_path: dict[Path_, list[LaunchSpec]] = defaultdict(list)
    for spec in ctx.plan.specs:
        if is_wildcard(spec.host):
            by_path[_host_path(ctx, spec)].append(spec)
    for path, specs in by_path.items():
        names = list(dict.fromkeys(s.role for s in specs))
        who = f"{join(names)} {'are' if len(names) > 1 else 'is'}"
        yield error(
            path,
            f"{who} advertised as {specs[0].host}: clients and dependents cannot connect to it",
            f"put {specs[0].host} in bind and a reachable address (e.g. 127.0.0.1) in host",
            *names,
        )


@plan_check
def multi_node_addresses(ctx: CheckContext) -> Iterator[Finding]:
    """A deployment over several nodes needs addresses the other nodes can reach: no loopback."""
    roles = ctx.topology.roles
    used = list(dict.fromkeys(n for r in roles.values() for n in r.nodes if n in ctx.topology.nodes))
    if len(used) < 2:
        return
    spans = f"the deployment spans nodes {join(used)}"
    for node in used:
        address = ctx.topology.nodes[node].address
        if is_loopback(address):
            users = [n for n, r in roles.items() if node in r.nodes]
            yield error(
                ("nodes", node, "address"),
                f"node {node} has loopback address {address}, but {spans}: the other nodes cannot reach it",
                f"give {node} its network address (e.g. 10.0.0.1)",
                *users,
            )
    local: dict[Path_, list[str]] = defaultdict(list)
    for name, role in roles.items():
        host = role.host or ctx.topology.host
        if not role.nodes and is_loopback(host):
            local[("roles", name, "host") if role.host else ("host",)].append(name)
    for path, names in local.items():
        host = roles[names[0]].host or ctx.topology.host
        yield error(
            path,
            f"{join(names)} advertise{'s' if len(names) == 1 else ''} loopback {host} while {spans}; "
            f"processes on other nodes cannot reach {'it' if len(names) == 1 else 'them'}",
            "set host to this node's network address (the one under nodes:)",
            *names,
        )
