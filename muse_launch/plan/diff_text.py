"""A Difference as `up` prints it: one line per change, then the plan of execution, one line per step.

Everything shown is as redacted (the running side as state.json keeps it, the new side through the file's
redact), and escaped: what comes back from the run directory may hold anything.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..printable import escaped
from .diff import ComparedInstance, Difference, Step, StepKind

ROLLED = "rolled, one instance at a time"
ROUTER_RESTART = "restarted, workers re-registered"


def difference_lines(difference: Difference) -> list[str]:
    """`+ decode-1 (replicas 1 -> 2)`, `~ decode: args ... (rolled, one instance at a time)`, `- encoder-1`,
    `~ router: ... (restarted, workers re-registered)`, then the roles not touched."""
    out: list[str] = []
    for change in difference.roles:
        steps = [s for s in difference.steps if s.role == change.role]
        count = f"replicas {change.before} -> {change.after}"
        for step in steps:
            if step.kind is StepKind.ADD:
                out.append(f"+ {step.instance} ({count if change.before else 'new role'})")
            elif step.kind is StepKind.REMOVE:
                out.append(f"- {step.instance} ({count if change.after else 'role removed'})")
        out += _changed(change.role, [s for s in steps if s.kind in (StepKind.ROLL, StepKind.RESTART_ROUTER)])
    out += [f"= {old} (kept as it runs; the file names it {new} now)" for old, new in difference.kept]
    if difference.unchanged:
        out.append(f"unchanged, not touched: {', '.join(difference.unchanged)}")
    return [escaped(line) for line in out]


def _changed(role: str, steps: list[Step]) -> list[str]:
    """One line for a role whose instances all change alike, else one per instance."""
    if not steps:
        return []
    how = ROUTER_RESTART if steps[0].kind is StepKind.RESTART_ROUTER else ROLLED
    if len({s.changes for s in steps}) == 1:
        label = role if len(steps) > 1 or steps[0].instance == role else steps[0].instance
        many = f"{len(steps)} instances, " if len(steps) > 1 else ""
        return [f"~ {label}: {'; '.join(steps[0].changes)} ({many}{how})"]
    return [f"~ {s.instance}: {'; '.join(s.changes)} ({how})" for s in steps]


def step_line(step: Step) -> str:
    """What one step of the plan of execution does."""
    kind = (step.new or step.old).launch.kind
    if step.kind is StepKind.ADD:
        then = (
            ", then list it to its language workers"
            if kind == "encoder"
            else ", then register it with its router"
            if kind in ("prefill", "decode", "worker")
            else ""
        )
        return escaped(f"start {step.instance} ({step.role}), wait until it is ready{then}")
    if step.kind is StepKind.REMOVE:
        how = (
            "unlist it from its language workers"
            if kind == "encoder"
            else "drain it (no new requests; those in flight finish)"
            if kind in ("prefill", "decode", "worker")
            else "stop it"
        )
        return escaped(f"{how}, then stop {step.instance}" if how != "stop it" else f"stop {step.instance}")
    if step.kind is StepKind.ROLL:
        return escaped(f"restart {step.instance} with its new launch, wait until it is ready and wired")
    return escaped(f"restart {step.instance} with its new launch, then register its workers again")


def plan_lines(difference: Difference) -> list[str]:
    width = len(str(len(difference.steps)))
    return [f"{i:>{width}}. {step_line(s)}" for i, s in enumerate(difference.steps, 1)]


def start_lines(instances: Iterable[ComparedInstance]) -> list[str]:
    """`--dry-run` of a deployment that is not running: what `up` would start, in start order."""
    return [
        escaped(f"+ {i.name} ({i.launch.kind}, {i.launch.engine}{', ' + i.url if i.url else ''})")
        for i in instances
    ]
