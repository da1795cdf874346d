"""Where a plan's instances go on a SLURM allocation: a transformation of the checked Plan, as
the rehearsal is (plan/rehearse.py), then the placement checks again.

One allocation of N whole nodes, mapped role by role. The plan's machines (each node address
the file declares, in file order, then any other host a role names; loopback and wildcard hosts
are "this host") become the allocation's nodes in SLURM's order: the first machine is the first
node, which is also the batch host. Every instance moves to its machine's node address: its
host, its bind (a wildcard stays a wildcard outside a rehearsal: a real server listens on every
interface of its node), and every address, host:port or URL in its argv and env naming a moved
machine (--dist-init-addr, --master-addr, --data-parallel-address, the router's upstream URLs,
VLLM_NIXL_SIDE_CHANNEL_HOST). No flag is written here: the engine modules rendered them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from ..addresses import is_loopback, is_wildcard
from ..plan.rehearse import loopback_addresses, rehearsal_plan, relocate
from ..plan.spec import LaunchSpec, Plan
from ..topology.model import Topology

THIS_HOST = "this host"


@dataclass(frozen=True)
class AllocatedNode:
    name: str  # SLURM's node name (what --nodelist takes)
    address: str  # its NodeAddr: where the others reach the roles on it


def machine(address: str) -> str:
    return THIS_HOST if is_wildcard(address) or is_loopback(address) else address


def machines(plan: Plan, topology: Topology) -> list[str]:
    """The plan's machines in allocation order (the rehearsal numbers its loopback addresses alike)."""
    out: list[str] = []
    for address in [n.address for n in topology.nodes.values()] + [s.host for s in plan.specs]:
        if machine(address) not in out:
            out.append(machine(address))
    return out


def machine_label(topology: Topology, key: str) -> str:
    names = [name for name, node in topology.nodes.items() if machine(node.address) == key]
    return f"{'/'.join(names)} ({key})" if names else key


def node_gpus(specs: Sequence[LaunchSpec]) -> tuple[int, bool]:
    """The GPUs one node needs for these instances, and whether some of them share a GPU (the
    cookbook's EPD puts its encoder on its prefill's GPUs), which per-step counts cannot say."""
    indices = [g for s in specs for g in s.gpus]
    shared = len(set(indices)) < len(indices)
    return (len(set(indices)) if shared else len(indices)), shared


@dataclass(frozen=True)
class Shape:
    """What to ask SLURM for: whole nodes, and the most GPUs any one node needs."""

    machines: tuple[str, ...]  # labels, in allocation order
    gpus_per_node: int
    by_machine: Mapping[str, tuple[str, ...]]  # label -> instance names on it
    shared: tuple[str, ...] = ()  # labels of machines whose instances share GPUs

    @property
    def count(self) -> int:
        return len(self.machines)


def shape(plan: Plan, topology: Topology) -> Shape:
    keys = machines(plan, topology)
    on: dict[str, list[LaunchSpec]] = {k: [] for k in keys}
    for spec in plan.specs:
        on[machine(spec.host)].append(spec)
    need = {k: node_gpus(specs) for k, specs in on.items()}
    labels = {k: machine_label(topology, k) for k in keys}
    return Shape(
        tuple(labels[k] for k in keys),
        max((n for n, _ in need.values()), default=0),
        {labels[k]: tuple(s.name for s in on[k]) for k in keys},
        tuple(labels[k] for k, (_, shared) in need.items() if shared),
    )


def placement(
    plan: Plan, topology: Topology, allocation: Sequence[AllocatedNode]
) -> dict[str, AllocatedNode]:
    """Each instance of the checked plan -> the allocated node it runs on."""
    keys = machines(plan, topology)
    if len(allocation) < len(keys):
        raise ValueError(f"{plan.name} needs {len(keys)} nodes; the allocation has {len(allocation)}")
    return {spec.name: allocation[keys.index(machine(spec.host))] for spec in plan.specs}


def _moved(spec: LaunchSpec, moves: Mapping[str, str], here: str, keep_wildcard: bool) -> LaunchSpec:
    bind = spec.bind if keep_wildcard and is_wildcard(spec.bind) else here
    own = dict(moves) if keep_wildcard else {**moves, spec.bind: here}
    return replace(
        spec,
        host=here,
        bind=bind,
        args=tuple(relocate(a, own) for a in spec.args),
        env={k: relocate(v, own) for k, v in spec.env.items()},
    )


def allocated_plan(
    plan: Plan, topology: Topology, allocation: Sequence[AllocatedNode], rehearse: bool, python: str
) -> Plan:
    """The checked plan moved onto the allocation; in a rehearsal, the rehearsal plan (simulated
    engines, each server bound to its machine's address) moved the same way."""
    where = placement(plan, topology, allocation)
    keys = machines(plan, topology)
    address_of = {k: allocation[i].address for i, k in enumerate(keys)}
    if rehearse:
        stand_in = loopback_addresses(plan, topology)  # file address -> the rehearsal's 127.0.0.N
        moves = {stand_in[a]: address_of[machine(a)] for a in stand_in}
        rehearsed = rehearsal_plan(plan, topology, python)
        specs = [_moved(s, moves, where[s.name].address, keep_wildcard=False) for s in rehearsed.specs]
    else:
        addresses = [n.address for n in topology.nodes.values()] + [
            a for s in plan.specs for a in (s.host, s.bind)
        ]
        moves = {a: address_of[machine(a)] for a in addresses if not is_wildcard(a)}
        specs = [_moved(s, moves, where[s.name].address, keep_wildcard=True) for s in plan.specs]
    return replace(plan, specs=tuple(specs))


def on_nodes(allocation: Sequence[AllocatedNode]):
    """Where a plan goes on SLURM (plan/compose.py's `where`): onto the job's nodes, `allocated_plan`."""
    import sys

    return lambda plan, topology, rehearse: allocated_plan(
        plan, topology, allocation, rehearse, sys.executable
    )
