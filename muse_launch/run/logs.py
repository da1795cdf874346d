"""Role logs: the last lines of each, and new lines as they come, prefixed with the role's name
(coloured on a terminal)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TextIO

from muse_launch.run.files import PlantedLink, open_nofollow

COLOURS = ("36", "32", "33", "35", "34", "91", "96", "92", "93", "95")  # ANSI foregrounds, one per role
TAIL_BLOCK = 64 * 1024


def open_log(path: Path):
    """A role's log (HOME/NAME/logs/ROLE.log) for reading, following no link below the home: a planted
    one raises files.PlantedLink (an OSError) rather than showing another file."""
    return os.fdopen(open_nofollow(path, os.O_RDONLY, root=path.parents[2]), "rb")


def last_lines(path: Path, n: int) -> list[str]:
    """The last n lines, reading only the end of a file that may be gigabytes long."""
    try:
        with open_log(path) as f:
            end = f.seek(0, os.SEEK_END)
            data = b""
            while end > 0 and data.count(b"\n") <= n:
                start = max(0, end - TAIL_BLOCK)
                f.seek(start)
                data = f.read(end - start) + data
                end = start
    except FileNotFoundError:
        return []
    lines = data.decode(errors="replace").splitlines()
    return lines[-n:] if n > 0 else []


class RolePrinter:
    """Writes `role | line`, the role padded to the longest name and coloured when `colour`."""

    def __init__(self, out: TextIO, roles: list[str], colour: bool):
        self.out = out
        self.width = max((len(r) for r in roles), default=0)
        self.colours = {r: COLOURS[i % len(COLOURS)] for i, r in enumerate(roles)}
        self.colour = colour

    def line(self, role: str, text: str) -> None:
        prefix = f"{role:<{self.width}} |"
        if self.colour:
            prefix = f"\x1b[{self.colours.get(role, '0')}m{prefix}\x1b[0m"
        self.out.write(f"{prefix} {text}\n")

    def flush(self) -> None:
        self.out.flush()


class LogFollower:
    """New complete lines of several logs since the last call; a truncated log (a new `up`) restarts."""

    def __init__(self, logs: dict[str, Path], from_end: bool):
        self.logs = logs
        self.offsets = {r: (os.stat(p, follow_symlinks=False).st_size if from_end and os.path.lexists(p) else 0)
                        for r, p in logs.items()}
        self.partial = {r: b"" for r in logs}

    def read_new(self) -> list[tuple[str, str]]:
        out = []
        for role, path in self.logs.items():
            try:
                size = os.stat(path, follow_symlinks=False).st_size
                if size < self.offsets[role]:
                    self.offsets[role], self.partial[role] = 0, b""
                if size == self.offsets[role]:
                    continue
                with open_log(path) as f:
                    f.seek(self.offsets[role])
                    chunk = f.read(size - self.offsets[role])
            except (FileNotFoundError, PlantedLink):  # not there (yet), or not a log of ours to show
                continue
            self.offsets[role] += len(chunk)
            *lines, self.partial[role] = (self.partial[role] + chunk).split(b"\n")
            out += [(role, line.decode(errors="replace")) for line in lines]
        return out

    def print_new(self, printer: RolePrinter) -> None:
        for role, text in self.read_new():
            printer.line(role, text)
        printer.flush()
