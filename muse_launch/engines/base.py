"""What an engine is (an Engine: typed facts, a renderer, argv readers and its own rules), what it receives
and returns (role + wiring in, argv out), and what its argv reader gives back."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

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
    language_only_flag: str | None = None  # what makes a worker a language worker of encoders

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


# ---- an engine's own rules ---------------------------------------------------------------------


@dataclass(frozen=True)
class RoleView:
    """What an engine's rule reads of one role: its rendered argv and what is known around it."""

    role: str
    kind: str
    args: tuple[str, ...]
    model: str | None
    parallel: Parallel | None  # None: a size is not a positive whole number (another check says so)
    profile: HardwareProfile
    encoder_roles: tuple[str, ...]  # the topology's encoder roles, by name


@dataclass(frozen=True)
class Problem:
    """What a rule found; the checks point it at `flags`' origin (the role's args, or `key`)."""

    severity: str  # "error" | "warning"
    flags: tuple[str, ...] | str
    message: str
    fix: str
    key: str | None = None


Rule = Callable[[RoleView], Iterator[Problem]]


def error(flags: tuple[str, ...] | str, message: str, fix: str, key: str | None = None) -> Problem:
    return Problem("error", flags, message, fix, key)


def warning(flags: tuple[str, ...] | str, message: str, fix: str, key: str | None = None) -> Problem:
    return Problem("warning", flags, message, fix, key)


# ---- the engines -------------------------------------------------------------------------------


class Engine(ABC):
    """One engine muse-launch starts: its facts (class constants, every one declared below and given by each
    engine; an engine lacking one cannot be made), its renderer, and for a worker its argv readers and rules.
    muse_launch/registry.py names the module whose ENGINE is the instance."""

    NAME: ClassVar[str]
    DEFAULT_LAUNCHER: ClassVar[tuple[str, ...]]
    RELEASE: ClassVar[str | None]  # the release whose command line is written here (None: any)
    # What provides it and the Python modules its programs run (host/versions.py reads the installed release).
    DISTRIBUTIONS: ClassVar[tuple[str, ...]]
    MODULES: ClassVar[tuple[str, ...]]
    # Topology key -> the flag spellings that render it (the first one rendered; any spelling in `args`
    # overrides the key); {} where no key renders a flag.
    KEY_FLAGS: ClassVar[Mapping[str, tuple[str, ...]]]
    SHADOWED: ClassVar[Mapping[str, str]]  # flag rendered after `args` -> the key that wins over it
    WIRING: ClassVar[Mapping[str, str]]  # flag rendered from references -> the role's key listing them
    PORT_FLAGS: ClassVar[Mapping[str, str]]  # port kind -> the flag of the final argv that decides it

    def __init__(self) -> None:
        missing = missing_facts(type(self))
        if missing:
            raise TypeError(f"engine {type(self).__name__} lacks {', '.join(missing)}")

    @abstractmethod
    def render(self, inst: Instance, ctx: Context) -> Rendered: ...


def missing_facts(cls: type) -> list[str]:
    """The facts an engine class declares (here and in its bases) and does not give."""
    declared = dict.fromkeys(n for c in reversed(cls.__mro__) for n in getattr(c, "__annotations__", {}))
    return [n for n in declared if n.isupper() and not hasattr(cls, n)]


class WorkerEngine(Engine):
    """An engine that serves a model: its facts, the readers of its rendered argv, and its rules."""

    FACTS: ClassVar[WorkerFacts]
    RELEASE: ClassVar[str]  # a worker's command line is written for one release (the rehearsal plays it)
    INTEGER_FLAGS: ClassVar[tuple[str, ...]]  # options its parser takes as positive whole numbers
    CHOICES: ClassVar[Mapping[str, tuple[str, ...]]]  # flag -> the values its parser accepts
    SERVED_MODEL_NAME: ClassVar[str]
    TOKENIZER: ClassVar[tuple[str, ...]]  # a tokenizer directory of its own (bench reads it from the argv)
    TRANSFER_BACKEND_FLAGS: ClassVar[tuple[str, ...]]  # where a pair's KV hand-off protocol is set
    # The first release that accepts each flag it renders that older releases lack; the oldest release the
    # recipe allows for the models named (None: any).
    FLAG_SINCE: ClassVar[Mapping[str, str]]
    MIN_VERSION: ClassVar[str | None]
    MIN_VERSION_MODELS: ClassVar[tuple[str, ...]]
    # Its own rules on one role's argv: start-up (what its parser or start-up refuses) and hardware.
    START_UP_RULES: ClassVar[tuple[Rule, ...]]
    HARDWARE_RULES: ClassVar[tuple[Rule, ...]]

    # ---- reading a rendered argv (checks, smoke, exporters) ----

    @abstractmethod
    def model(self, args: tuple[str, ...]) -> str | None: ...

    @abstractmethod
    def served_model_name(self, args: tuple[str, ...]) -> str | None: ...

    @abstractmethod
    def transfer_backend(self, args: tuple[str, ...]) -> str: ...

    @abstractmethod
    def kv_cache_dtype(self, args: tuple[str, ...]) -> str: ...

    @abstractmethod
    def page_size(self, args: tuple[str, ...]) -> str | None: ...

    @abstractmethod
    def mem_fraction(self, args: tuple[str, ...]) -> float | None: ...

    @abstractmethod
    def parallel(self, args: tuple[str, ...], nnodes: int) -> Parallel | None: ...

    @abstractmethod
    def nnodes(self, args: tuple[str, ...]) -> str | None: ...

    @abstractmethod
    def reasoning(self, args: tuple[str, ...]) -> bool: ...

    @abstractmethod
    def tool_calls(self, args: tuple[str, ...]) -> bool: ...

    # ---- its own argument parser (checks/engine.py) ----

    @abstractmethod
    def parser_entry(self, module: str | None, rest: tuple[str, ...]) -> str | None:
        """Which of its entry points a program reaches, as checks/parser_runner.py names them; None: none."""

    def parser_args(self, entry: str, args: tuple[str, ...]) -> list[str]:
        """The argv its parser sees for this entry point (by default the argv itself)."""
        return list(args)
