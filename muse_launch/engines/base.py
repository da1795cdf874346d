"""What an engine module receives and returns: role + wiring in, argv out; and what its argv reader gives
back."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from ..readiness import Probe

if TYPE_CHECKING:  # annotations only: the simulated engine imports the engines' facts without pydantic
    from ..topology.hardware import HardwareProfile
    from ..topology.model import Role, Topology


@dataclass(frozen=True)
class WorkerFacts:
    """What the planner, the checks, the runtime, init and the renderers ask of a worker engine (the routers'
    counterpart is router.RouterFacts). None: the engine has no such thing."""

    name: str
    title: str  # as users write it in prose: "SGLang"
    default_launcher: tuple[str, ...]
    # The program its container images start with (plan --format docker drops it from the argv), and the
    # hardware profile's field naming its image; an engine without an image runs on the host.
    entrypoint: tuple[str, ...] | None
    image_field: str | None
    privileged: bool  # its containers need the host's devices (vLLM: NIXL/RDMA)
    binds: tuple[str, ...]  # the port kinds of the plan it listens on
    bootstrap_port: int | None  # a prefill's KV bootstrap server by default (replicas step from it)
    encoder_bootstrap_port: int | None  # a language worker's encoder bootstrap server by default
    # Where a language worker lists the encoders it reached (GET on its encoder bootstrap port), and the first
    # release that takes back an encoder started after it, with the env var and default seconds that keep
    # an evicted encoder that long.
    encoder_list_path: str | None
    late_encoders_since: str | None
    encoder_evicted_ttl_env: tuple[str, float] | None
    peer_flags: Mapping[str, str]  # how it is told its peers: flag -> the references rendered into it
    mem_fraction_flag: str
    attention_backend_flag: str
    rehearsed_as: str  # the simulated engine's dialect that plays it in a rehearsal (muse_launch/sim)

    def image(self, profile: HardwareProfile) -> str | None:
        return getattr(profile, self.image_field) if self.image_field else None


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
