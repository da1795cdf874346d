"""Who a process is, by what cannot be reused or stepped: its pid, its start time in clock ticks
since boot (field 22 of /proc/PID/stat) and the boot id. A pid comes back with another start time
once it is reused; the tick count does not move when the wall clock steps (NTP, an operator),
unlike psutil's create_time, which is boot time as the wall clock sees it now plus the ticks.

Signals go through a pidfd opened first and checked second: once it is open it names one
process for good, so a pid reused between the check and the signal is never hit.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import psutil

CREATE_TIME_SLACK = 0.01  # only for state files written before start ticks were kept


@lru_cache(maxsize=1)
def boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return None


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat after the command name (which may hold spaces and parentheses): field 3 onwards."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].decode().split()
    except (OSError, IndexError, UnicodeDecodeError):
        return None


def start_ticks(pid: int) -> int | None:
    """Clock ticks from boot to the process's start (field 22); None when it is gone."""
    fields = _stat_fields(pid)
    try:
        return int(fields[19]) if fields else None
    except (IndexError, ValueError):
        return None


def process_state(pid: int) -> str | None:
    """Its state letter (field 3): R, S, D, T (stopped, SIGSTOP), t (traced), Z (zombie)...; None when
    gone."""
    fields = _stat_fields(pid)
    return fields[0] if fields else None


def is_suspended(pid: int) -> bool:
    """Stopped by SIGSTOP (T) or a tracer (t): alive, and serving nothing."""
    return process_state(pid) in ("T", "t")


def resumed(pid: int) -> bool:
    """Running again after SIGCONT, so that a signal sent to it now reaches its main thread: no thread of it
    stopped (T, t) and its main thread back asleep (S, D) or gone. A thread woken by SIGCONT is runnable (R)
    with signals still pending until it gets a CPU; a process-directed signal sent meanwhile goes to another
    thread, and Python runs a handler only in its main thread, which may sleep on for an hour."""
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return True
    states = [process_state_of_thread(pid, int(t)) for t in threads if t.isdigit()]
    return not any(s in ("T", "t") for s in states) and process_state(pid) not in ("R", "T", "t")


def process_state_of_thread(pid: int, tid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].decode().split()[0]
    except (OSError, IndexError, UnicodeDecodeError):
        return None


@dataclass(frozen=True)
class Stat:
    state: str
    pgid: int
    sid: int
    start_ticks: int


def stat_of(pid: int) -> Stat | None:
    """What a scan of every process needs of one, from a single read of /proc/PID/stat."""
    fields = _stat_fields(pid)
    try:
        return Stat(fields[0], int(fields[2]), int(fields[3]), int(fields[19])) if fields else None
    except (IndexError, ValueError):
        return None


def session_of(pid: int) -> tuple[int, int] | None:
    """(pgid, sid) of a live process, from one read of its stat (fields 5 and 6)."""
    fields = _stat_fields(pid)
    try:
        return (int(fields[2]), int(fields[3])) if fields else None
    except (IndexError, ValueError):
        return None


def holds_open(pid: int, names: set[str]) -> bool:
    """Whether one of the process's open descriptors is one of `names`, as /proc/PID/fd links read: a path,
    or `socket:[INODE]` (a listener's socket, proc/listeners.py; the deployment's lock file,
    local/down.py)."""
    try:
        fds = os.scandir(f"/proc/{pid}/fd")
    except OSError:
        return False
    with fds:
        for fd in fds:
            try:
                if os.readlink(fd.path) in names:
                    return True
            except OSError:
                continue
    return False


def catches(pid: int, sig: signal.Signals) -> bool:
    """Whether the process has a handler installed for `sig` (SigCgt in /proc/PID/status)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            caught = next(int(line.split()[1], 16) for line in f if line.startswith("SigCgt:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return False
    return bool(caught >> (sig - 1) & 1)


@dataclass(frozen=True)
class ProcessRef:
    """A process identified across pid reuse and clock steps.

    `create_time` (wall clock) is kept for display and for state files older than `start_ticks`: a
    ref without ticks is legacy, found only by its create time and never trusted for its group or
    session (see `verified`).
    """

    pid: int
    start_ticks: int | None = None
    boot_id: str | None = None
    create_time: float | None = None

    @classmethod
    def of(cls, pid: int) -> ProcessRef:
        """The process with this pid now (it must not have been reaped yet)."""
        ticks = start_ticks(pid)
        if ticks is None:
            raise psutil.NoSuchProcess(pid)
        try:
            created = psutil.Process(pid).create_time()
        except psutil.Error:
            created = None
        return cls(pid, ticks, boot_id(), created)

    @property
    def verified(self) -> bool:
        """Identified by start ticks in this boot: a match is this very process, not a reuse of its pid."""
        return self.start_ticks is not None and self.boot_id is not None and self.boot_id == boot_id()

    def is_running(self) -> bool:
        if self.verified:
            return start_ticks(self.pid) == self.start_ticks and process_state(self.pid) not in (
                "Z",
                "X",
                None,
            )
        return False

    def find(self) -> psutil.Process | None:
        """Its live process, or None (gone, a zombie, its pid reused, or another boot)."""
        try:
            if self.verified:
                if not self.is_running():
                    return None
                proc = psutil.Process(self.pid)
                return proc if start_ticks(self.pid) == self.start_ticks else None
            if self.start_ticks is None and self.create_time is not None:  # a legacy state file
                proc = psutil.Process(self.pid)
                if (
                    abs(proc.create_time() - self.create_time) < CREATE_TIME_SLACK
                    and proc.status() != psutil.STATUS_ZOMBIE
                ):
                    return proc
        except psutil.Error:
            pass
        return None

    def send_signal(self, sig: int) -> bool:
        """Signal it only if it is still this process; True if the signal went."""
        return self.verified and signal_if(self.pid, self.start_ticks, sig)

    def to_json(self, prefix: str = "") -> dict[str, Any]:
        return {
            f"{prefix}create_time": self.create_time,
            f"{prefix}start_ticks": self.start_ticks,
            f"{prefix}boot_id": self.boot_id,
        }

    @classmethod
    def from_json(cls, pid: int | None, d: Mapping[str, Any], prefix: str = "") -> ProcessRef | None:
        if not pid:
            return None
        return cls(
            pid, d.get(f"{prefix}start_ticks"), d.get(f"{prefix}boot_id"), d.get(f"{prefix}create_time")
        )


def signal_if(pid: int, ticks: int | None, sig: int) -> bool:
    """Send `sig` to `pid` if it started at `ticks`: through a pidfd opened before the check, so the pid
    cannot be reused in between. True if it went."""
    if ticks is None:
        return False
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return False
    try:
        if start_ticks(pid) != ticks:
            return False
        signal.pidfd_send_signal(fd, sig)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
