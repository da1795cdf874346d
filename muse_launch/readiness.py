"""How a role is seen ready: the probe a launch spec carries. Below both the engine modules (which choose
each role's probe) and the plan (whose LaunchSpec holds it), so that neither imports the other for it."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any


class ProbeKind(str, Enum):
    HTTP = "http"
    TCP = "tcp"
    LOG = "log"
    PROCESS = "process"  # no endpoint (a non-zero node rank): ready once alive for a moment


@dataclass(frozen=True)
class Probe:
    kind: ProbeKind
    paths: tuple[str, ...] = ()  # HTTP: each must answer `status`, in order
    status: int = 200
    pattern: str | None = None  # LOG: a regex matched against the role's log
    timeout: float = 1800.0
    interval: float = 0.5

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind.value, "timeout": self.timeout, "interval": self.interval}
        if self.kind is ProbeKind.HTTP:
            out.update(paths=list(self.paths), status=self.status)
        if self.kind is ProbeKind.LOG:
            out["pattern"] = self.pattern
        return out
