"""Role logs: the last lines of each, and new lines as they come, prefixed with the role's name
(coloured on a terminal)."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from muse_launch.files import open_nofollow
from muse_launch.printable import uncoloured
from muse_launch.rundir.logfiles import READ_CHUNK, LineSplitter, file_id, rotated

COLOURS = ("36", "32", "33", "35", "34", "91", "96", "92", "93", "95")  # ANSI foregrounds, one per role
FOLLOW_ROUNDS = 64  # chunks of each log one print_new may print before it returns to its caller


def open_log_fd(path: Path) -> int:
    return open_nofollow(path, os.O_RDONLY, root=path.parents[2])  # a planted link raises files.PlantedLink


def _locked_look(path: Path) -> tuple[tuple[int, int] | None, int]:
    """ROLE.log.1's identity and the log's size, read together (never in the middle of a rotation)."""
    try:
        fd = open_log_fd(path)
    except OSError:
        return file_id(rotated(path)), 0
    try:
        _shared_lock(fd)
        return file_id(rotated(path)), os.fstat(fd).st_size
    finally:
        os.close(fd)


def _shared_lock(fd: int) -> None:
    """Blocks while a rotation holds the log (milliseconds; Ctrl-C still interrupts it)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
    except OSError:  # a file system without locks (ENOLCK): read as before, unlocked
        pass


def _rest_of(path: Path, offset: int) -> int | None:
    """ROLE.log.1 open at `offset`, when it holds more than that (else None: nothing of it is unread)."""
    try:
        fd = open_log_fd(path)
    except OSError:
        return None
    if os.fstat(fd).st_size <= offset:
        os.close(fd)
        return None
    os.lseek(fd, offset, os.SEEK_SET)
    return fd


def last_lines(path: Path, n: int) -> list[str]:
    """The last n lines, reading only the end of a file that may be gigabytes long: at most n + 1 chunks
    (a line longer than a chunk counts as several lines)."""
    if n <= 0:
        return []
    try:
        fd = open_nofollow(path, os.O_RDONLY, root=path.parents[2])  # a planted link raises files.PlantedLink
    except FileNotFoundError:
        return []
    try:
        end = os.fstat(fd).st_size
        data = b""
        budget = (n + 1) * READ_CHUNK
        while end > 0 and data.count(b"\n") <= n and len(data) < budget:
            start = max(0, end - READ_CHUNK)
            data = os.pread(fd, end - start, start) + data
            end = start
    finally:
        os.close(fd)
    pieces = [
        line[i : i + READ_CHUNK] or b""
        for line in data.split(b"\n")
        for i in range(0, max(len(line), 1), READ_CHUNK)
    ]
    if pieces and pieces[-1] == b"":
        pieces.pop()  # the file ends with a newline
    return [p.decode(errors="replace") for p in pieces[-n:]]


class RolePrinter:
    """Writes `role | line`, the role padded to the longest name and coloured when `colour`; the line's own
    colour codes dropped and its other escape sequences and carriage returns shown escaped
    (muse_launch/printable.py) unless `raw`, and what `mask` hides (a secret) hidden."""

    def __init__(
        self,
        out: TextIO,
        roles: list[str],
        colour: bool,
        raw: bool = False,
        mask: Callable[[str], str] | None = None,
    ):
        self.out = out
        self.width = max((len(r) for r in roles), default=0)
        self.colours = {r: COLOURS[i % len(COLOURS)] for i, r in enumerate(roles)}
        self.colour = colour
        self.raw = raw
        self.mask = mask

    def line(self, role: str, text: str) -> None:
        prefix = f"{role:<{self.width}} |"
        if self.colour:
            prefix = f"\x1b[{self.colours.get(role, '0')}m{prefix}\x1b[0m"
        if self.mask is not None:
            text = self.mask(text)
        self.out.write(f"{prefix} {text if self.raw else uncoloured(text)}\n")

    def flush(self) -> None:
        self.out.flush()


@dataclass
class _Tail:
    path: Path
    offset: int
    lines: LineSplitter = field(default_factory=LineSplitter)
    rotated_id: tuple[int, int] | None = None  # ROLE.log.1 as last seen: a new one means a rotation
    draining: int | None = None  # ROLE.log.1 open at its unread end, read before the log itself


class LogFollower:
    """New lines of several logs since the last call, READ_CHUNK at most per log and call (memory stays
    the same whatever the backlog); follows a log across rotation (the rest of ROLE.log.1 first) and
    truncation (a new `up`)."""

    def __init__(self, logs: dict[str, Path], from_end: bool):
        self.tails = {}
        for role, path in logs.items():
            rotated_id, size = _locked_look(path)
            self.tails[role] = _Tail(path, size if from_end else 0, rotated_id=rotated_id)

    def read_new(self) -> list[tuple[str, str]]:
        out = []
        for role, tail in self.tails.items():
            out += [(role, line.decode(errors="replace")) for line in self._read(tail)]
        return out

    @staticmethod
    def _read(tail: _Tail) -> list[bytes]:
        if tail.draining is not None:  # ROLE.log.1 held open: a later rotation does not swap it under us
            chunk = os.read(tail.draining, READ_CHUNK)
            if chunk:
                return tail.lines.feed(chunk)
            os.close(tail.draining)
            tail.draining, tail.offset = None, 0
        try:
            fd = open_log_fd(tail.path)
        except OSError:  # not there (yet), or a planted link: nothing of ours to show
            return []
        try:
            _shared_lock(fd)  # rotate() holds it exclusively: never a rotation half done
            now_rotated = file_id(rotated(tail.path))
            size = os.fstat(fd).st_size
            if now_rotated != tail.rotated_id or size < tail.offset:
                # Rotated: what we had not read is at the same offset of ROLE.log.1; truncated: start over.
                renewed = now_rotated is not None and now_rotated != tail.rotated_id
                tail.rotated_id = now_rotated
                tail.draining = _rest_of(rotated(tail.path), tail.offset) if renewed else None
                if tail.draining is None:
                    tail.offset = 0
                    if not renewed:  # truncated (a new `up`): a partial line of before never ends
                        tail.lines.reset()
            chunk = b""
            if tail.draining is None and size > tail.offset:
                chunk = os.pread(fd, min(READ_CHUNK, size - tail.offset), tail.offset)
        finally:
            os.close(fd)
        if tail.draining is not None:
            return LogFollower._read(tail)
        tail.offset += len(chunk)
        return tail.lines.feed(chunk)

    def print_new(self, printer: RolePrinter, rounds: int = FOLLOW_ROUNDS) -> bool:
        """Up to `rounds` chunks of each log (a log written faster than the reader reads must not keep
        the caller here for ever), printed as they are read; False when there may be more to read now."""
        for _ in range(rounds):
            new = self.read_new()
            for role, text in new:
                printer.line(role, text)
            printer.flush()
            if not new:
                return True
        return False


def print_files(
    run_dir, files: dict[str, Path], lines: int, follow: bool, printer: RolePrinter, pause: float = 0.2
) -> None:
    """The last `lines` of each log, then (`follow`) the new ones until the deployment has stopped and no
    one holds its lock: the file backends' `print_logs` (muse_launch/backend.py). Ctrl-C raises
    KeyboardInterrupt to the caller."""
    import time

    from muse_launch.rundir.lifecycle import DeploymentState
    from muse_launch.rundir.state import is_locked, read_state

    follower = LogFollower(files, from_end=True)  # before the tail: no line lost
    for role, path in files.items():
        for text in last_lines(path, lines):
            printer.line(role, text)
    printer.flush()
    if not follow:
        return
    while True:
        if not follower.print_new(printer):
            continue  # a backlog: read on at once
        record = read_state(run_dir)
        if (record is None or record.state is DeploymentState.STOPPED) and not is_locked(run_dir):
            follower.print_new(printer)
            return
        time.sleep(pause)
