"""The error family, and the one table that turns any exception into a message and an exit code.

Exit codes (README, docs/faults.md): 0 ok, 1 a check or a role failed, 2 bad usage or a bad topology file,
70 an internal error: one line, the traceback only with MUSE_LAUNCH_DEBUG=1. A user error never
shows a traceback.

This module imports nothing beyond the standard library: the CLI loads it before any command.
"""

from __future__ import annotations

import errno
import os
import sys
import traceback
from collections.abc import Iterable
from typing import TextIO

OK = 0
FAILED = 1
BAD_USAGE = 2
INTERNAL = 70  # sysexits' EX_SOFTWARE
INTERRUPTED = 130
DEBUG_ENV = "MUSE_LAUNCH_DEBUG"


class UserError(Exception):
    """Something the user can fix; printed as `error: MESSAGE` (and `  fix: FIX`), no traceback."""

    exit_code = FAILED

    def __init__(self, message: str, fix: str | None = None):
        super().__init__(message)
        self.fix = fix

    def lines(self) -> list[str]:
        return [f"error: {self}", *([f"  fix: {self.fix}"] if self.fix else [])]


class UsageError(UserError):
    """Bad command-line usage: an unknown deployment or role, a name where a file was meant."""

    exit_code = BAD_USAGE


class TopologyError(UserError):
    """The topology file does not parse or does not fit the schema.

    Carries every problem found, each already formatted as `FILE:LINE: PATH: message`.
    """

    exit_code = BAD_USAGE

    def __init__(self, problems: list[str], fix: str | None = None):
        self.problems = problems
        super().__init__("\n".join(problems), fix)

    def lines(self) -> list[str]:
        return [*self.problems, *([f"  fix: {self.fix}"] if self.fix else [])]


class CheckFailed(UserError):
    """The file is well-formed but a check (muse_launch/checks/) failed (each finding carries its fix)."""

    exit_code = FAILED

    def lines(self) -> list[str]:
        return [str(self)]


class RuntimeFailure(UserError):
    """A role failed to start, a deployment is gone or could not be stopped cleanly."""

    exit_code = FAILED


class NotSupported(UserError):
    """A backend that cannot do what was asked (yet): says which backend and what it can do instead."""

    exit_code = FAILED


class MissingDependency(UserError):
    """A command needs a package that is not installed: named, with the pip line that installs it."""

    exit_code = FAILED


# Import name -> distribution name, where they differ (the rest: `_` in the import name is `-`).
DISTRIBUTIONS = {"yaml": "pyyaml"}


def requirement(module: str) -> str:
    """The pip argument for a missing top-level module, with the version this project asks for."""
    dist = DISTRIBUTIONS.get(module, module.replace("_", "-"))
    try:
        from importlib.metadata import requires

        for spec in requires("muse-launch") or ():
            name = spec.split(";")[0].strip()
            bare = name
            for sep in "<>=!~[ ":
                bare = bare.split(sep)[0]
            if bare.lower().replace("_", "-") == dist.lower():
                return name.replace(" ", "")
    except Exception:  # no metadata (a source tree on PYTHONPATH): the bare name still installs it
        pass
    return dist


def missing_dependency(exc: ModuleNotFoundError, command: str | None) -> MissingDependency | None:
    """A third-party module that is not installed; None for one of ours (that is a bug, not the host)."""
    top = (exc.name or "").split(".")[0]
    if not top or top == "muse_launch":
        return None
    who = f"muse-launch {command}" if command else "muse-launch"
    return MissingDependency(f"{who} needs {top}: pip install '{requirement(top)}'")


def _one_line(text: str, limit: int = 300) -> str:
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return first if len(first) <= limit else first[: limit - 3] + "..."


def explain(exc: BaseException, command: str | None = None) -> tuple[int, list[str]]:
    """The error table: (exit code, lines for stderr) for anything a command raised."""
    if isinstance(exc, ModuleNotFoundError):
        missing = missing_dependency(exc, command)
        if missing is not None:
            exc = missing
    if isinstance(exc, UserError):
        return exc.exit_code, exc.lines()
    if isinstance(exc, KeyboardInterrupt):
        return INTERRUPTED, []
    if isinstance(exc, BrokenPipeError):  # `muse-launch plan ... | head`: the reader left, nothing to say
        return FAILED, []
    if isinstance(exc, OSError) and exc.filename is not None and exc.errno in HOST_ERRNOS:
        # The host said no (permissions, a full or read-only disk, a path that is not there).
        where = exc.filename if exc.filename2 is None else f"{exc.filename} -> {exc.filename2}"
        fix = getattr(exc, "fix", None) or HOST_ERRNOS[exc.errno]  # files.PlantedLink says which to remove
        return FAILED, [f"error: {where}: {exc.strerror or exc}", *([f"  fix: {fix}"] if fix else [])]
    what = f"{type(exc).__name__}: {_one_line(str(exc))}" if str(exc).strip() else type(exc).__name__
    return INTERNAL, [f"internal error: {what} (run with {DEBUG_ENV}=1 for the traceback)"]


HOST_ERRNOS: dict[int, str | None] = {
    errno.EACCES: "check the path's permissions",
    errno.EPERM: "check the path's permissions",
    errno.EROFS: "the file system is read-only; point MUSE_LAUNCH_HOME or --output elsewhere",
    errno.ENOSPC: "the disk is full; free space or point MUSE_LAUNCH_HOME elsewhere",
    errno.EDQUOT: "the disk quota is used up; free space or point MUSE_LAUNCH_HOME elsewhere",
    errno.ENOENT: None,
    errno.ENOTDIR: None,
    errno.EISDIR: "give a file, not a directory",
    errno.ENAMETOOLONG: "use a shorter name",
    errno.ELOOP: None,
}


def as_json(exc: BaseException, command: str | None = None) -> tuple[int, dict[str, object]]:
    """What `explain` says, as the JSON a command run with --json prints on stdout instead:
    {"ok": false, "exit_code": N, "error": "...", "fix": "..." or null}; a file's problems also as
    "errors" (docs/status-json.md)."""
    code, lines = explain(exc, command)
    out: dict[str, object] = {"ok": False, "exit_code": code}
    if isinstance(exc, TopologyError):
        out.update(
            error=exc.problems[0] if len(exc.problems) == 1 else "the topology file has problems",
            errors=exc.problems,
            fix=exc.fix,
        )
    elif isinstance(exc, UserError):
        out.update(error=str(exc), fix=exc.fix)
    else:
        fix = next((line.split("fix: ", 1)[1] for line in lines if line.lstrip().startswith("fix: ")), None)
        out.update(
            error="\n".join(
                line.removeprefix("error: ") for line in lines if not line.lstrip().startswith("fix: ")
            ),
            fix=fix,
        )
    return code, out


def wants_json(argv: Iterable[str]) -> bool:
    """--json, or plan's --format json / -f json: errors are JSON too."""
    args = list(argv)
    return (
        "--json" in args
        or "--format=json" in args
        or any(a in ("--format", "-f") and nxt == "json" for a, nxt in zip(args, args[1:], strict=False))
    )


def debugging() -> bool:
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


def report(exc: BaseException, command: str | None = None, out: TextIO | None = None) -> int:
    """Print what `explain` says (the traceback first with MUSE_LAUNCH_DEBUG=1); return the exit code."""
    out = out or sys.stderr
    code, lines = explain(exc, command)
    try:
        if debugging() and code != INTERRUPTED:
            traceback.print_exception(exc, file=out)
        for line in lines:
            print(line, file=out)
        out.flush()
    except (BrokenPipeError, ValueError):  # stderr closed too: the exit code still says it
        pass
    return code


def first_command(argv: Iterable[str], commands: Iterable[str]) -> str | None:
    """The subcommand in ARGV, for messages about it ("muse-launch up needs httpx")."""
    known = set(commands)
    return next((a for a in argv if a in known), None)
