"""Where a topology's roles go on a SLURM allocation, as pure functions.

One allocation of N whole nodes, mapped role by role: the topology's nodes, in the order the
file declares them, become the allocation's nodes in SLURM's order (node0 -> the first, which is
also the batch host). A role without `nodes:` runs on the node whose address is its `host`
(the router of a PD file next to its prefill), else on the first node; a file without nodes is
one node. The plan for the allocation is the same topology re-planned with the allocated nodes'
addresses in place of the file's: the engine modules render --dist-init-addr, --nnodes,
--node-rank, the workers' URLs and the router's upstreams from them, and the checks run again.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Mapping, Sequence

from ..plan.spec import LaunchSpec, Plan
from ..topology.model import NodeConfig, Topology

SINGLE_NODE = "(host)"  # the one node of a file that declares none (not a valid node name: has parentheses)
WILDCARDS = ("0.0.0.0", "::", "")


@dataclass(frozen=True)
class AllocatedNode:
    name: str  # SLURM's node name (what --nodelist takes)
    address: str  # its NodeAddr: where the others reach the roles on it


def topology_nodes(topology: Topology) -> list[str]:
    """The file's nodes in declaration order (names used only in a role's `nodes:` last)."""
    names = list(topology.nodes)
    for role in topology.roles.values():
        names += [n for n in role.nodes if n not in names]
    return names or [SINGLE_NODE]


def _old_address(topology: Topology, node: str) -> str:
    if node in topology.nodes:
        return topology.nodes[node].address
    return node if node != SINGLE_NODE else topology.host


def node_of_address(topology: Topology, host: str | None) -> str:
    """The node a role without `nodes:` runs on: the one at its host, else the first."""
    names = topology_nodes(topology)
    for name in names:
        if host is not None and _old_address(topology, name) == host:
            return name
    return names[0]


def spec_node(topology: Topology, spec: LaunchSpec) -> str:
    """The topology node of a planned instance (its node rank's node, or where its host is)."""
    return spec.node or node_of_address(topology, spec.host)


@dataclass(frozen=True)
class Shape:
    """What to ask SLURM for: whole nodes, and the most GPUs any one node needs."""

    nodes: tuple[str, ...]  # the topology's nodes, in allocation order
    gpus_per_node: int
    by_node: Mapping[str, tuple[str, ...]]  # topology node -> instance names on it

    @property
    def count(self) -> int:
        return len(self.nodes)


def shape(topology: Topology, plan: Plan) -> Shape:
    nodes = topology_nodes(topology)
    by_node: dict[str, list[LaunchSpec]] = {n: [] for n in nodes}
    for spec in plan.specs:
        by_node.setdefault(spec_node(topology, spec), []).append(spec)
    gpus = max((sum(len(s.gpus) for s in specs) for specs in by_node.values()), default=0)
    return Shape(tuple(by_node), gpus, {n: tuple(s.name for s in specs) for n, specs in by_node.items()})


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address == "localhost"


def allocated_topology(topology: Topology, allocation: Sequence[AllocatedNode], rehearse: bool) -> Topology:
    """The topology with each of its nodes at its allocated node's address.

    A host that was a node's address becomes that node's new address; a loopback host (a file
    without nodes) becomes the first node's. Binds: a wildcard stays (a real deployment listens on
    every interface of its node); in a rehearsal each server binds its node's address, as the
    single-host rehearsal binds each node's loopback address.
    """
    names = topology_nodes(topology)
    if len(allocation) < len(names):
        raise ValueError(f"{topology.name} needs {len(names)} nodes; the allocation has {len(allocation)}")
    new = {_old_address(topology, n): allocation[i].address for i, n in enumerate(names)}
    first = allocation[0].address

    def moved(address: str | None) -> str | None:
        if address is None:
            return None
        if address in new:
            return new[address]
        return first if _is_loopback(address) else address

    def bound(address: str | None) -> str | None:
        if rehearse or address is None:
            return None
        return address if address in WILDCARDS else moved(address)

    nodes = {n: NodeConfig(address=allocation[i].address) for i, n in enumerate(names) if n != SINGLE_NODE}
    roles = {name: role.model_copy(update={"host": moved(role.host), "bind": bound(role.bind)})
             for name, role in topology.roles.items()}
    return topology.model_copy(update={"host": moved(topology.host), "bind": bound(topology.bind),
                                       "nodes": nodes, "roles": roles})


def placement(topology: Topology, plan: Plan, allocation: Sequence[AllocatedNode]) -> dict[str, AllocatedNode]:
    """Each instance of the allocated plan -> the node it runs on."""
    index = {n: i for i, n in enumerate(topology_nodes(topology))}
    return {spec.name: allocation[index[spec_node(topology, spec)]] for spec in plan.specs}
