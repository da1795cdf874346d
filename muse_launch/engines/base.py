"""What an engine module receives and returns: role + wiring in, argv out; and what its argv reader gives back."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from ..readiness import Probe

if TYPE_CHECKING:  # annotations only: the simulated engine imports the engines' facts without pydantic
    from ..topology.hardware import HardwareProfile
    from ..topology.model import Role, Topology


@dataclass(frozen=True)
class Upstream:
    """A referenced instance as its dependents see it."""

    name: str
    url: str
    engine: str
    bootstrap_port: int | None = None


@dataclass(frozen=True)
class Instance:
    """One role instance: a replica, or one node rank of a multi-node role."""

    name: str
    role_name: str
    role: Role
    kind: str
    engine: str
    model: str | None
    gpus: tuple[int, ...]
    host: str  # advertised address
    bind: str  # listen address
    port: int | None
    bootstrap_port: int | None = None
    encoder_bootstrap_port: int | None = None
    side_channel_port: int | None = None
    metrics_port: int | None = None
    node: str | None = None
    node_rank: int = 0
    nnodes: int = 1
    dist_init_host: str | None = None  # rank 0's address, for --dist-init-addr / --master-addr
    dist_init_port: int | None = None
    replica: int | None = None
    replicas: int = 1
    # Wiring, resolved from references.
    encoders: tuple[Upstream, ...] = ()
    prefill: tuple[Upstream, ...] = ()
    decode: tuple[Upstream, ...] = ()
    workers: tuple[Upstream, ...] = ()

    @property
    def url(self) -> str | None:
        return f"http://{self.host}:{self.port}" if self.port else None

    @property
    def serves_http(self) -> bool:
        return self.port is not None and self.node_rank == 0


@dataclass(frozen=True)
class Context:
    topology: Topology
    profile: HardwareProfile
    launcher: tuple[str, ...]  # already resolved: role's, topology's, or the engine's default


@dataclass(frozen=True)
class Rendered:
    args: tuple[str, ...]
    ports: Mapping[str, int]
    probe: Probe
    env: Mapping[str, str] = field(default_factory=dict)


class Renderer(Protocol):
    DEFAULT_LAUNCHER: tuple[str, ...]

    def render(self, inst: Instance, ctx: Context) -> Rendered: ...


@dataclass(frozen=True)
class Parallel:
    """Parallel sizes read from a worker's argv."""

    tp: int = 1
    ep: int = 1
    dp: int = 1
    pp: int = 1
    nnodes: int = 1
    dp_attention: bool = False  # SGLang: attention DP runs on the TP GPUs

    @property
    def ranks(self) -> int:
        """GPUs the role occupies."""
        return self.tp * self.pp * (1 if self.dp_attention else self.dp)

    def describe(self) -> str:
        if self.dp_attention:
            return f"tp {self.tp} x pp {self.pp} (attention dp {self.dp} shares the TP GPUs)"
        return f"tp {self.tp} x dp {self.dp} x pp {self.pp}"
