"""The supervisor's seams: its wake-up, its clock and the processes it spawns and stops. Tests pass
fakes for the clock and the processes; the batch host on SLURM passes its steps."""

from __future__ import annotations

import os
import select
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from muse_launch.plan.spec import LaunchSpec
from muse_launch.proc.listeners import ListenerOwner
from muse_launch.proc.process import (
    GroupStop,
    Marker,
    RoleProcess,
    StopReport,
    StopTarget,
    open_role_log,
    spawn_role,
)
from muse_launch.rundir.state import RunDir


class Wakeup:
    """A self-pipe: `set` is one non-blocking write, safe in a signal handler (no lock, unlike
    threading.Event); `wait` sleeps until it is set or the time is up."""

    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)

    def set(self) -> None:
        try:
            os.write(self._write, b"!")
        except (BlockingIOError, OSError):  # full: the loop wakes anyway; closed: nobody waits
            pass

    def wait(self, seconds: float) -> None:
        readable, _, _ = select.select([self._read], [], [], max(0.0, seconds))
        if readable:
            try:
                while os.read(self._read, 4096):
                    pass
            except BlockingIOError:
                pass

    def close(self) -> None:
        for fd in (self._read, self._write):
            try:
                os.close(fd)
            except OSError:
                pass


class Clock(Protocol):
    def monotonic(self) -> float: ...

    def time(self) -> float: ...

    def wait(self, wakeup: Wakeup, seconds: float) -> None:
        """Sleep for `seconds`, or less if `wakeup` is set (a signal, a probe's answer)."""


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()

    def wait(self, wakeup: Wakeup, seconds: float) -> None:
        wakeup.wait(seconds)


class Stopping(Protocol):
    def poll(self, now: float, kill_now: bool) -> StopReport | None:
        """None while some of the processes are alive; the report once none is."""


class Processes(Protocol):
    def spawn(self, spec: LaunchSpec, restart_note: str | None) -> RoleProcess: ...

    def listener_owner(self, spec: LaunchSpec, process: RoleProcess) -> ListenerOwner | None:
        """Whose listener the role's probe must find answering; None where the role's processes cannot be
        looked at from here (a step on another node)."""

    def stop(self, targets: list[StopTarget], now: float) -> Stopping:
        """Send the stop signals now; the returned stop is polled until it is done."""


@dataclass(frozen=True)
class LocalProcesses:
    """Real processes: one session each, logs in the run directory, found again by their marker."""

    marker: Marker
    run_dir: RunDir
    mask: Callable[[str], str] = lambda arg: arg  # hides secrets in what it reports killed (proc/masks.py)

    def spawn(self, spec: LaunchSpec, restart_note: str | None) -> RoleProcess:
        log = self.run_dir.log(spec.name)
        if restart_note:
            try:
                with os.fdopen(open_role_log(log, self.marker, append=True), "a") as f:
                    f.write(f"--- muse-launch: {restart_note} ---\n")
            except OSError:
                pass  # a full or read-only disk: the restart still happens, and state.json says why
        return spawn_role(spec, self.marker, log, append=restart_note is not None)

    def listener_owner(self, spec: LaunchSpec, process: RoleProcess) -> ListenerOwner:
        """On this host the supervisor sees the role's processes: its probe checks whose listener answers."""
        return ListenerOwner(
            process.ref.pid, spec.name, self.marker.env(spec.name), getattr(process, "cgroup", None)
        )

    def stop(self, targets: list[StopTarget], now: float) -> Stopping:
        return GroupStop(targets, self.marker, now, self.mask)
