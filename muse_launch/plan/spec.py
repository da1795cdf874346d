"""The plan's value objects: what `plan` prints is exactly what `up` runs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from muse_launch.readiness import Probe, ProbeKind
from muse_launch.topology.defaults import (
    DRAIN,
    HUNG_AFTER,
    LOG_KEEP_DEFAULT,
    LOG_MAX_SIZE_DEFAULT,
    RESET_AFTER,
    STALLED_AFTER,
    UNRESPONSIVE_AFTER,
)


@dataclass(frozen=True)
class StopPolicy:
    signal: str = "SIGTERM"
    grace: float = 30.0
    drain: float = DRAIN  # a routed worker leaving: the longest wait for its requests in flight


class RestartPolicyKind(str, Enum):
    NO = "no"
    ON_FAILURE = "on-failure"


@dataclass(frozen=True)
class RestartPolicy:
    policy: RestartPolicyKind = RestartPolicyKind.ON_FAILURE
    max: int = 3
    reset_after: float = RESET_AFTER  # seconds ready after which its restarts count from 0 again
    # An engine worker's hang (supervise/liveness.py): out of its routers, then stopped and restarted.
    unresponsive_after: float = UNRESPONSIVE_AFTER
    hung_after: float = HUNG_AFTER  # 0: never stopped for it
    stalled_after: float = STALLED_AFTER  # 0: its counters are not read


@dataclass(frozen=True)
class LogPolicy:
    max_size: int = LOG_MAX_SIZE_DEFAULT  # bytes past which the log is rotated
    keep: int = LOG_KEEP_DEFAULT  # rotated files kept: ROLE.log.1 (newest) .. ROLE.log.KEEP


@dataclass(frozen=True)
class LaunchSpec:
    """One process to start: a role instance (a replica, or one node rank of a role)."""

    name: str  # unique in the plan: "prefill", "decode-1", "worker@node1"
    role: str  # the topology role it comes from
    kind: str  # encoder | prefill | decode | worker | router | command
    engine: str  # sglang | vllm | sglang-router | smg | vllm-router | command
    launcher: tuple[str, ...]  # the program part of argv (`sglang serve`, a venv python, ...)
    args: tuple[str, ...]  # the rendered engine arguments
    env: Mapping[str, str] = field(default_factory=dict)
    gpus: tuple[int, ...] = ()
    host: str = "127.0.0.1"  # the address others use to reach it
    bind: str = "127.0.0.1"  # the address it listens on
    node: str | None = None  # node name for multi-node topologies
    ports: Mapping[str, int] = field(default_factory=dict)  # only ports this process binds
    probe: Probe = Probe(ProbeKind.HTTP, ("/health",))
    depends_on: tuple[str, ...] = ()
    stop: StopPolicy = StopPolicy()
    restart: RestartPolicy = RestartPolicy()
    logs: LogPolicy = LogPolicy()
    ready_after: float | None = None  # rehearsal: the simulated engine's start-up delay
    sim_rates: Mapping[str, float] = field(default_factory=dict)  # rehearsal: its timing (rehearse: block)

    @property
    def argv(self) -> tuple[str, ...]:
        return self.launcher + self.args

    @property
    def url(self) -> str | None:
        port = self.ports.get("http")
        return f"http://{self.host}:{port}" if port else None

    def to_dict(self, redact=lambda s: s) -> dict[str, Any]:
        return {
            "name": self.name,
            "role": self.role,
            "kind": self.kind,
            "engine": self.engine,
            "argv": [redact(a) for a in self.argv],
            "env": {k: redact(v) for k, v in self.env.items()},
            "gpus": list(self.gpus),
            "host": self.host,
            "bind": self.bind,
            "node": self.node,
            "ports": dict(self.ports),
            "probe": self.probe.to_dict(),
            "depends_on": list(self.depends_on),
            "stop": {"signal": self.stop.signal, "grace": self.stop.grace},
            "restart": {
                "policy": self.restart.policy.value,
                "max": self.restart.max,
                "reset_after": self.restart.reset_after,
                "unresponsive_after": self.restart.unresponsive_after,
                "hung_after": self.restart.hung_after,
                "stalled_after": self.restart.stalled_after,
            },
            "logs": {"max_size": self.logs.max_size, "keep": self.logs.keep},
        }


@dataclass(frozen=True)
class Plan:
    name: str
    specs: tuple[LaunchSpec, ...]  # in start order (wave by wave)
    waves: tuple[tuple[str, ...], ...]

    def spec(self, name: str) -> LaunchSpec:
        for s in self.specs:
            if s.name == name:
                return s
        raise KeyError(name)

    def stop_waves(self) -> tuple[tuple[str, ...], ...]:
        return tuple(reversed(self.waves))

    def to_dict(self, redact=lambda s: s) -> dict[str, Any]:
        return {
            "name": self.name,
            "waves": [list(w) for w in self.waves],
            "roles": [s.to_dict(redact) for s in self.specs],
        }
