"""The plan that runs, composed in one place: the file's plan (build.py) with N replicas of its roles
(placement.py), the rehearsal's simulated engines (rehearse.py), where a backend puts it, and the start
policy (start_policy.py). `plan`, `up`'s checked plan, a supervisor placing a new instance, `up` of an edited
file and the SLURM batch host take theirs from `compose`; a backend gives only where things go (`Where`).
The local host's `up` applies the start policy itself, to the plan less the roles `--only` leaves out."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from muse_launch.plan.build import build_plan
from muse_launch.plan.placement import with_replicas
from muse_launch.plan.rehearse import rehearsal_plan
from muse_launch.plan.spec import Plan
from muse_launch.plan.start_policy import StartPolicy, choose
from muse_launch.topology.model import Topology

# A backend's placement: the file's plan moved where it runs (SLURM: onto its job's nodes), given the file
# and whether it is a rehearsal (then it rehearses the plan itself, each machine at its own address).
Where = Callable[[Plan, Topology, bool], Plan]
Versions = Mapping[str, str | None]


@dataclass(frozen=True)
class Composed:
    plan: Plan
    policy: StartPolicy | None  # None: no start policy asked (the plan starts wave by wave)


def compose(
    topology: Topology,
    *,
    counts: Mapping[str, int] | None = None,
    ports: Mapping[str, Mapping[str, int]] | None = None,
    rehearse: bool = False,
    where: Where | None = None,
    versions: Versions | Callable[[Plan], Versions] | None = None,
    python: str = sys.executable,
) -> Composed:
    """`counts`/`ports`: replicas of roles and the ports a new instance takes (placement.py with_replicas);
    `rehearse`: simulated engines run by `python`; `where`: a backend's placement; `versions`: the engines'
    releases (or how to read them from the plan before its policy), for the start policy of the file's
    `start:`; without them, no policy is applied."""
    changed = with_replicas(topology, counts or {}, ports) if counts or ports else topology
    plan = build_plan(changed)
    if where is not None:
        plan = where(plan, changed, rehearse)
    elif rehearse:
        plan = rehearsal_plan(plan, changed, python)
    if versions is None:
        return Composed(plan, None)
    policy = choose(plan, topology.start, dict(versions(plan) if callable(versions) else versions))
    return Composed(policy.plan, policy)
