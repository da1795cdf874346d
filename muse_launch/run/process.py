"""Role processes: each spawned in its own session, and stopped so that nothing of it remains.

Every process of a deployment carries marker variables in its environment, inherited by all
its descendants. That finds a child which called setsid, or one re-parented to PID 1 after
its parent was SIGKILLed (vLLM's EngineCore), long after the supervisor is gone.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Mapping, Protocol

import psutil

from muse_launch.plan.spec import LaunchSpec
from muse_launch.run.logfiles import open_role_log

MARKER_DEPLOYMENT = "MUSE_LAUNCH_DEPLOYMENT"
MARKER_ROLE = "MUSE_LAUNCH_ROLE"
MARKER_RUN_DIR = "MUSE_LAUNCH_RUN_DIR"

POLL_SECONDS = 0.02
AFTER_KILL_SECONDS = 10.0  # a process in uninterruptible sleep (a GPU driver call) may take a while
CREATE_TIME_SLACK = 0.01  # state.json keeps create times to the hundredth of a second


@dataclass(frozen=True)
class Marker:
    """The environment that tags a deployment's processes; the run directory keeps two homes apart."""

    deployment: str
    run_dir: str

    def env(self, role: str) -> dict[str, str]:
        return {MARKER_DEPLOYMENT: self.deployment, MARKER_RUN_DIR: self.run_dir, MARKER_ROLE: role}

    def matches(self, environ: Mapping[str, str], role: str | None = None) -> bool:
        return (
            environ.get(MARKER_DEPLOYMENT) == self.deployment
            and environ.get(MARKER_RUN_DIR) == self.run_dir
            and (role is None or environ.get(MARKER_ROLE) == role)
        )


@dataclass(frozen=True)
class ProcessRef:
    """A process identified across PID reuse: the same pid with a different start time is someone else."""

    pid: int
    create_time: float

    def find(self) -> psutil.Process | None:
        try:
            proc = psutil.Process(self.pid)
            if abs(proc.create_time() - self.create_time) < CREATE_TIME_SLACK and is_alive(proc):
                return proc
        except psutil.Error:
            pass
        return None


def is_alive(proc: psutil.Process) -> bool:
    """A zombie is dead: it holds no memory, GPU or port, only waits to be reaped."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def describe(proc: psutil.Process, mask: Callable[[str], str] = lambda arg: arg) -> str:
    """"pid N (command line)"; `mask` hides each argument that holds a secret (run/masks.py), before the line
    is cut to 100 characters (a cut through a secret would leave a part that no mask matches)."""
    try:
        command = " ".join(map(mask, proc.cmdline())).strip() or proc.name()
    except psutil.Error:
        command = "?"
    return f"pid {proc.pid} ({command[:100]})"


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with code {returncode}"


def marked_processes(marker: Marker, role: str | None = None) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter():
        try:
            if marker.matches(proc.environ(), role) and is_alive(proc):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def marked_roles(marker: Marker) -> set[str]:
    roles = set()
    for proc in marked_processes(marker):
        try:
            roles.add(proc.environ()[MARKER_ROLE])
        except (psutil.Error, KeyError):
            continue
    return roles


class RoleProcess(Protocol):
    """What the supervisor needs of a running role (a fake in unit tests)."""

    @property
    def ref(self) -> ProcessRef: ...

    def poll(self) -> int | None: ...


@dataclass(frozen=True)
class SpawnedProcess:
    popen: subprocess.Popen
    ref: ProcessRef

    def poll(self) -> int | None:
        return self.popen.poll()


class SpawnError(Exception):
    """The program could not be executed at all (missing, not executable)."""


def program_path(program: str, env: Mapping[str, str]) -> str:
    """A bare name from PATH, else from this interpreter's bin directory: the routers muse-launch
    depends on live in its venv, which need not be on PATH (`.venv/bin/muse-launch up ...`)."""
    if os.sep in program or shutil.which(program, path=env.get("PATH")):
        return program
    sibling = Path(sys.executable).parent / program
    return str(sibling) if os.access(sibling, os.X_OK) else program


def spawn_role(spec: LaunchSpec, marker: Marker, log_path: Path, append: bool) -> SpawnedProcess:
    env = {**os.environ, **spec.env, **marker.env(spec.name)}
    argv = [program_path(spec.argv[0], env), *spec.argv[1:]]
    try:
        with os.fdopen(open_role_log(log_path, fresh=not append), "ab") as log:  # O_APPEND: see run/logfiles.py
            popen = subprocess.Popen(
                argv, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,  # its own session and group: Ctrl-C on our terminal never reaches it
            )
    except OSError as e:
        raise SpawnError(f"cannot run {spec.argv[0]!r}: {e.strerror}") from e
    # Not yet reaped even if it exited already, so its start time is still readable.
    return SpawnedProcess(popen, ProcessRef(popen.pid, psutil.Process(popen.pid).create_time()))


@dataclass(frozen=True)
class StopTarget:
    """What stopping a role needs; the state file keeps it, so `down` works without the supervisor."""

    role: str
    leader: ProcessRef | None
    signal: str = "SIGTERM"
    grace: float = 30.0


@dataclass(frozen=True)
class StopReport:
    killed: tuple[str, ...] = ()  # "role: pid N (command)" for each process that needed SIGKILL
    survivors: tuple[str, ...] = ()  # still alive after SIGKILL (uninterruptible sleep)


@dataclass
class _Stopping:
    target: StopTarget
    processes: list[psutil.Process]
    deadline: float
    killed_at: float | None = None
    killed: list[str] = field(default_factory=list)


def role_processes(target: StopTarget, marker: Marker) -> tuple[list[psutil.Process], int | None]:
    """The role's leader, its process group, its marked processes and all their descendants.

    The group id is returned only when the group is provably the role's (its leader is the one we
    started, or a member is in the session that leader created), so a recycled id is never signalled.
    """
    found: dict[int, psutil.Process] = {}
    leader = target.leader.find() if target.leader else None
    pgid = target.leader.pid if target.leader else None
    group_is_ours = leader is not None
    in_group: list[psutil.Process] = []
    for proc in psutil.process_iter():
        try:
            proc_pgid = os.getpgid(proc.pid)
            if not is_alive(proc):
                continue
            if marker.matches(proc.environ(), target.role) or _in_role_session(proc, target.leader):
                found[proc.pid] = proc
                group_is_ours = group_is_ours or proc_pgid == pgid
            elif proc_pgid == pgid:
                in_group.append(proc)
        except (psutil.Error, OSError):
            continue
    if leader:
        found[leader.pid] = leader
    if group_is_ours:
        found.update((p.pid, p) for p in in_group)
    for proc in list(found.values()):
        try:
            found.update((c.pid, c) for c in proc.children(recursive=True) if is_alive(c))
        except psutil.Error:
            continue
    return list(found.values()), pgid if group_is_ours else None


def _in_role_session(proc: psutil.Process, leader: ProcessRef | None) -> bool:
    """In the session the role's leader created (it was started with start_new_session), and not
    older than it: ours even after the leader died, and even when it rewrote its title, which
    blanks the environ that holds the marker (vLLM's EngineCore, the routers)."""
    if leader is None:
        return False
    return os.getsid(proc.pid) == leader.pid and proc.create_time() >= leader.create_time - CREATE_TIME_SLACK


def _signal(processes: Iterable[psutil.Process], pgid: int | None, sig: signal.Signals) -> None:
    if pgid is not None:
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:  # ESRCH: the group is gone already
            pass
    for proc in processes:
        try:
            if pgid is not None and os.getpgid(proc.pid) == pgid:
                continue  # the group signal reached it; a second SIGTERM means "exit now" to some servers
            proc.send_signal(sig)  # psutil checks the process is still the same one
        except (psutil.Error, OSError):
            continue


class GroupStop:
    """Stopping some roles, as a state with deadlines: their stop signal sent at the start, SIGKILL at
    the end of each one's grace (or at once on `kill_now`). `poll` never waits: the supervisor's loop
    calls it between other work; it returns the report once none of their processes is alive."""

    def __init__(self, targets: Iterable[StopTarget], marker: Marker, now: float,
                 mask: Callable[[str], str] = lambda arg: arg):
        self.marker = marker
        self.mask = mask  # for the command lines of what it reports killed
        self.stopping: list[_Stopping] = []
        self.killed: list[str] = []
        self.survivors: list[str] = []
        for target in targets:
            processes, pgid = role_processes(target, marker)
            _signal(processes, pgid, signal.Signals[target.signal])
            self.stopping.append(_Stopping(target, processes, now + target.grace))

    def poll(self, now: float, kill_now: bool = False) -> StopReport | None:
        for entry in list(self.stopping):
            entry.processes = [p for p in entry.processes if is_alive(p)]
            if not entry.processes:
                # Look again: a process may have forked while shutting down.
                entry.processes, _ = role_processes(StopTarget(entry.target.role, None), self.marker)
                if not entry.processes:
                    self.stopping.remove(entry)
                    self.killed += entry.killed
                continue
            if entry.killed_at is None and (now >= entry.deadline or kill_now):
                entry.processes, pgid = role_processes(entry.target, self.marker)
                entry.killed = [f"{entry.target.role}: {describe(p, self.mask)}" for p in entry.processes]
                _signal(entry.processes, pgid, signal.SIGKILL)
                entry.killed_at = now
            elif entry.killed_at is not None and now - entry.killed_at > AFTER_KILL_SECONDS:
                self.survivors += [f"{entry.target.role}: {describe(p, self.mask)}" for p in entry.processes]
                self.killed += entry.killed
                self.stopping.remove(entry)
        return None if self.stopping else StopReport(tuple(self.killed), tuple(self.survivors))


def stop_roles(targets: Iterable[StopTarget], marker: Marker, kill_now: threading.Event | None = None,
               mask: Callable[[str], str] = lambda arg: arg) -> StopReport:
    """Stop roles together and wait until none of their processes is alive (`down`: nothing else to do).

    `kill_now` (a second Ctrl-C) cuts the grace short.
    """
    stop = GroupStop(targets, marker, time.monotonic(), mask)
    while (report := stop.poll(time.monotonic(), kill_now is not None and kill_now.is_set())) is None:
        time.sleep(POLL_SECONDS)
    return report
