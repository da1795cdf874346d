"""The topology file's schema: frozen pydantic models, unknown keys rejected (docs/topology.md is
generated from it)."""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from .. import registry
from . import grammar
from .defaults import (  # MAX_GRACE, STOP_SIGNALS live there: the state schema reads them, not the models
    DRAIN,
    HUNG_AFTER,
    LOG_KEEP_DEFAULT,
    LOG_MAX_KEEP,
    LOG_MAX_SIZE_DEFAULT,
    MAX_GRACE,
    METRICS_PORT_OFFSET,
    RESET_AFTER,
    STALLED_AFTER,
    STOP_SIGNALS,
    UNRESPONSIVE_AFTER,
)
from .hardware import PROFILES

RoleKind = Literal["encoder", "prefill", "decode", "worker", "router", "command"]
WORKER_KINDS = ("encoder", "prefill", "decode", "worker")
WORKER_ENGINES = tuple(registry.WORKER_ENGINES)
ROUTER_ENGINES = tuple(registry.ROUTER_ENGINES)
NAME_PATTERN = r"^[a-z0-9][a-z0-9_.-]*$"  # for the JSON schema; the loader checks names whole (grammar.py)
MAX_GPUS_PER_NODE = 1024  # a range past it is a typo (`0-999999999` would allocate a billion indices)
MAX_REPLICAS = 256  # each replica is a process, a port and a log on one host; a billion never returns
MAX_NAME = grammar.MAX_NAME
MAX_WAIT = 86400.0  # probe timeouts, intervals and rehearsal delays: finite, at most a day
LOG_MIN_SIZE = 64 * 1024  # smaller would rotate on every tick of a chatty role
LOG_MAX_SIZE = 1024**4


def _scalar_to_str(value: Any) -> Any:
    # YAML turns `true` and `8` into bool and int; environment and argv want the text.
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    return value


# YAML writes `8` and `true` unquoted; the validators below turn them into text, and the schema says so.
_SCALAR = {"type": ["string", "number", "boolean"]}


def _env_fits(env: dict[str, str]) -> dict[str, str]:
    # execve takes NAME=VALUE strings ending at NUL: a value with NUL cannot pass (names: grammar.env_name).
    for key, value in env.items():
        if "\0" in value:
            raise ValueError(
                f"environment value of {key} holds a NUL character, which no process can receive"
            )
    return env


def _argv_fits(argv: list[str]) -> list[str]:
    for item in argv:
        if "\0" in item:
            raise ValueError(f"argument {item!r} holds a NUL character, which no process can receive")
    return argv


EnvName = Annotated[str, AfterValidator(grammar.env_name)]
RoleName = Annotated[str, AfterValidator(grammar.role_name)]
NodeName = Annotated[str, AfterValidator(grammar.node_name)]
Host = Annotated[str, AfterValidator(grammar.host)]
Line = Annotated[
    str, AfterValidator(grammar.one_line)
]  # a single-line value: no CR, LF, NUL or other control
Env = Annotated[
    dict[EnvName, str],
    AfterValidator(_env_fits),
    WithJsonSchema({"type": "object", "additionalProperties": _SCALAR}),
]
Argv = Annotated[list[str], AfterValidator(_argv_fits), WithJsonSchema({"type": "array", "items": _SCALAR})]
Port = Annotated[int, Field(ge=1, le=65535)]
Seconds = Annotated[float, Field(allow_inf_nan=False, le=MAX_WAIT)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @field_validator("args", "launcher", "command", mode="before", check_fields=False)
    @classmethod
    def _argv_text(cls, value: Any) -> Any:
        return [_scalar_to_str(x) for x in value] if isinstance(value, list) else value

    @field_validator("env", mode="before", check_fields=False)
    @classmethod
    def _env_text(cls, value: Any) -> Any:
        return {k: _scalar_to_str(v) for k, v in value.items()} if isinstance(value, dict) else value


class ReadyProbe(Strict):
    """`ready:` override: exactly one of http, tcp, log."""

    http: str | None = Field(None, description="path polled with GET, e.g. /health")
    status: int = 200
    tcp: bool = False
    log: Line | None = Field(None, description="regex searched in the role's log")
    timeout: Seconds | None = Field(None, gt=0, description="seconds before the role counts as failed")
    interval: Seconds = Field(0.5, gt=0)

    @model_validator(mode="after")
    def _exactly_one(self) -> ReadyProbe:
        chosen = [k for k, on in (("http", self.http), ("tcp", self.tcp), ("log", self.log)) if on]
        if len(chosen) != 1:
            raise ValueError("give exactly one of http: /path, tcp: true or log: REGEX")
        if self.http is not None and not self.http.startswith("/"):
            raise ValueError(f"http path must start with '/', e.g. /{self.http}")
        if self.http is not None and any(ord(c) <= 0x20 or ord(c) == 0x7F for c in self.http):
            # CR/LF would write a second header line into the request; a space ends the path
            raise ValueError(
                f"http path {self.http!r} holds a space or a control character (CR, LF...); percent-encode it"
            )
        if self.log is not None:
            try:
                re.compile(self.log)
            except re.error as exc:
                raise ValueError(f"log pattern {self.log!r} is not a regular expression: {exc}") from None
        return self


class StopConfig(Strict):
    signal: Line = "SIGTERM"
    grace: float = Field(30.0, ge=0, le=MAX_GRACE, allow_inf_nan=False)
    drain: float = Field(
        DRAIN,
        ge=0,
        le=MAX_GRACE,
        allow_inf_nan=False,
        description="a routed worker (prefill, decode, worker): the longest it waits for its requests in "
        "flight when it leaves, before its stop signal (on Kubernetes its preStop hook, and "
        "terminationGracePeriodSeconds is this plus grace); size it to the longest request you serve",
    )

    @field_validator("signal")
    @classmethod
    def _known_signal(cls, value: str) -> str:
        name = value.upper() if value.upper().startswith("SIG") else "SIG" + value.upper()
        if name not in STOP_SIGNALS:
            raise ValueError(
                f"{value!r} is not a signal that stops a process; use one of {', '.join(STOP_SIGNALS)}"
            )
        return name


class RestartConfig(Strict):
    policy: Literal["no", "on-failure"] = "on-failure"
    max: int = Field(3, ge=0)
    reset_after: Seconds = Field(
        RESET_AFTER,
        gt=0,
        description="seconds ready after which its restarts count from 0 "
        "again (a crash a day is not a crash loop)",
    )
    unresponsive_after: Seconds = Field(
        UNRESPONSIVE_AFTER,
        gt=0,
        description="an engine worker: seconds without a sign of life (SIGSTOP, /metrics unanswered) "
        "before the supervisor takes it out of every router that lists it (back in once it answers)",
    )
    hung_after: Seconds = Field(
        HUNG_AFTER,
        ge=0,
        description="an engine worker: seconds without a sign of life before it is stopped (its stuck "
        "requests end with an error) and restarted under `policy`; 0: never",
    )
    stalled_after: Seconds = Field(
        STALLED_AFTER,
        ge=0,
        description="an engine worker: seconds with requests running and no token prefilled or generated "
        "(its /metrics counters) before it counts as hung; 0: never",
    )


SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "kib": 1024,
    "m": 1000**2,
    "mb": 1000**2,
    "mib": 1024**2,
    "g": 1000**3,
    "gb": 1000**3,
    "gib": 1024**3,
}


def _size_bytes(value: Any) -> Any:
    """`100MiB`, `1.5 GB`, `65536` -> bytes."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a size; write e.g. 100MiB")
    if isinstance(value, int):
        return value
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(value))
    if not match or match.group(2).lower() not in SIZE_UNITS:
        raise ValueError(f"cannot read size {value!r}; write bytes or e.g. 512KiB, 100MiB, 2GiB")
    return int(Decimal(match.group(1)) * SIZE_UNITS[match.group(2).lower()])  # exact: 400 digits are no float


class LogsConfig(Strict):
    """`logs: {max_size: 100MiB, keep: 2}`: a role's log is rotated past max_size, the newest `keep` rotated
    files kept (ROLE.log.1 the newest); at most (keep + 1) x max_size on disk per role."""

    max_size: Annotated[
        int,
        BeforeValidator(_size_bytes),
        Field(ge=LOG_MIN_SIZE, le=LOG_MAX_SIZE),
        WithJsonSchema({"type": ["string", "integer"], "description": "bytes, or e.g. 100MiB"}),
    ] = LOG_MAX_SIZE_DEFAULT
    keep: int = Field(
        LOG_KEEP_DEFAULT, ge=0, le=LOG_MAX_KEEP, description="rotated files kept: ROLE.log.1 .. .N"
    )


class RehearseConfig(Strict):
    """`up --rehearse`: the simulated engine's start-up delay and timing model (docs/bench.md)."""

    ready_after: Seconds | None = Field(None, ge=0, description="simulated start-up time in seconds")
    prefill_tokens_per_s: float | None = Field(
        None,
        gt=0,
        le=1e9,
        allow_inf_nan=False,
        description="prompt tokens prefilled per second, one prompt at a time",
    )
    itl_ms: float | None = Field(
        None,
        ge=0,
        le=60000,
        allow_inf_nan=False,
        description="milliseconds per output token with one request running",
    )
    itl_ms_per_running: float | None = Field(
        None,
        ge=0,
        le=60000,
        allow_inf_nan=False,
        description="milliseconds added to each token per other running request",
    )
    max_running: int | None = Field(
        None, ge=1, le=1000000, description="requests decoded at once; the others queue"
    )

    def rates(self) -> dict[str, float]:
        """The timing keys that are set."""
        return {k: v for k, v in self.model_dump().items() if k != "ready_after" and v is not None}


class AutoscaleTargets(Strict):
    """The latency promise: at `percentile`, time to first token and inter-token latency (seconds)."""

    ttft: Seconds | None = Field(None, gt=0, description="time to first token, seconds (prefill's target)")
    itl: Seconds | None = Field(None, gt=0, description="inter-token latency, seconds (decode's target)")
    percentile: float = Field(90, gt=0, lt=100, allow_inf_nan=False, description="e.g. 90 for p90")

    @model_validator(mode="after")
    def _one_target(self) -> AutoscaleTargets:
        if self.ttft is None and self.itl is None:
            raise ValueError("give ttft: SECONDS, itl: SECONDS or both")
        return self


class AutoscaleBounds(Strict):
    min: int = Field(1, ge=1, le=MAX_REPLICAS, description="instances it never goes below")
    max: int = Field(ge=1, le=MAX_REPLICAS, description="instances it never goes above")

    @model_validator(mode="after")
    def _ordered(self) -> AutoscaleBounds:
        if self.min > self.max:
            raise ValueError(f"min {self.min} is above max {self.max}; give min <= max")
        return self


class AutoscaleConfig(Strict):
    """`autoscale:`: keep the targets with the fewest GPUs, prefill and decode each on its own bottleneck
    (docs/autoscale.md)."""

    mode: Literal["act", "advise"] = Field(
        "act", description="act: the supervisor scales; advise: it only records what it would do"
    )
    targets: AutoscaleTargets = Field(description="{ttft: SECONDS, itl: SECONDS, percentile: 90}")
    roles: dict[RoleName, AutoscaleBounds] = Field(
        min_length=1, description="worker role -> {min, max} instances"
    )
    gpus: int | None = Field(
        None,
        ge=0,
        le=MAX_GPUS_PER_NODE * MAX_REPLICAS,
        description="GPU budget: the most the scaled roles hold together (default: no budget but the GPUs)",
    )
    interval: Seconds = Field(30.0, ge=1, description="seconds between decisions")
    cooldown: Seconds | None = Field(
        None, ge=0, description="seconds after a change before the role changes again (default: 2 intervals)"
    )
    manual_hold: Seconds = Field(
        1800.0, ge=0, description="seconds a manual `scale` stands as the floor (up) or ceiling (down)"
    )


class NodeConfig(Strict):
    address: Host


PortSpec = Port | list[Port]


class Role(Strict):
    kind: RoleKind
    engine: Line | None = Field(None, description="sglang | vllm | sglang-router | smg | vllm-router")
    model: Line | None = None
    gpus: list[int] | str | None = Field(None, description="GPU indices, e.g. [0, 1] or '0-3'")
    port: PortSpec | None = None
    host: Host | None = None
    bind: Host | None = None
    tp: int | None = Field(None, ge=1)
    ep: int | None = Field(None, ge=1)
    dp: int | None = Field(None, ge=1)
    pp: int | None = Field(None, ge=1)
    mem_fraction: float | None = Field(None, gt=0, le=1)
    transfer_backend: Line | None = None
    bootstrap_port: PortSpec | None = None
    encoders: list[Line] = []
    encoder_bootstrap_port: PortSpec | None = None
    encoder_transfer_backend: Line | None = None
    kv_cache_dtype: Line | None = None
    page_size: int | None = Field(None, ge=1)
    kv_transfer_config: dict[str, Any] | None = Field(
        None, description="vLLM: extra fields of --kv-transfer-config"
    )
    side_channel_port: PortSpec | None = Field(None, description="vLLM NIXL side channel / connector port")
    prefill: list[Line] = []
    decode: list[Line] = []
    workers: list[Line] = []
    metrics_port: PortSpec | None = Field(None, description="router Prometheus port (default: port + 21000)")
    after: list[Line] = []
    replicas: int = Field(1, ge=1, le=MAX_REPLICAS)
    nodes: list[NodeName] = []
    dist_init_port: Port | None = None
    launcher: Argv | None = None
    command: Argv | None = None
    ready: ReadyProbe | None = None
    stop: StopConfig = StopConfig()
    restart: RestartConfig = RestartConfig()
    rehearse: RehearseConfig = RehearseConfig()
    logs: LogsConfig | None = Field(None, description="this role's log cap (default: the file's `logs:`)")
    env: Env = {}
    args: Argv = []

    @field_validator("gpus")
    @classmethod
    def _gpu_list(cls, value: list[int] | str | None) -> list[int] | None:
        if value is None or isinstance(value, list):
            if value is not None and any(g < 0 for g in value):
                raise ValueError("GPU indices start at 0")
            return value
        out: list[int] = []
        for part in str(value).split(","):
            lo, _, hi = part.strip().partition("-")
            if not lo.isdigit() or (hi and not hi.isdigit()):
                raise ValueError(f"cannot read GPUs {value!r}; write [0, 1, 2, 3] or '0-3'")
            first, last = int(lo), int(hi or lo)
            if last < first:
                raise ValueError(f"GPU range {part.strip()!r} runs backwards; write '{last}-{first}'")
            if last - first >= MAX_GPUS_PER_NODE:
                raise ValueError(f"GPU range {part.strip()!r} spans more than {MAX_GPUS_PER_NODE} GPUs")
            out.extend(range(first, last + 1))
        return out

    @model_validator(mode="after")
    def _kind_rules(self) -> Role:
        if self.kind == "command" and not self.command:
            raise ValueError("a command role needs command: [program, arg, ...]")
        if self.kind != "command" and self.command:
            raise ValueError("command: is only for kind: command; use launcher: to change the program")
        if self.kind == "router" and self.engine is not None and self.engine not in ROUTER_ENGINES:
            raise ValueError(f"router engine must be one of {', '.join(ROUTER_ENGINES)}")
        if self.kind in WORKER_KINDS and self.engine is not None and self.engine not in WORKER_ENGINES:
            raise ValueError(f"worker engine must be one of {', '.join(WORKER_ENGINES)}")
        if self.replicas > 1 and self.nodes:
            raise ValueError("replicas and nodes cannot be combined; give each replica its own role")
        for key in ("port", "bootstrap_port", "encoder_bootstrap_port", "side_channel_port", "metrics_port"):
            spec = getattr(self, key)
            if isinstance(spec, int) and spec + self.replicas - 1 > 65535:
                raise ValueError(
                    f"{key} {spec} steps past 65535 for {self.replicas} replicas "
                    f"(the last would be {spec + self.replicas - 1}); choose a lower {key}"
                )
        if self.kind == "router" and self.metrics_port is None and isinstance(self.port, int):
            if self.port + METRICS_PORT_OFFSET + self.replicas - 1 > 65535:
                raise ValueError(
                    f"the router's metrics port defaults to port + {METRICS_PORT_OFFSET}, past 65535 "
                    f"for port {self.port}; set metrics_port"
                )
        return self

    @property
    def references(self) -> dict[str, list[str]]:
        return {
            "encoders": self.encoders,
            "prefill": self.prefill,
            "decode": self.decode,
            "workers": self.workers,
            "after": self.after,
        }


class Topology(Strict):
    version: Literal[1]
    name: Annotated[str, AfterValidator(grammar.deployment_name)] = Field(
        json_schema_extra={"pattern": NAME_PATTERN, "maxLength": MAX_NAME},
        description="deployment name (run directory, `down NAME`)",
    )
    description: str = ""
    hardware: str = Field(description="hardware profile: " + ", ".join(PROFILES))
    model: Line | None = None
    engine: Literal[WORKER_ENGINES] = "sglang"  # type: ignore[valid-type]  (the registry's names)
    host: Host = "127.0.0.1"
    bind: Host | None = None
    env: Env = {}
    args: Argv = []
    launcher: Argv | None = Field(None, description="default program for engine workers")
    nodes: dict[NodeName, NodeConfig] = {}
    rehearse: RehearseConfig = RehearseConfig()
    logs: LogsConfig = Field(LogsConfig(), description="each role's log cap: {max_size: 100MiB, keep: 2}")
    start: Literal["overlap", "waves"] | None = Field(
        None,
        description="overlap: roles whose engines tolerate a late peer start together (default where the "
        "installed versions allow it); waves: each role once all it is wired to are ready",
    )
    roles: dict[RoleName, Role] = Field(min_length=1)
    autoscale: AutoscaleConfig | None = Field(
        None, description="latency targets, per role bounds and a GPU budget (docs/autoscale.md)"
    )

    @field_validator("hardware")
    @classmethod
    def _known_hardware(cls, value: str) -> str:
        if value not in PROFILES:
            raise ValueError(f"unknown hardware {value!r}; one of: {', '.join(PROFILES)}")
        return value

    def role_engine(self, role: Role) -> str:
        if role.engine:
            return role.engine
        if role.kind == "router":
            return "sglang-router"
        if role.kind == "command":
            return "command"
        return self.engine
