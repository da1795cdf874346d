"""The one path from a file to a checked plan, shared by validate, plan, up and export."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .checks import Finding, Severity, recheck_placement, run_checks
from .errors import CheckFailed
from .plan.compose import compose
from .plan.spec import Plan
from .topology.load import LoadedTopology, load_topology


@dataclass(frozen=True)
class LoadedPlan:
    plan: Plan
    loaded: LoadedTopology
    findings: tuple[Finding, ...]

    @property
    def source(self) -> Path:
        return self.loaded.source

    @property
    def redact(self) -> Callable[[str], str]:
        return self.loaded.redact

    def report(self) -> str:
        return "\n".join(f.format(self.loaded) for f in self.findings)


def check_file(
    path: str | Path, sets: Iterable[str] = (), environ: Mapping[str, str] | None = None
) -> tuple[LoadedTopology, list[Finding], Plan | None]:
    loaded = load_topology(path, sets, environ)
    findings, plan = run_checks(loaded)
    return loaded, findings, plan


def load_plan(
    path: str | Path,
    sets: Iterable[str] = (),
    rehearse: bool = False,
    strict: bool = False,
    environ: Mapping[str, str] | None = None,
) -> LoadedPlan:
    """Load, check and plan a topology file (`${env:...}` read from `environ`, by default this process's).
    Raises TopologyError (exit 2) or CheckFailed (exit 1)."""
    loaded, findings, plan = check_file(path, sets, environ)
    stop = [f for f in findings if f.severity is Severity.ERROR or strict]
    if stop or plan is None:
        raise CheckFailed("\n".join(f.format(loaded) for f in findings))
    if rehearse:
        plan = compose(loaded.topology, rehearse=True).plan
        moved = [f for f in recheck_placement(loaded.topology, plan) if f.severity is Severity.ERROR]
        if moved:
            raise CheckFailed(
                "\n".join(
                    [
                        "the rehearsal moves every machine to a loopback address, and then:",
                        *(f.format(loaded) for f in moved),
                    ]
                )
            )
    return LoadedPlan(plan, loaded, tuple(findings))


@dataclass(frozen=True)
class UpRequest:
    """What `up` was asked: what every backend takes, and the flags of one backend as given (`flags`: the
    option as typed -> its value, only those given). The command refuses a flag the chosen backend does not
    take (Backend.flags); the backend builds its own options from the rest."""

    detach: bool = False
    fail_fast: bool = False
    rehearse: bool = False
    sets: tuple[str, ...] = ()
    flags: Mapping[str, Any] = field(default_factory=dict)
