"""Where an instance added to a running deployment goes (a scale-up, a restart's surge instance, a role an
edited file brings in): exactly one instance's GPUs, taken from the GPUs of its node that no instance of any
deployment holds. Pure: what the node has and who holds what are given (the runtime reads them: the
deployments' records, NVML where there is one, else the hardware profile, as a real host would be read).

The rule replaces "a new instance's GPUs are its share of `roles.ROLE.gpus` as if the file asked for that
many replicas": shares recomputed for more replicas overlap the GPUs that the running instances keep.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from ..topology.hardware import PROFILES

if TYPE_CHECKING:
    from ..topology.model import Topology
    from .spec import LaunchSpec


@dataclass(frozen=True)
class Room:
    """A node's GPUs and who holds which of them now."""

    gpus: tuple[int, ...]  # every GPU of the node
    held: Mapping[int, str] = field(default_factory=dict)  # GPU -> its holder, in words
    source: str = ""  # where `gpus` was read: "NVML", "the b300 hardware profile"

    def free(self, also: Iterable[int] = ()) -> list[int]:
        """The GPUs nobody holds, and `also` (those an instance replaced in place gives up)."""
        mine = set(also)
        return [g for g in self.gpus if g not in self.held or g in mine]

    def holding(self, holders: Mapping[int, str]) -> Room:
        """This room with more holders (the deployment's own instances)."""
        return Room(self.gpus, {**self.held, **holders}, self.source)


def choose_gpus(
    need: int, room: Room, wanted: Sequence[int] = (), own: Sequence[int] = ()
) -> tuple[int, ...] | None:
    """`need` GPUs for one instance, or None where the node has not that many free. The file's own GPUs for
    it (`wanted`) where they are all free, else those of them that are, then the lowest free others. `own`:
    GPUs the instance itself holds now and gives up first (a relaunch in place)."""
    if need <= 0:
        return ()
    free = room.free(own)
    if len(wanted) == need and all(g in free for g in wanted):
        return tuple(wanted)
    if len(own) == need and all(g in free for g in own):
        return tuple(own)
    ordered = [g for g in wanted if g in free] + [g for g in free if g not in wanted]
    if len(ordered) < need:
        return None
    return tuple(sorted(ordered[:need]))


def overlaps(instances: Mapping[str, Sequence[int]]) -> dict[int, list[str]]:
    """GPUs that two or more instances hold: GPU -> the instances (an empty dict is a sound layout)."""
    by_gpu: dict[int, list[str]] = {}
    for name, gpus in instances.items():
        for g in gpus:
            by_gpu.setdefault(g, []).append(name)
    return {g: names for g, names in by_gpu.items() if len(names) > 1}


# An instance's port (LaunchSpec.ports key) -> the role's field that sets it
PORT_FIELDS = {
    "http": "port",
    "bootstrap": "bootstrap_port",
    "encoder_bootstrap": "encoder_bootstrap_port",
    "side_channel": "side_channel_port",
    "metrics": "metrics_port",
}


def with_replicas(
    topology: Topology, counts: Mapping[str, int], ports: Mapping[str, Mapping[str, int]] | None = None
) -> Topology:
    """The file with these replicas of its roles (a multi-node role keeps its own). A role whose count
    differs from the file's gets one replica's GPUs per instance, as placeholders: its new instances are
    placed on free GPUs (`choose_gpus`), never on a share of the file's GPUs split anew. `ports`: role ->
    {port kind: port} that the role's new instance takes instead of its stepped ones (they are held)."""
    roles = dict(topology.roles)
    for name in {*counts, *(ports or {})}:
        role = roles.get(name)
        if role is None or role.nodes:
            continue
        replicas = counts.get(name, role.replicas)
        update: dict = {"replicas": replicas}
        if role.gpus and replicas != role.replicas:
            share = len(role.gpus) // role.replicas
            update["gpus"] = list(range(share * replicas))
        for kind, port in (ports or {}).get(name, {}).items():
            if kind in PORT_FIELDS:  # only the new instance is taken from such a plan
                update[PORT_FIELDS[kind]] = [port] * replicas
        roles[name] = role.model_copy(update=update)
    return topology.model_copy(update={"roles": roles})


def on_gpus(spec: LaunchSpec, gpus: tuple[int, ...], hardware: str) -> LaunchSpec:
    """The same instance on other GPUs: its GPU list, and the variable that makes them visible to it."""
    var = PROFILES[hardware].visible_devices_var
    env = {**spec.env, var: ",".join(map(str, gpus))} if var and var in spec.env else spec.env
    return replace(spec, gpus=tuple(gpus), env=env)
