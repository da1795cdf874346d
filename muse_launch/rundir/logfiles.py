"""Role log files: how they are opened, read in bounded chunks, and kept under their cap.

Why copy-truncate, and not a pipe: a role's stdout and stderr go straight to its log file, opened
with O_APPEND (process.open_role_log). The alternative, a pipe that the supervisor copies into
rotating files, puts the supervisor in the role's write path: a supervisor that is slow blocks the role once
the pipe is
full, and one that dies (SIGKILL, OOM) leaves the role writing into a pipe with no reader, so its
next write raises SIGPIPE and kills it. Roles must outlive their supervisor (`down` works without
it), so the file stays theirs.

The supervisor instead looks at each log's size every LOG_CHECK_SECONDS (one fstat per role) and,
past `max_size`, rotates it by copy-truncate: ROLE.log.N-1 -> ROLE.log.N, the log copied in the
kernel (sendfile) to a fresh ROLE.log.1, and the log truncated to 0. Because every writer opened
it with O_APPEND, the role's next write lands at the new end (offset 0): no sparse file, no hole,
and the role is never slowed or signalled. What it writes between the end of the copy and the
truncation (microseconds: the copy runs until it has caught up) is lost, as with logrotate's
copytruncate. The check runs on the supervisor's tick, so a log may overshoot its cap by what the
role writes in one check interval; ROLE.log.1 may hold up to that much past `max_size`.

Readers (`logs`, `logs -f`, `up`'s log stream, the `ready: {log: ...}` probe) read at most
READ_CHUNK bytes at a time whatever the backlog, and notice rotation: the log shrank below their
offset, or ROLE.log.1 is a new file (then they read the rest of ROLE.log.1 first). The rotation runs
under an exclusive flock of the log and a follower (logs.LogFollower) looks under a shared one, so it
never sees one half done (the log truncated before the new ROLE.log.1 is in place). With `keep: 0` there
is no ROLE.log.1: a log truncated and written past a reader's offset between two of its looks is read
from that offset, the lines before it missed.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from muse_launch.files import open_nofollow
from muse_launch.plan.spec import LogPolicy
from muse_launch.topology.defaults import LOG_MAX_KEEP

READ_CHUNK = 64 * 1024  # the most any reader holds of a log at once; a longer line is split at it
LOG_CHECK_SECONDS = 0.25  # how often the supervisor looks at each log's size
COPY_CHUNK = 8 * 1024 * 1024  # sendfile's step while copying a log to ROLE.log.1
MAX_DEFERRED = 8  # looks in a row a follower's lock may put a rotation off (then it rotates regardless)


def rotated(path: Path, n: int = 1) -> Path:
    return path.with_name(f"{path.name}.{n}")


def forget_rotated(path: Path) -> None:
    """At `up`: an earlier run's ROLE.log.1 .. .N go with its ROLE.log, so no reader takes them for this
    run's."""
    for n in range(1, LOG_MAX_KEEP + 1):
        try:
            os.unlink(rotated(path, n))  # unlinks a planted link itself, never its target
        except OSError:  # not there (a gap where someone removed one), or not ours to remove
            continue


def file_id(path: Path) -> tuple[int, int] | None:
    """(device, inode) of a file, None when there is none: a new ROLE.log.1 says the log was rotated."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def read_chunk(path: Path, offset: int, limit: int = READ_CHUNK) -> tuple[bytes, int]:
    """At most `limit` bytes of the file from `offset`, and its size now; (b"", 0) when it is gone."""
    try:
        fd = open_nofollow(
            path, os.O_RDONLY, root=path.parents[2]
        )  # HOME/NAME/logs/ROLE.log: no link below HOME
    except OSError:  # not there (yet), or a planted link (files.PlantedLink): nothing of ours to show
        return b"", 0
    try:
        size = os.fstat(fd).st_size
        return (os.pread(fd, min(limit, size - offset), offset) if size > offset else b""), size
    finally:
        os.close(fd)


class LineSplitter:
    """Complete lines out of chunks; a partial line longer than READ_CHUNK comes out in pieces, never
    accumulates."""

    def __init__(self, limit: int = READ_CHUNK):
        self.limit = limit
        self.partial = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        *complete, self.partial = (self.partial + chunk).split(b"\n")
        lines = [
            line[i : i + self.limit] for line in complete for i in range(0, max(len(line), 1), self.limit)
        ]
        while len(self.partial) >= self.limit:
            lines.append(self.partial[: self.limit])
            self.partial = self.partial[self.limit :]
        return lines

    def reset(self) -> None:
        self.partial = b""


def rotate(path: Path, keep: int, force: bool = False) -> bool:
    """Copy-truncate (see the module's docstring): the newest `keep` rotated files are kept. Done under an
    exclusive flock of the log, so that a follower (logs.LogFollower, which looks under a shared one) never
    sees it half done: the log truncated before ROLE.log.1 is in place, or ROLE.log.1 moved to .2. False,
    nothing done, while a follower holds it (its look takes microseconds; the next tick tries again),
    unless `force`: a follower that stopped while holding it does not stop the cap."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return True
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not force:
                return False
        except OSError:  # a file system without locks (ENOLCK): rotated all the same
            pass
        if keep > 0:
            for n in range(keep, 1, -1):
                if os.path.lexists(rotated(path, n - 1)):
                    os.replace(rotated(path, n - 1), rotated(path, n))
            tmp = path.with_name(f".{path.name}.rotating")
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                offset, limit = (
                    0,
                    os.fstat(fd).st_size * 2 + COPY_CHUNK,
                )  # a writer faster than the copy: stop
                while offset < limit and (sent := os.sendfile(out, fd, offset, COPY_CHUNK)) > 0:
                    offset += sent
            except OSError:  # a full disk: the log is emptied rather than left to grow, its copy dropped
                os.close(out)
                os.unlink(tmp)
                os.ftruncate(fd, 0)
                raise
            os.ftruncate(fd, 0)  # right after the copy caught up: only what was written since is lost
            os.close(out)
            os.replace(tmp, rotated(path))
        else:
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)  # and with it the lock
    return True


@dataclass
class LogCaps:
    """The supervisor's keeper of its roles' log caps; `tend` is cheap enough for every loop round."""

    logs: dict[str, tuple[Path, LogPolicy]]
    checked_at: float = field(default=float("-inf"))
    deferred: dict[Path, int] = field(default_factory=dict)  # looks in a row a follower's lock put one off

    @classmethod
    def of(cls, specs: Iterable, log_of) -> LogCaps:
        return cls({s.name: (log_of(s.name), s.logs) for s in specs})

    def tend(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if now - self.checked_at < LOG_CHECK_SECONDS:
            return
        self.checked_at = now
        for path, policy in self.logs.values():
            try:
                if os.lstat(path).st_size > policy.max_size:
                    force = self.deferred.get(path, 0) >= MAX_DEFERRED
                    if rotate(path, policy.keep, force):
                        self.deferred.pop(path, None)
                    else:
                        self.deferred[path] = self.deferred.get(path, 0) + 1
            except OSError:  # gone, or the disk is full: the next look tries again
                continue
