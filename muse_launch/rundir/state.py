"""A deployment's run directory: state.json (atomic, 0600), one log per role, and the lock
that makes a second `up` of the same name refuse."""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import json
import math
import os
import re
import stat
import time
from collections.abc import Callable, Mapping
from dataclasses import field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import AfterValidator, ConfigDict, Field, TypeAdapter, ValidationError
from pydantic.dataclasses import dataclass

from muse_launch.bounded_json import Damaged, load_bounded_json
from muse_launch.errors import RuntimeFailure, UsageError
from muse_launch.files import PlantedLink, open_nofollow, read_nofollow, replace_file
from muse_launch.plan.spec import Probe
from muse_launch.proc.cgroups import LAYOUT_DIR, deployment_dir_name
from muse_launch.proc.masks import Masks
from muse_launch.proc.process import ProcessRef, StopTarget
from muse_launch.rundir.lifecycle import (  # noqa: F401 - LOCAL, SLURM, K8S: as the backends import them
    BACKEND_NAMES,
    K8S,
    LIVE_STATES,
    LOCAL,
    SLURM,
    DeploymentState,
    RoleState,
    deployment_state,
)
from muse_launch.topology.defaults import MAX_GRACE, STOP_SIGNALS
from muse_launch.topology.grammar import path_part

if TYPE_CHECKING:
    import psutil

WIRING_LABELS = {"worker": "workers", "encoder": "encoders"}


def state_home() -> Path:
    """MUSE_LAUNCH_HOME, else ~/.local/state/muse-launch: a directory, or nothing yet (made by the first
    `up`)."""
    given = os.environ.get("MUSE_LAUNCH_HOME")
    home = Path(given or Path.home() / ".local" / "state" / "muse-launch")
    what = (
        "a link to nothing"
        if home.is_symlink() and not home.exists()
        else "not a directory"
        if home.exists() and not home.is_dir()
        else None
    )
    if what:
        raise UsageError(
            f"{'MUSE_LAUNCH_HOME=' if given else 'the state home '}{home} is {what}",
            fix="point MUSE_LAUNCH_HOME at a directory (or at a path that does not exist yet)",
        )
    return home


def now_iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="milliseconds")


@dataclasses.dataclass(frozen=True)
class RunDir:
    path: Path

    @classmethod
    def of(cls, name: str) -> RunDir:
        return cls(state_home() / path_part(name, "deployment name"))

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def home(self) -> Path:
        """Trusted as it is; below it, no link is followed (muse_launch/files.py)."""
        return self.path.parent

    @property
    def lock_file(self) -> Path:
        return self.path / "lock"

    @property
    def state_file(self) -> Path:
        return self.path / "state.json"

    @property
    def logs(self) -> Path:
        return self.path / "logs"

    def log(self, role: str) -> Path:
        return self.logs / f"{path_part(role, 'role name')}.log"

    @property
    def supervisor_log(self) -> Path:
        return self.path / "supervisor.log"


# ---- state.json: the records below are its one description. In memory they are built as the supervisor goes;
# read back from disk they are untrusted (anyone who can write the run directory, a crash, a full disk may
# have left anything there): bounded before parsing, then checked field by field, strictly (no "1" for 1,
# no true for 1, no unknown key), and whatever does not fit is StateDamaged.

MAX_STATE_BYTES = 8 << 20  # a topology file is at most 1 MiB; its state is a few times that at worst
MAX_DEPTH = 16  # state.json nests 5 deep (deployment, roles, role, probe, paths)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_MODEL = ConfigDict(extra="forbid", arbitrary_types_allowed=False)


def _plain(what: str) -> AfterValidator:
    def check(value: str) -> str:
        if _CONTROL.search(value):
            raise ValueError(f"{what} holds a control character")
        return value

    return AfterValidator(check)


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


def _url(value: str | None) -> str | None:
    if value is not None and (_CONTROL.search(value) or not re.match(r"https?://[^/?#\s]+", value)):
        raise ValueError(f"{value[:60]!r} is not an http(s) URL")
    return value


def _probe(probe: Probe) -> Probe:
    finite = math.isfinite(probe.timeout) and math.isfinite(probe.interval)
    if not finite or not 100 <= probe.status <= 599 or probe.timeout < 0 or probe.interval <= 0:
        raise ValueError("a probe's status, timeout or interval is out of range")
    if bad := [p for p in probe.paths if not p.startswith("/") or _CONTROL.search(p)]:
        raise ValueError(f"probe path {bad[0][:60]!r} does not start with / or holds a control character")
    return probe


def _process(ref: ProcessRef | None) -> ProcessRef | None:
    if ref is not None and not 0 < ref.pid < 1 << 22:  # the kernel's pid_max is at most 2^22
        raise ValueError(f"pid {ref.pid} is out of range")
    if ref is not None and ((ref.start_ticks or 0) < 0 or not 0 <= (ref.create_time or 0) < math.inf):
        raise ValueError("a negative or endless process start")
    return ref


def _signal(value: str) -> str:
    if value not in STOP_SIGNALS:
        raise ValueError(f"{value!r} is not a signal `down` stops a role with")
    return value


def _ports(ports: Mapping[str, int]) -> Mapping[str, int]:
    if bad := [p for p in ports.values() if not 1 <= p <= 65535]:
        raise ValueError(f"port {bad[0]} is not in 1-65535")
    return ports


Name = Annotated[str, Field(min_length=1, max_length=200), _plain("a name")]
Time = Annotated[str | None, AfterValidator(_iso)]
Seconds = Annotated[float, Field(ge=0, le=MAX_GRACE, allow_inf_nan=False)]
Count = Annotated[int, Field(ge=0, lt=1 << 31)]
Process = Annotated[ProcessRef | None, AfterValidator(_process)]


@dataclass(frozen=True, config=_MODEL)
class RoleRecord:
    name: Name
    kind: Annotated[str, _plain("a kind")]
    state: RoleState
    gpus: tuple[Annotated[int, Field(ge=0)], ...]
    url: Annotated[str | None, AfterValidator(_url)]
    ports: Annotated[Mapping[str, int], AfterValidator(_ports)]
    probe: Annotated[Probe, AfterValidator(_probe)]
    # where the supervisor reaches it (the bind address, loopback for 0.0.0.0)
    probe_host: Annotated[str, Field(min_length=1, max_length=253), _plain("a host")]
    stop_signal: Annotated[str, AfterValidator(_signal)]
    grace: Seconds
    process: Process = None
    restarts: Count = 0
    started_at: Time = None  # of its current process
    ready_at: Time = None
    reason: str | None = None  # why it failed or was restarted: an exit status, a timeout
    argv: tuple[str, ...] = ()  # as planned, secrets redacted: what smoke and status read of it
    engine: str = ""  # whose argv reader reads argv
    # Its peers as it lists them, (kind, listed, expected) per kind: a router's prefill, decode and workers,
    # a language worker's encoders; empty for a role that lists none (supervise/wiring.py).
    wiring: tuple[tuple[str, int, int], ...] = ()
    cgroup: str | None = None  # its own cgroup (v2), where the host offers one: `down` kills what is in it
    # seconds ready after which `restarts` starts again from 0
    reset_after: Annotated[float | None, Field(ge=0, allow_inf_nan=False)] = None
    # A router's API key as the file gives it (`${env:NAME}`, resolved by whoever needs it, never the value of
    # a secret): what `smoke` sends; None for a role that takes none (engines/router.py API_KEY).
    api_key: str | None = None
    # How many times `restart` (or a rolling change) replaced this instance: 0 as `up` or `scale` started it.
    generation: Count = 0
    # What it launches, for `up` of an edited file (plan/diff.py): its topology role, its environment as
    # shown (secrets redacted) and the salted digest of its launch in clear.
    role: Annotated[str, Field(min_length=1, max_length=200), _plain("a role name")] | None = None
    env: Mapping[str, str] | None = None
    launch_sha256: Annotated[str | None, Field(pattern="^[0-9a-f]{64}$")] = None

    @property
    def restarts_text(self) -> str:
        """'2 (reset after 5m ready)': a count that will not follow the role for the deployment's life."""
        if not self.restarts or self.reset_after is None:
            return str(self.restarts)
        minutes, seconds = divmod(round(self.reset_after), 60)
        after = (
            f"{minutes}m"
            if minutes and not seconds
            else f"{minutes}m{seconds:02d}s"
            if minutes
            else f"{seconds}s"
        )
        return f"{self.restarts} (reset after {after} ready)"

    @property
    def wired(self) -> bool:
        return all(have == want for _, have, want in self.wiring)

    @property
    def wiring_text(self) -> str:
        """'2/2 prefill, 1/1 decode'."""
        return ", ".join(f"{have}/{want} {WIRING_LABELS.get(kind, kind)}" for kind, have, want in self.wiring)

    @property
    def live(self) -> bool:
        return self.state in LIVE_STATES

    def stop_target(self, grace: float | None = None) -> StopTarget:
        return StopTarget(
            self.name, self.process, self.stop_signal, self.grace if grace is None else grace, self.cgroup
        )

    def status_dict(self) -> dict[str, Any]:
        """The role entry of `status --json` (docs/status-json.md)."""
        return {
            "name": self.name,
            "kind": self.kind,
            "state": self.state.value,
            "pid": self.process.pid if self.process else None,
            "pgid": self.process.pid if self.process else None,  # started with its own session: pgid == pid
            "gpus": list(self.gpus),
            "url": self.url,
            "ports": dict(self.ports),
            "restarts": self.restarts,
            "restarts_reset_after": self.reset_after,
            "ready_at": self.ready_at,
            "wiring": {kind: f"{have}/{want}" for kind, have, want in self.wiring},
            "generation": self.generation,
        }

    def to_json(self) -> dict[str, Any]:
        """Its entry in state.json: `status --json`'s, and what `down`, `up` of an edited file and a
        restarted supervisor read back."""
        out = self.status_dict()
        out.update(
            **(self.process.to_json() if self.process else {"create_time": None}),
            cgroup=self.cgroup,
            started_at=self.started_at,
            probe=self.probe.to_dict(),
            probe_host=self.probe_host,
            stop={"signal": self.stop_signal, "grace": self.grace},
            reason=self.reason,
            argv=list(self.argv),
            engine=self.engine,
            wiring_counts=[list(w) for w in self.wiring],
            api_key=self.api_key,
            role=self.role,
            env=None if self.env is None else dict(self.env),
            launch_sha256=self.launch_sha256,
        )
        return out


@dataclass(frozen=True, config=_MODEL)
class Change:
    """A change of the running deployment in progress (`scale`, `restart`), one at a time."""

    what: Annotated[str, Field(min_length=1, max_length=300), _plain("a change")]  # "scale decode 1 -> 2"
    since: Annotated[str, AfterValidator(_iso)]

    def to_json(self) -> dict[str, str]:
        return {"what": self.what, "since": self.since}


@dataclass(frozen=True, config=_MODEL)
class DeploymentRecord:
    name: Annotated[str, Field(min_length=1)]
    source: str  # the topology file it came from
    stop_waves: tuple[tuple[str, ...], ...]  # reverse dependency order, for `down` without the plan
    roles: tuple[RoleRecord, ...]
    supervisor: Process = None
    # engine -> the release `up` found for what it started (read through the real launcher, which the state
    # keeps only redacted where it came from `${env:...}`)
    versions: Mapping[str, str | None] = field(default_factory=dict)
    masks: Masks = Masks()  # how `down` hides secrets in the command lines it prints
    backend: Literal[BACKEND_NAMES] = LOCAL  # the backend that owns it (muse_launch/backend.py)
    change: Change | None = None  # a change in progress, told by the supervisor that makes it

    @property
    def shown_state(self) -> str:
        """What `ls` and the status title say: `changing` while a change runs on a serving deployment."""
        state = self.state
        live = state not in (DeploymentState.STOPPED, DeploymentState.STOPPING)
        return "changing" if self.change and live else state.value

    @property
    def state(self) -> DeploymentState:
        return deployment_state((r.state for r in self.roles), wired=all(r.wired for r in self.roles))

    def role(self, name: str) -> RoleRecord:
        return next(r for r in self.roles if r.name == name)

    def with_role(self, record: RoleRecord) -> DeploymentRecord:
        return replace(self, roles=tuple(record if r.name == record.name else r for r in self.roles))

    def status_dict(self) -> dict[str, Any]:
        """`status --json` (docs/status-json.md); supervisor_pid is null once no supervisor runs."""
        return {
            "name": self.name,
            "supervisor_pid": self.supervisor.pid if self.supervisor else None,
            "state": self.state.value,
            "roles": [r.status_dict() for r in self.roles],
            "change": self.change.to_json() if self.change else None,
        }

    def to_json(self) -> dict[str, Any]:
        """state.json. `state` (and each role's `pgid` and `wiring`) are derived, for readers of the file;
        read back, they are ignored."""
        return {
            "name": self.name,
            "source": self.source,
            "state": self.state.value,
            "supervisor_pid": self.supervisor.pid if self.supervisor else None,
            **(
                self.supervisor.to_json("supervisor_")
                if self.supervisor
                else {"supervisor_create_time": None}
            ),
            "stop_waves": [list(w) for w in self.stop_waves],
            "roles": [r.to_json() for r in self.roles],
            "versions": dict(self.versions),
            "masks": self.masks.to_json(),
            "backend": self.backend,
            "change": self.change.to_json() if self.change else None,
        }

    def entry_roles(self) -> tuple[RoleRecord, ...]:
        """Where clients send requests: the routers; without one, the last role in start order with a URL
        (the one the others feed). The one rule for `up`'s ready line, the batch host's and smoke's."""
        routers = tuple(r for r in self.roles if r.kind == "router" and r.url)
        return routers or tuple(r for r in self.roles if r.url)[-1:]


# state.json's keys, as to_json writes them: read back, each must be there and no other. A process written
# as null has no start_ticks or boot_id; the probe writes the keys its kind reads.
_PROCESS_KEYS = frozenset({"start_ticks", "boot_id", "create_time"})
_ROLE_KEYS = frozenset(
    "name kind state pid pgid gpus url ports restarts restarts_reset_after ready_at wiring generation "
    "create_time start_ticks boot_id cgroup started_at probe probe_host stop reason argv engine "
    "wiring_counts api_key role env launch_sha256".split()
)
_DEPLOYMENT_KEYS = frozenset(
    "name source state supervisor_pid supervisor_create_time supervisor_start_ticks supervisor_boot_id "
    "stop_waves roles versions masks backend change".split()
)
_PROBE_KEYS = frozenset("kind paths status pattern timeout interval".split())
# where a field of the records is in the file, for a message that names what a person sees there
_ON_DISK = {
    "stop_signal": ("stop", "signal"),
    "grace": ("stop", "grace"),
    "wiring": ("wiring_counts",),
    "reset_after": ("restarts_reset_after",),
    "shown": ("sha256",),
}


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise Damaged(f"{where}: a JSON {type(value).__name__}, not an object")
    return value


def _keys(
    d: dict[str, Any], want: frozenset[str], where: str, optional: frozenset[str] = frozenset()
) -> None:
    if missing := sorted(want - optional - d.keys()):
        raise Damaged(f"{where}: no {missing[0]!r}")
    if unknown := sorted(d.keys() - want):
        raise Damaged(f"{where}: unknown key {unknown[0][:40]!r}")


def _process_fields(d: dict[str, Any], where: str, prefix: str = "") -> dict[str, Any] | None:
    pid = d[f"{prefix}pid"]
    if pid is None:
        if given := sorted(k for k in _PROCESS_KEYS if d.get(f"{prefix}{k}") is not None):
            raise Damaged(f"{where}{prefix}{given[0]}: set for no process")
        return None
    return {"pid": pid, **{k: d.get(f"{prefix}{k}") for k in _PROCESS_KEYS}}


def _role_fields(d: Any, where: str) -> dict[str, Any]:
    d = _object(d, where)
    _keys(d, _ROLE_KEYS, where, frozenset({"start_ticks", "boot_id"}))  # not written for no process
    probe = _object(d["probe"], f"{where}.probe")
    _keys(probe, _PROBE_KEYS, f"{where}.probe", _PROBE_KEYS - {"kind", "timeout", "interval"})
    stop = _object(d["stop"], f"{where}.stop")
    _keys(stop, frozenset({"signal", "grace"}), f"{where}.stop")
    fields = {k: d[k] for k in _ROLE_KEYS - _PROCESS_KEYS - {"pid", "pgid", "wiring", "stop"} if k in d}
    fields.update(
        process=_process_fields(d, f"{where}."),
        stop_signal=stop["signal"],
        grace=stop["grace"],
        wiring=fields.pop("wiring_counts"),
        reset_after=fields.pop("restarts_reset_after"),
    )
    return fields


def _fields(data: Any) -> dict[str, Any]:
    """state.json's data in the records' own shape (their fields' names), every key checked."""
    d = _object(data, "top level")
    _keys(d, _DEPLOYMENT_KEYS, "top level", frozenset({"supervisor_start_ticks", "supervisor_boot_id"}))
    roles = d["roles"]
    if not isinstance(roles, list):
        raise Damaged(f"roles: a JSON {type(roles).__name__}, not a list")
    masks = _object(d["masks"], "masks")
    _keys(masks, frozenset({"salt", "sha256"}), "masks")
    change = d["change"]
    if change is not None:
        _keys(_object(change, "change"), frozenset({"what", "since"}), "change")
    return {
        "name": d["name"],
        "source": d["source"],
        "stop_waves": d["stop_waves"],
        "roles": [_role_fields(r, f"roles.{i}") for i, r in enumerate(roles)],
        "supervisor": _process_fields(d, "", "supervisor_"),
        "versions": d["versions"],
        "masks": {"salt": masks["salt"], "shown": masks["sha256"]},
        "backend": d["backend"],
        "change": change,
    }


def _where(loc: tuple[Any, ...]) -> str:
    """A field's place in the records -> its place in state.json."""
    out: list[str] = []
    for i, part in enumerate(loc):
        if part in ("process", "supervisor") and i + 1 < len(loc):
            continue  # flattened into the role (or the deployment, as supervisor_...)
        if i and loc[i - 1] == "supervisor":
            part = f"supervisor_{part}"
        out.extend(_ON_DISK.get(part, (part,)) if isinstance(part, str) else (str(part),))
    return ".".join(out) or "top level"


_RECORD = TypeAdapter(DeploymentRecord)


def record_from_json(data: Any, name: str, run_dir: str) -> DeploymentRecord:
    """The record of the deployment `name` whose run directory is `run_dir`, from state.json's data (JSON
    read back, untrusted): every key there and no other, every field's type exact; Damaged says why not."""
    fields = _fields(data)
    try:  # strict over JSON's own types: an array is a tuple, a string an enum's value, and nothing else
        record = _RECORD.validate_json(json.dumps(fields), strict=True)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise Damaged(f"{_where(first['loc'])}: {first['msg']}") from None
    if record.name != name:
        raise Damaged(f"it names deployment {record.name[:60]!r}, not {name!r}")
    names = [r.name for r in record.roles]
    if len(set(names)) != len(names):
        raise Damaged("two roles of one name")
    waved = [n for wave in record.stop_waves for n in wave]
    if unknown := sorted(set(waved) - set(names)):
        raise Damaged(f"a stop wave names no role: {unknown[0]!r}")
    if len(set(waved)) != len(waved) or set(waved) != set(names):
        raise Damaged("the stop waves do not list every role exactly once")
    cgroup_dir = deployment_dir_name(name, run_dir)
    for role in record.roles:
        if role.cgroup is not None and not _own_cgroup(role.cgroup, cgroup_dir, role.name):
            raise Damaged(f"role {role.name!r}: cgroup {role.cgroup[:80]!r} is not the role's own")
    return record


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


def load_state_json(data: bytes) -> Any:
    return load_bounded_json(data, MAX_STATE_BYTES, MAX_DEPTH)


def write_state(run_dir: RunDir, record: DeploymentRecord) -> None:
    """Readers see the old file or the new one, never half of one; a link planted at state.json is
    replaced, not written through."""
    replace_file(run_dir.state_file, json.dumps(record.to_json(), indent=2).encode(), root=run_dir.home)


STATE_RETRY_SECONDS = 2.0


class StateSaver:
    """The supervisor's writes of state.json. A full disk or a read-only run directory must not end
    supervision: the record stays in memory, the write is tried again at the next change and every
    STATE_RETRY_SECONDS (`retry`), and `warn` is told once when writes start failing and once when one
    succeeds again, not at every write."""

    def __init__(
        self, run_dir: RunDir, warn: Callable[[str], None], clock: Callable[[], float] = time.monotonic
    ):
        self.run_dir = run_dir
        self.warn = warn
        self.clock = clock
        self.pending: DeploymentRecord | None = None
        self.failing = False
        self.next_try = 0.0

    def save(self, record: DeploymentRecord) -> None:
        self.pending = record
        self._write()

    def retry(self) -> None:
        if self.pending is not None and self.clock() >= self.next_try:
            self._write()

    def _write(self) -> None:
        try:
            write_state(self.run_dir, self.pending)
        except OSError as exc:
            self.next_try = self.clock() + STATE_RETRY_SECONDS
            if not self.failing:
                self.failing = True
                self.warn(
                    f"warning: cannot write {self.run_dir.state_file} ({exc.strerror or exc}); supervising "
                    f"on with the state in memory, trying again at each change and every "
                    f"{STATE_RETRY_SECONDS:g}s (`status` shows the last state written meanwhile)"
                )
            return
        self.pending = None
        if self.failing:
            self.failing = False
            self.warn(f"{self.run_dir.state_file} is written again")


class StateDamaged(RuntimeFailure):
    """state.json exists but cannot be read back (truncated, edited, from another version)."""

    def __init__(self, run_dir: RunDir, problem: str):
        self.run_dir = run_dir
        super().__init__(
            f"{run_dir.state_file} is damaged ({problem})",
            fix=f"`muse-launch down {run_dir.name}` stops what still carries the deployment's marker",
        )


def read_state(run_dir: RunDir) -> DeploymentRecord | None:
    """None when there is no state.json; StateDamaged when it cannot be read back."""
    try:
        data = read_nofollow(run_dir.state_file, root=run_dir.home, limit=MAX_STATE_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StateDamaged(run_dir, f"{type(exc).__name__}: {exc}") from None
    try:
        return record_from_json(load_state_json(data), run_dir.name, str(run_dir.path))
    except Damaged as exc:
        raise StateDamaged(run_dir, str(exc)) from None


# The lock cannot be made or opened for writing: a read-only or full run directory, or a link planted there.
UNWRITABLE = (errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM)


class DeploymentLock:
    """An flock held by whoever runs the deployment (the supervisor, or `down` while it stops it).

    The kernel drops it when its holder dies, SIGKILL included, so a stale lock cannot exist.
    """

    def __init__(self, run_dir: RunDir, fd: int | None = None, note: str | None = None):
        """Without `fd`: take it for `up`, or say who runs the deployment already."""
        self.note = note  # `down` without the lock: why
        if fd is not None:
            self.fd = fd
            return
        self.fd = open_nofollow(run_dir.lock_file, os.O_RDWR | os.O_CREAT, root=run_dir.home)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self.fd)
            try:
                record = read_state(run_dir)
            except StateDamaged:  # still running: that is what to say
                record = None
            holder = f" (supervisor pid {record.supervisor.pid})" if record and record.supervisor else ""
            raise RuntimeFailure(
                f"deployment {run_dir.name!r} is already running{holder}; "
                f"stop it first with `muse-launch down {run_dir.name}`"
            ) from None

    @classmethod
    def attempt(cls, run_dir: RunDir) -> DeploymentLock | None:
        """For `down`: the lock, or None while another holds it. It must not need a write: on a read-only
        or full run directory the existing lock is taken through a read-only descriptor, and where there is
        no lock file to take (or a link in its place) `down` goes on without one (`note` says why)."""
        try:
            fd = open_nofollow(run_dir.lock_file, os.O_RDWR | os.O_CREAT, root=run_dir.home)
        except PlantedLink as exc:
            return cls(run_dir, -1, f"{exc}: stopping without the lock")
        except OSError as exc:
            if exc.errno not in UNWRITABLE:
                raise
            try:
                fd = open_nofollow(run_dir.lock_file, os.O_RDONLY, root=run_dir.home)
            except OSError as again:
                return cls(
                    run_dir,
                    -1,
                    f"cannot open {run_dir.lock_file} ({again.strerror or again}): stopping without the lock",
                )
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        return cls(run_dir, fd)

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def is_locked(run_dir: RunDir) -> bool:
    try:
        fd = open_nofollow(run_dir.lock_file, os.O_RDONLY, root=run_dir.home)  # flock needs no write access
    except OSError:  # none there, or not a lock of ours
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def deployments(damaged: list[StateDamaged] | None = None) -> list[DeploymentRecord]:
    """Every deployment in the home whose state reads back; those whose state is damaged go to `damaged`
    (one broken state.json must not hide the others from `ls`, `status` or `down`)."""
    home = state_home()
    records = []
    for path in sorted(home.iterdir()) if home.is_dir() else []:
        try:
            if stat.S_ISREG(os.lstat(path).st_mode):  # a file someone wrote in the home is no deployment
                continue
        except OSError:  # gone since the listing
            continue
        try:
            record = read_state(RunDir(path))
            if record is not None and record.name != path.name:  # never a path to another directory
                raise StateDamaged(
                    RunDir(path), f"it names the deployment {record.name[:80]!r}, not {path.name!r}"
                )
            records.append(record)
        except StateDamaged as exc:
            if damaged is not None:
                damaged.append(exc)
    return [r for r in records if r is not None]


def running_deployments(damaged: list[StateDamaged] | None = None) -> list[DeploymentRecord]:
    return [
        r
        for r in deployments(damaged)
        if r.state is not DeploymentState.STOPPED or is_locked(RunDir.of(r.name))
    ]


def resolve_name(name: str | None) -> RunDir:
    """NAME, a topology FILE (its `name:`), or the one deployment running."""
    if name is None:
        running = running_deployments()
        if not running:
            raise RuntimeFailure(
                "no deployment is running",
                fix="`muse-launch up FILE -d` starts one; `muse-launch ls` lists those running",
            )
        if len(running) > 1:
            raise UsageError(f"give a deployment name ({', '.join(r.name for r in running)})")
        return RunDir.of(running[0].name)
    if Path(name).is_file():
        # Only the name: a file that no longer passes its checks must still be stoppable.
        import yaml

        try:
            data = yaml.safe_load(Path(name).read_text())
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            raise UsageError(
                f"{name}: not a topology file ({type(exc).__name__}); give the deployment's name"
            ) from None
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            raise UsageError(f"{name}: no `name:` in this topology file")
        name = data["name"]
    if not name or "/" in name or name in (".", ".."):
        raise UsageError(f"{name!r} is neither a deployment name nor a topology file")
    run_dir = RunDir.of(name)
    if (
        not run_dir.state_file.exists() and not run_dir.path.is_dir()
    ):  # a run dir that lost its state is still one
        known = ", ".join(r.name for r in deployments()) or "none"
        raise UsageError(f"no deployment named {name!r} (known: {known})")
    return run_dir


def recorded_role(proc: psutil.Process) -> str | None:
    """ "ROLE of DEPLOYMENT" where PROC, or a process above it, is a role a running deployment recorded
    (proc/ports.py's port_holder is given it)."""
    import psutil

    try:
        lineage = {proc.pid} | {p.pid for p in proc.parents()}
    except psutil.Error:
        return None
    for record in running_deployments():
        for role in record.roles:
            if role.process is not None and role.process.pid in lineage and role.process.find():
                return f"{role.name} of {record.name}"
    return None
