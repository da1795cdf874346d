"""A P:D split of one host: `sweep --vary split=1:3,2:2,3:1`.

A split changes two roles together: P prefill replicas and D decode replicas, each replica keeping the GPUs
per replica the file gives it (its `gpus` divided by its `replicas`), laid out on the host's GPUs from 0,
prefill first. One `--vary roles.X.replicas=...` per role would make every pair, most of which do not fit the
host; a split is one axis whose values all hold the same GPUs.

Pure: the topology is given, loaded; the answer is the `--set` assignments that make the split.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from muse_launch.errors import UsageError
from muse_launch.topology.hardware import PROFILES
from muse_launch.topology.model import Role, Topology

SPLIT_KEY = "split"
EXAMPLE = "--vary split=1:3,2:2,3:1"
_COUNT = re.compile(r"[0-9]{1,4}")  # ASCII digits only: str.isdigit() takes "²", which int() refuses


@dataclass(frozen=True)
class Split:
    prefill: int
    decode: int

    def __str__(self) -> str:
        return f"{self.prefill}P:{self.decode}D"


def is_split(assignment: str) -> bool:
    return assignment.partition("=")[0].strip() == SPLIT_KEY


def parse_split(text: str) -> Split:
    """`2:2` (or `2P:2D`) as a Split; a UsageError saying what to write otherwise."""
    p, colon, d = text.strip().upper().partition(":")
    p, d = p.strip().removesuffix("P"), d.strip().removesuffix("D")
    if not colon or not _COUNT.fullmatch(p) or not _COUNT.fullmatch(d) or int(p) < 1 or int(d) < 1:
        raise UsageError(
            f"--vary split: {text.strip()!r} is not a split: write PREFILL:DECODE replicas, each at least 1",
            fix=EXAMPLE,
        )
    return Split(int(p), int(d))


def _role(topology: Topology, kind: str) -> tuple[str, Role]:
    named = [(n, r) for n, r in topology.roles.items() if r.kind == kind]
    if len(named) != 1:
        have = ", ".join(f"{n} ({r.kind})" for n, r in topology.roles.items())
        raise UsageError(
            f"--vary split: {topology.name} has {len(named)} {kind} roles (roles: {have}); a split needs "
            "exactly one prefill and one decode role",
            fix="vary each role's replicas instead, e.g. --vary roles.decode.replicas=1,2",
        )
    name, role = named[0]
    if role.nodes:
        raise UsageError(
            f"--vary split: roles.{name} spans nodes ({', '.join(role.nodes)}); a split lays roles out on "
            "one host",
            fix="vary its replicas instead, e.g. --vary roles.decode.replicas=1,2",
        )
    if not role.gpus or len(role.gpus) % role.replicas:
        raise UsageError(
            f"--vary split: roles.{name} gives no GPUs per replica (gpus: {role.gpus}, replicas: "
            f"{role.replicas}); a split keeps each replica's GPUs",
            fix=f"give it its GPUs in the file, e.g. --set roles.{name}.gpus=0-3",
        )
    return name, role


def _ports(role: Role, count: int) -> list[int]:
    if role.port is None:
        return []
    if isinstance(role.port, list):
        return list(role.port[:count])
    return [role.port + i for i in range(count)]


def host_gpus(topology: Topology) -> int:
    return PROFILES[topology.hardware].gpus_per_node


def fitting(topology: Topology, per_prefill: int, per_decode: int) -> list[Split]:
    """The splits that fit the host and leave no room for one more replica of either role."""
    n = host_gpus(topology)

    def fits(p: int, d: int) -> bool:
        return p * per_prefill + d * per_decode <= n

    return [
        Split(p, d)
        for p in range(1, n + 1)
        for d in range(1, n + 1)
        if fits(p, d) and not fits(p + 1, d) and not fits(p, d + 1)
    ]


def describe(sets: list[str]) -> str:
    """split_sets' answer in words: `prefill 1 x 2 GPUs (0-1), decode 3 x 2 GPUs (2-7)`."""
    values = dict(s.split("=", 1) for s in sets)
    parts = []
    for key in [k for k in values if k.endswith(".replicas")]:
        role = key.split(".")[1]
        gpus = [int(g) for g in values[f"roles.{role}.gpus"].strip("[]").split(",")]
        n = int(values[key])
        parts.append(f"{role} {n} x {len(gpus) // n} GPUs ({gpus[0]}-{gpus[-1]})")
    return ", ".join(parts)


def split_sets(topology: Topology, split: Split) -> list[str]:
    """The `--set` assignments that lay `split` out on the host; a UsageError where it does not fit."""
    pname, prefill = _role(topology, "prefill")
    dname, decode = _role(topology, "decode")
    assert prefill.gpus is not None and decode.gpus is not None
    per_p = len(prefill.gpus) // prefill.replicas
    per_d = len(decode.gpus) // decode.replicas
    need = split.prefill * per_p + split.decode * per_d
    n = host_gpus(topology)
    if need > n:
        fits = ",".join(f"{s.prefill}:{s.decode}" for s in fitting(topology, per_p, per_d))
        raise UsageError(
            f"--vary split={split.prefill}:{split.decode}: {split.prefill} prefill x {per_p} GPUs + "
            f"{split.decode} decode x {per_d} GPUs = {need} GPUs; the {topology.hardware} host has {n}",
            fix=f"--vary split={fits}" if fits else "give each role fewer GPUs per replica",
        )
    p_ports, d_ports = _ports(prefill, split.prefill), _ports(decode, split.decode)
    if (
        isinstance(prefill.port, list)
        and len(p_ports) < split.prefill
        or (isinstance(decode.port, list) and len(d_ports) < split.decode)
    ):
        raise UsageError(
            f"--vary split={split.prefill}:{split.decode}: a role lists fewer ports than its replicas",
            fix=f"give roles.{pname}.port and roles.{dname}.port as one number each (replicas step from it)",
        )
    clash = sorted(set(p_ports) & set(d_ports))
    if clash:
        raise UsageError(
            f"--vary split={split.prefill}:{split.decode}: roles.{pname}'s ports {p_ports} and "
            f"roles.{dname}'s {d_ports} meet at {clash[0]} (replicas step from a role's port)",
            fix=f"--set roles.{dname}.port={max(p_ports) + 100}",
        )
    gpus = list(range(need))
    p_gpus, d_gpus = gpus[: split.prefill * per_p], gpus[split.prefill * per_p :]
    return [
        f"roles.{pname}.replicas={split.prefill}",
        f"roles.{pname}.gpus=[{', '.join(map(str, p_gpus))}]",
        f"roles.{dname}.replicas={split.decode}",
        f"roles.{dname}.gpus=[{', '.join(map(str, d_gpus))}]",
    ]
