"""Checks before anything starts: Topology and its rendered Plan -> Findings.

Structural rules run on the Topology; the rest judge the Plan that `up` would execute, so a flag
given in `args` counts the same as its key. This package sits above `plan/`: it reads plans, and
nothing below it imports it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from ..plan.build import PlanError, build_plan
from ..plan.spec import Plan
from ..topology.load import LoadedTopology
from ..topology.model import Topology
from . import addresses, autoscale, engine_rules, gpu_fit, hardware, pairs, ports  # noqa: F401  registers the plan rules
from .findings import (
    PLACEMENT_CHECKS,
    PLAN_CHECKS,
    CheckContext,
    Finding,
    PlanCheck,
    Severity,
    error,
    has_errors,
)
from .structural import structural_checks

__all__ = ["Finding", "Severity", "has_errors", "recheck_placement", "run_checks"]


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
    return findings + _run(PLAN_CHECKS, CheckContext(topology, plan)), plan


def recheck_placement(topology: Topology, plan: Plan) -> list[Finding]:
    """The address and port rules again, on a plan a transformation (rehearsal, SLURM, export) changed."""
    return _run(PLACEMENT_CHECKS, CheckContext(topology, plan))


def _run(checks: Iterable[PlanCheck], ctx: CheckContext) -> list[Finding]:
    merged: dict[tuple[object, ...], Finding] = {}
    for check in checks:
        for f in check(ctx):
            # One cause reached from several roles (a top-level key) is one finding naming them all.
            key = (f.severity, f.path, f.message, f.fix)
            seen = merged.get(key)
            merged[key] = (
                f if seen is None else replace(seen, roles=tuple(dict.fromkeys(seen.roles + f.roles)))
            )
    return list(merged.values())
