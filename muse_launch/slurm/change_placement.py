"""Where a new instance goes in a running SLURM job (supervise/change_executor.py's Placement, on the batch
host).

The file's plan with one more replica (its ports stepped as on one host), moved onto the allocation as `up`
moved it. Each replica of a role keeps the GPU count of the file's instances (SLURM picks the devices: only
the count matters). The pre-flight: the node the role runs on must have that many of its allocated GPUs
free (the allocation's GPUs per node less what this deployment's steps hold there) and the instance's
ports free there (no other instance of it on them, nothing answering). Past that the change is refused,
naming the node and what it lacks. Once placed, the instance is a new step on its node (SlurmProcesses).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping, Sequence

from muse_launch.errors import RuntimeFailure
from muse_launch.plan.build import PlanError
from muse_launch.plan.compose import compose
from muse_launch.plan.spec import LaunchSpec, Plan
from muse_launch.supervise.change_executor import Placement
from muse_launch.topology.model import Topology

from .files import SlurmFiles
from .placement import AllocatedNode, on_nodes
from .processes import SlurmProcesses

PORT_PROBE_S = 0.5


def allocated_gpus(fallback: int) -> int:
    """GPUs per node in this allocation, as SLURM says on the batch host (a `--sbatch=--gres=gpu:K` given
    to `up` counts), else what the job asked for."""
    for var in ("SLURM_GPUS_ON_NODE", "SLURM_JOB_GPUS"):
        value = os.environ.get(var, "").strip()
        if value:
            try:
                return int(value) if var == "SLURM_GPUS_ON_NODE" else len(value.split(","))
            except ValueError:
                continue
    return fallback


def slurm_placement(
    topology: Topology,
    allocation: Sequence[AllocatedNode],
    rehearse: bool,
    processes: SlurmProcesses,
    files: SlurmFiles,
    gpus_per_node: int,
    current: Callable[[], list[LaunchSpec]],
    reload: Callable[[str, tuple[str, ...], Mapping[str, str]], Placement] | None = None,
    redact: Callable[[str], str] = lambda text: text,
    sha256: str | None = None,
) -> Placement:
    """`current()`: the instances the supervisor runs now; `reload`: the same from an edited file."""

    def replan(counts: Mapping[str, int], ports: Mapping[str, Mapping[str, int]] | None = None) -> Plan:
        try:
            return compose(
                topology, counts=counts, ports=ports, rehearse=rehearse, where=on_nodes(allocation)
            ).plan
        except (PlanError, ValueError) as exc:
            raise RuntimeFailure(f"the file's plan with these replicas does not work: {exc}") from None

    def preflight(part: Plan, say: Callable[[str], None], reserved: Sequence[LaunchSpec] = ()) -> None:
        """`reserved`: instances the same change placed and has not started yet: they count as running."""
        for spec in part.specs:
            node = _node_of(spec, allocation)
            running = [s for s in (*current(), *reserved) if processes.placement.get(s.name) == node]
            _require_gpus(spec, node, running, gpus_per_node, processes)
            _require_ports(spec, node, running)
            processes.placement[spec.name] = node
            processes.cpus[spec.name] = _cpu_share(spec, gpus_per_node)
            _record_node(files, spec.name, node)
            say(f"{spec.name}: placed on {node.name} ({len(spec.gpus)} GPU{'s' * (len(spec.gpus) != 1)})")

    # GPU indices mean nothing here: SLURM picks
    return Placement(replan, preflight, reload=reload, redact=redact, sha256=sha256)


def _node_of(spec: LaunchSpec, allocation: Sequence[AllocatedNode]) -> AllocatedNode:
    node = next((n for n in allocation if n.address == spec.host), None)
    if node is None:
        raise RuntimeFailure(f"{spec.name}: its host {spec.host} is none of the allocation's nodes")
    return node


def _require_gpus(
    spec: LaunchSpec,
    node: AllocatedNode,
    running: list[LaunchSpec],
    gpus_per_node: int,
    processes: SlurmProcesses,
) -> None:
    if not spec.gpus:
        return
    if any(s.name in processes.shared for s in running):
        raise RuntimeFailure(
            f"{spec.name}: the roles on {node.name} share their GPUs; no GPU of it can be counted free",
            fix=f"put roles.{spec.role} on a node of its own in the file, then `down` and `up --on slurm`",
        )
    held = sum(len(s.gpus) for s in running)
    free = gpus_per_node - held
    if len(spec.gpus) > free:
        on = ", ".join(f"{s.name} {len(s.gpus)}" for s in running if s.gpus) or "none"
        raise RuntimeFailure(
            f"{spec.name}: node {node.name} has {max(free, 0)} of its {gpus_per_node} allocated GPUs free "
            f"(held: {on}); {spec.name} needs {len(spec.gpus)}",
            fix=f"a larger allocation: `down` it and `up --on slurm "
            f"--sbatch=--gres=gpu:{held + len(spec.gpus)}` (more GPUs per node), or `--sbatch=--nodes=N` "
            f"with roles.{spec.role} on a node of its own in the file; or scale another role on {node.name} "
            "down first",
        )


def _require_ports(spec: LaunchSpec, node: AllocatedNode, running: list[LaunchSpec]) -> None:
    for kind, port in spec.ports.items():
        holder = next((s.name for s in running if port in s.ports.values()), None)
        if holder is None and _answers(node.address, port):
            holder = "something that is not this deployment"
        if holder:
            raise RuntimeFailure(
                f"{spec.name}: its {kind} port {port} on node {node.name} is taken ({holder})",
                fix=f"give roles.{spec.role} ports with room for more replicas in the file, then `down` and "
                "`up --on slurm` it again",
            )


def _answers(address: str, port: int) -> bool:
    try:
        socket.create_connection((address, port), timeout=PORT_PROBE_S).close()
        return True
    except OSError:
        return False


def _cpu_share(spec: LaunchSpec, gpus_per_node: int) -> int:
    cpus = int(os.environ.get("SLURM_CPUS_ON_NODE", "1") or 1)
    if not spec.gpus:
        return 0
    return max(1, cpus * len(spec.gpus) // max(gpus_per_node, len(spec.gpus)))


def _record_node(files: SlurmFiles, name: str, node: AllocatedNode) -> None:
    """`status` reads each instance's node from placement.json."""
    placed = files.read_json(files.placement) or {}
    roles = placed.get("roles") if isinstance(placed.get("roles"), dict) else {}
    placed["roles"] = {**roles, name: {"node": node.name, "address": node.address}}
    files.write_json(files.placement, placed)
