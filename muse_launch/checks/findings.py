"""What a check reports (a Finding at a YAML path), what it reads (the topology and its rendered
plan), and the registry of plan-level rules."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from enum import Enum

from ..plan.spec import Plan
from ..topology.hardware import PROFILES, HardwareProfile
from ..topology.load import LoadedTopology, Path_, dotted
from ..topology.model import Topology


class Severity(str, Enum):
    ERROR = "error"
    WARNING = "warning"


@dataclass(frozen=True)
class Finding:
    severity: Severity
    path: Path_
    message: str
    fix: str
    roles: tuple[str, ...] = ()

    def format(self, loaded: LoadedTopology) -> str:
        where, what = loaded.where(self.path), dotted(self.path)
        text = f"{where}: {self.severity.value}: {what}: {self.message}; fix: {self.fix}"
        return loaded.redact(text)  # messages quote values, and ${env:...} values are secrets

    def to_dict(self, loaded: LoadedTopology) -> dict[str, object]:
        return {
            "severity": self.severity.value,
            "file": str(loaded.source),
            "line": loaded.line_of(self.path),
            "path": dotted(self.path),
            "roles": list(self.roles),
            "message": loaded.redact(self.message),
            "fix": loaded.redact(self.fix),
        }


def error(path: Path_, message: str, fix: str, *roles: str) -> Finding:
    return Finding(Severity.ERROR, path, message, fix, roles)


def warning(path: Path_, message: str, fix: str, *roles: str) -> Finding:
    return Finding(Severity.WARNING, path, message, fix, roles)


def one_per_cause(findings: Iterable[Finding]) -> list[Finding]:
    """One finding per cause: replicas, node ranks and roles sharing a top-level key are named together."""
    merged: dict[tuple, Finding] = {}
    for f in findings:
        key = (f.severity, f.path, f.message, f.fix)
        seen = merged.get(key)
        merged[key] = f if seen is None else replace(seen, roles=tuple(dict.fromkeys(seen.roles + f.roles)))
    return [
        replace(f, message=f"{', '.join(f.roles)}: {f.message}") if f.roles else f for f in merged.values()
    ]


def has_errors(findings: Iterable[Finding], strict: bool = False) -> bool:
    return any(f.severity is Severity.ERROR or strict for f in findings)


@dataclass(frozen=True)
class CheckContext:
    topology: Topology
    plan: Plan
    profile: HardwareProfile = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "profile", PROFILES[self.topology.hardware])


PlanCheck = Callable[[CheckContext], Iterable[Finding]]
PLAN_CHECKS: list[PlanCheck] = []
# The rules that judge addresses and ports: run again on a plan a transformation has changed.
PLACEMENT_CHECKS: list[PlanCheck] = []


def plan_check(fn: PlanCheck) -> PlanCheck:
    PLAN_CHECKS.append(fn)
    return fn


def placement_check(fn: PlanCheck) -> PlanCheck:
    """A plan check that also judges a transformed plan (rehearsal, SLURM, export)."""
    PLACEMENT_CHECKS.append(fn)
    return plan_check(fn)
