"""A change of a running deployment as a typed value, and its one wire form.

A command (`scale`, `restart`, `up FILE`, the autoscaler) builds a value and hands it to its backend's
`change(run_dir, change, say)` (muse_launch/backend.py). Where a supervisor makes the change (this host, a
SLURM batch host), the value travels as `{"op": ..., "args": {...}}`, one JSON line on the control socket or
one request file, and the supervisor reads it back with `from_wire`: what comes over the wire is untrusted,
so every field is checked for its type and range here, once, before any change starts."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar

from muse_launch.errors import UsageError

MAX_DRAIN_TIMEOUT = 86400.0
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,255}")  # a variable `up` read for ${env:NAME}


@dataclass(frozen=True)
class AddInstance:
    """One more instance of a worker role, placed by the file's rules, ready, wired and registered with
    its routers before it counts. `by_file`: a step of `up FILE` (the adopted file's new roles come)."""

    op: ClassVar[str] = "add"
    role: str
    why: str = ""
    allow_downtime: bool = False
    by_file: bool = False


@dataclass(frozen=True)
class RemoveInstance:
    """Out of its routers, drained (its own in-flight count 0, at most `drain_timeout` s), stopped."""

    op: ClassVar[str] = "remove"
    instance: str
    why: str = ""
    drain_timeout: float | None = None
    allow_downtime: bool = False
    by_file: bool = False


@dataclass(frozen=True)
class RestartInstance:
    """Replaced by a fresh process (generation + 1), with no failed request where capacity allows; of the
    same spec, or with `relaunch` of the one the adopted file gives it now."""

    op: ClassVar[str] = "restart"
    instance: str
    why: str = ""
    allow_downtime: bool = False
    drain_timeout: float | None = None
    relaunch: bool = False


@dataclass(frozen=True)
class ScaleRole:
    """A worker role to `replicas` instances as one change, all or nothing."""

    op: ClassVar[str] = "scale"
    role: str
    replicas: int
    why: str = ""
    drain_timeout: float | None = None
    allow_downtime: bool = False


@dataclass(frozen=True)
class Adopt:
    """`up FILE` of the running deployment: later changes are planned from this file, its --set values and
    the `${env:...}` values `up` read (`environ`), or, where a request is a file, their salted digests
    (`env_sha256`: a secret is never written down). `sha256`: the bytes whose difference `up` printed."""

    op: ClassVar[str] = "adopt"
    file: str
    sets: tuple[str, ...] = ()
    environ: tuple[tuple[str, str], ...] = ()
    env_sha256: tuple[tuple[str, str], ...] | None = None
    sha256: str | None = None


Change = AddInstance | RemoveInstance | RestartInstance | ScaleRole | Adopt
KINDS: dict[str, type[Change]] = {
    k.op: k for k in (AddInstance, RemoveInstance, RestartInstance, ScaleRole, Adopt)
}


def describe(change: Change) -> str:
    """The change as `status` and a refused client see it: `restart prefill-0`."""
    if isinstance(change, Adopt):
        return "up of an edited file"
    if isinstance(change, ScaleRole):
        return change.why or f"scale {change.role}"
    target = change.role if isinstance(change, AddInstance) else change.instance
    return f"{change.op} {target}" + (f" ({change.why})" if change.why else "")


def to_wire(change: Change) -> tuple[str, dict[str, Any]]:
    """The request's op and args: strings, numbers and booleans only (the socket's and the request files'
    one grammar); adopt's lists and maps as JSON text."""
    if isinstance(change, Adopt):
        args: dict[str, Any] = {"file": change.file, "sets": json.dumps(list(change.sets))}
        if change.env_sha256 is not None:
            args["env_sha256"] = json.dumps(dict(change.env_sha256))
        else:
            args["env"] = json.dumps(dict(change.environ))
        if change.sha256:
            args["sha256"] = change.sha256
        return change.op, args
    defaults = {f.name: f.default for f in fields(change)}
    return change.op, {k: v for k, v in vars(change).items() if v != defaults[k]}  # what is not said: default


def adopt(
    file: str,
    sets: tuple[str, ...] = (),
    environ: Mapping[str, str] | None = None,
    sha256: str | None = None,
) -> Adopt:
    return Adopt(file, tuple(sets), tuple(sorted((environ or {}).items())), sha256=sha256)


def from_wire(op: str, args: Mapping[str, Any]) -> Change:
    """The typed change a request asks for; UsageError naming the field for anything else."""
    kind = KINDS.get(op)
    if kind is None:
        raise UsageError(f"op must be one of {', '.join(KINDS)}")
    read = _Reader(op, args)
    if kind is Adopt:
        return Adopt(
            read.text("file"),
            tuple(read.json_strings("sets")),
            tuple(sorted(read.json_env("env").items())) if "env" in args or "env_sha256" not in args else (),
            tuple(sorted(read.json_env("env_sha256").items())) if "env_sha256" in args else None,
            read.optional_text("sha256"),
        )
    why = read.optional_text("why") or ""
    allow_downtime = args.get("allow_downtime") is True
    if kind is AddInstance:
        return AddInstance(read.text("role"), why, allow_downtime, args.get("by_file") is True)
    drain = read.drain_timeout()
    if kind is ScaleRole:
        return ScaleRole(read.text("role"), read.replicas(), why, drain, allow_downtime)
    if kind is RemoveInstance:
        return RemoveInstance(read.text("instance"), why, drain, allow_downtime, args.get("by_file") is True)
    return RestartInstance(read.text("instance"), why, allow_downtime, drain, args.get("relaunch") is True)


class _Reader:
    def __init__(self, op: str, args: Mapping[str, Any]):
        self.op, self.args = op, args

    def text(self, key: str) -> str:
        value = self.args.get(key)
        if not isinstance(value, str) or not value:
            raise UsageError(f"{self.op}: which {key}?")
        return value

    def optional_text(self, key: str) -> str | None:
        value = self.args.get(key)
        if value is not None and not isinstance(value, str):
            raise UsageError(f"{self.op}: {key} must be text")
        return value

    def drain_timeout(self) -> float | None:
        drain = self.args.get("drain_timeout")
        if drain is None:
            return None
        if (
            not isinstance(drain, int | float)
            or isinstance(drain, bool)
            or not 0 <= drain <= MAX_DRAIN_TIMEOUT
        ):
            raise UsageError(f"--drain-timeout must be between 0 and {MAX_DRAIN_TIMEOUT:g} seconds")
        return float(drain)

    def replicas(self) -> int:
        from muse_launch.topology.model import MAX_REPLICAS  # the file's own cap on `replicas`

        value = self.args.get("replicas")
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_REPLICAS:
            role = self.args.get("role")
            raise UsageError(f"scale {role}: replicas must be a whole number from 1 to {MAX_REPLICAS}")
        return value

    def _json(self, key: str, default: str) -> Any:
        text = self.args.get(key, default)
        if not isinstance(text, str):
            return None
        try:
            return json.loads(text)
        except ValueError:
            return None

    def json_strings(self, key: str) -> list[str]:
        values = self._json(key, "[]")
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise UsageError("adopt: --set values must be a list of strings")
        return values

    def json_env(self, key: str) -> dict[str, str]:
        environ = self._json(key, "{}")
        if not isinstance(environ, dict) or not all(
            isinstance(k, str) and ENV_NAME.fullmatch(k) and isinstance(v, str) and "\0" not in v
            for k, v in environ.items()
        ):
            what = "the environment's digests" if key == "env_sha256" else "the environment"
            raise UsageError(f"adopt: {what} must map variable names to strings")
        return environ
