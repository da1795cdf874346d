"""state.json read back as untrusted input: anyone who can write the run directory (or a crash, a full disk,
an older muse-launch) may have left anything there. Its size and nesting are bounded before it is parsed, and
what parses must fit a strict model: every type exact (no "1" for 1, no true for 1), signals ones `down` may
send, stop waves naming the roles and nothing else, cgroups the deployment's own, times ISO 8601 with a
zone, URLs http(s). Whatever does not fit is `StateDamaged`, and `down` falls back to the deployment's marker
and role cgroups (local/down.py)."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from muse_launch.bounded_json import Damaged, load_bounded_json
from muse_launch.proc.cgroups import LAYOUT_DIR, deployment_dir_name
from muse_launch.rundir.lifecycle import BACKEND_NAMES, RoleState
from muse_launch.topology.defaults import MAX_GRACE, STOP_SIGNALS  # not model.py: its pydantic models

MAX_STATE_BYTES = 8 << 20  # a topology file is at most 1 MiB; its state is a few times that at worst
MAX_DEPTH = 16  # state.json nests 5 deep (deployment, roles, role, probe, paths)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def load_state_json(data: bytes) -> Any:
    return load_bounded_json(data, MAX_STATE_BYTES, MAX_DEPTH)


def _plain(value: str, what: str) -> str:
    if _CONTROL.search(value):
        raise ValueError(f"{what} holds a control character")
    return value


class _Strict(BaseModel):
    # Unknown keys are allowed (a newer muse-launch may add some); the known ones must be exact.
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)


Seconds = Field(ge=0, le=MAX_GRACE, allow_inf_nan=False)
Pid = Field(gt=0, lt=1 << 22)  # the kernel's pid_max is at most 2^22


class ProbeModel(_Strict):
    kind: str = Field(pattern="^(http|tcp|log|process)$")
    paths: list[str] = []
    status: int = Field(200, ge=100, le=599)
    pattern: str | None = None
    timeout: float = Field(ge=0, allow_inf_nan=False)
    interval: float = Field(gt=0, allow_inf_nan=False)

    @field_validator("paths")
    @classmethod
    def _paths(cls, paths: list[str]) -> list[str]:
        for path in paths:
            if not path.startswith("/"):
                raise ValueError(f"probe path {path!r} does not start with /")
            _plain(path, "a probe path")
        return paths


class StopModel(_Strict):
    signal: str
    grace: float = Seconds

    @field_validator("signal")
    @classmethod
    def _signal(cls, value: str) -> str:
        if value not in STOP_SIGNALS:
            raise ValueError(f"{value!r} is not a signal `down` stops a role with")
        return value


def _iso(value: str | None) -> str | None:
    if value is None:
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"{value[:40]!r} is not an ISO 8601 time") from None
    if moment.tzinfo is None:
        raise ValueError(f"{value[:40]!r} has no time zone")
    return value


class RoleModel(_Strict):
    name: str = Field(min_length=1, max_length=200)
    kind: str
    state: RoleState = Field(strict=False)  # its value, as written
    pid: int | None = Pid
    create_time: float | None = Field(None, ge=0, allow_inf_nan=False)
    start_ticks: int | None = Field(None, ge=0)
    boot_id: str | None = None
    gpus: list[int] = Field(max_length=4096)
    url: str | None = None
    ports: dict[str, int]
    restarts: int = Field(ge=0)
    restarts_reset_after: float | None = Field(None, ge=0, allow_inf_nan=False)
    started_at: str | None = None
    ready_at: str | None = None
    reason: str | None = None
    probe: ProbeModel
    probe_host: str = Field(min_length=1, max_length=253)
    stop: StopModel
    argv: list[str] = []
    engine: str = ""
    wiring_counts: list[tuple[str, int, int]] = []
    cgroup: str | None = None
    api_key: str | None = None
    generation: int = Field(0, ge=0, lt=1 << 31)
    role: str | None = Field(None, min_length=1, max_length=200)
    env: dict[str, str] | None = None
    launch_sha256: str | None = Field(None, pattern="^[0-9a-f]{64}$")

    @field_validator("started_at", "ready_at")
    @classmethod
    def _times(cls, value: str | None) -> str | None:
        return _iso(value)

    @field_validator("wiring_counts", mode="before")
    @classmethod
    def _triples(cls, value: Any) -> Any:
        """JSON has no tuples: each [kind, listed, expected] is checked as one, its types exact."""
        return [tuple(v) if isinstance(v, list) else v for v in value] if isinstance(value, list) else value

    @field_validator("name", "probe_host", "kind")
    @classmethod
    def _names(cls, value: str) -> str:
        return _plain(value, "a name")

    @field_validator("role")
    @classmethod
    def _role(cls, value: str | None) -> str | None:
        return None if value is None else _plain(value, "a role name")

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"https?://[^/?#\s]+", _plain(value, "a URL")):
            raise ValueError(f"{value[:60]!r} is not an http(s) URL")
        return value

    @field_validator("ports")
    @classmethod
    def _ports(cls, ports: dict[str, int]) -> dict[str, int]:
        if bad := [p for p in ports.values() if not 1 <= p <= 65535]:
            raise ValueError(f"port {bad[0]} is not in 1-65535")
        return ports

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, gpus: list[int]) -> list[int]:
        if any(g < 0 for g in gpus):
            raise ValueError("a negative GPU index")
        return gpus


class MasksModel(_Strict):
    salt: str
    sha256: dict[str, str]


class ChangeModel(_Strict):
    what: str = Field(min_length=1, max_length=300)
    since: str

    @field_validator("what")
    @classmethod
    def _what(cls, value: str) -> str:
        return _plain(value, "a change")

    @field_validator("since")
    @classmethod
    def _since(cls, value: str) -> str:
        return _iso(value)


class StateModel(_Strict):
    name: str = Field(min_length=1)
    source: str
    supervisor_pid: int | None = Pid
    supervisor_create_time: float | None = Field(None, ge=0, allow_inf_nan=False)
    supervisor_start_ticks: int | None = Field(None, ge=0)
    supervisor_boot_id: str | None = None
    stop_waves: list[list[str]]
    roles: list[RoleModel]
    versions: dict[str, str | None] = {}
    masks: MasksModel | None = None
    backend: Literal[BACKEND_NAMES] | None = None  # None: written before records named their backend
    change: ChangeModel | None = None  # a change in progress (`scale`, `restart`)

    @model_validator(mode="after")
    def _waves(self) -> StateModel:
        names = [r.name for r in self.roles]
        if len(set(names)) != len(names):
            raise ValueError("two roles of one name")
        waved = [n for wave in self.stop_waves for n in wave]
        if unknown := sorted(set(waved) - set(names)):
            raise ValueError(f"a stop wave names no role: {unknown[0]!r}")
        if len(set(waved)) != len(waved) or set(waved) != set(names):
            raise ValueError("the stop waves do not list every role exactly once")
        return self


def check_state(data: Any, name: str, run_dir: str) -> dict[str, Any]:
    """The state file's data for the deployment `name` whose run directory is `run_dir`, each field checked
    (defaults filled in for the fields an older muse-launch did not write); Damaged says why not."""
    if not isinstance(data, dict):
        raise Damaged(f"a JSON {type(data).__name__}, not an object")
    try:
        model = StateModel.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "top level"
        raise Damaged(f"{where}: {first['msg']}") from None
    if model.name != name:
        raise Damaged(f"it names deployment {model.name[:60]!r}, not {name!r}")
    cgroup_dir = deployment_dir_name(name, run_dir)
    for role in model.roles:
        if role.cgroup is not None and not _own_cgroup(role.cgroup, cgroup_dir, role.name):
            raise Damaged(f"role {role.name!r}: cgroup {role.cgroup[:80]!r} is not the role's own")
    return model.model_dump()


def _own_cgroup(path: str, deployment_dir: str, role: str) -> bool:
    parts = path.split("/")
    return (
        path.startswith("/")
        and ".." not in parts
        and len(parts) >= 4
        and parts[-1] == role
        and parts[-2] == deployment_dir
        and parts[-3] == LAYOUT_DIR
        and not _CONTROL.search(path)
    )
