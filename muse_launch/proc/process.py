"""Role processes: each spawned in its own session, and stopped so that nothing of it remains.

Every process of a deployment carries marker variables in its environment, inherited by all
its descendants. That finds a child which called setsid, or one re-parented to PID 1 after
its parent was SIGKILLed (vLLM's EngineCore), long after the supervisor is gone. Where the host
offers cgroups, each role also runs in its own (proc/cgroups.py), which finds even a child that
cleared its environment; processes are known by their start ticks (proc/identity.py), never by a
pid alone, and signalled through a pidfd.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import psutil

from muse_launch.files import PlantedLink, open_nofollow
from muse_launch.plan.spec import LaunchSpec
from muse_launch.proc import cgroups
from muse_launch.proc.identity import (  # noqa: F401  (imported from here elsewhere)
    CREATE_TIME_SLACK,
    ProcessRef,
    boot_id,
    is_suspended,
    process_state,
    resumed,
    session_of,
    start_ticks,
    stat_of,
)
from muse_launch.proc.masks import command_line
from muse_launch.proc.programs import program_path

MARKER_DEPLOYMENT = "MUSE_LAUNCH_DEPLOYMENT"
MARKER_ROLE = "MUSE_LAUNCH_ROLE"
MARKER_RUN_DIR = "MUSE_LAUNCH_RUN_DIR"

POLL_SECONDS = 0.02
AFTER_KILL_SECONDS = 10.0  # a process in uninterruptible sleep (a GPU driver call) may take a while


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


def is_alive(proc: psutil.Process) -> bool:
    """A zombie is dead: it holds no memory, GPU or port, only waits to be reaped."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def describe(proc: psutil.Process | ProcessRef, mask: Callable[[str], str] = lambda arg: arg) -> str:
    """ "pid N (command line)"; `mask` hides each argument that holds a secret (proc/masks.py), before the
    line is cut (a cut through a secret would leave a part that no mask matches)."""
    try:
        if isinstance(proc, ProcessRef):
            proc = psutil.Process(proc.pid)
        command = command_line(proc.cmdline(), mask) or proc.name()
    except psutil.Error:
        command = "?"
    return f"pid {proc.pid} ({fit_command(command)})"


DESCRIBED_WIDTH = 100  # a described command line, at most
DESCRIBED_WORD = 32  # a longer word (a path under wherever the repository is) shows its end


def fit_command(command: str) -> str:
    """A (masked) command line cut to DESCRIBED_WIDTH at a space, never inside a word, each word longer than
    DESCRIBED_WORD shown by its end ("...venv/bin/python"): what follows the program's path (its flags,
    `--api-key ***`) shows the same wherever the program is installed."""
    words = [w if len(w) <= DESCRIBED_WORD else "..." + w[3 - DESCRIBED_WORD :] for w in command.split(" ")]
    shown = ""
    for word in words:
        longer = f"{shown} {word}" if shown else word
        if len(longer) > DESCRIBED_WIDTH:
            return f"{shown} ..."
        shown = longer
    return shown


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

    @property
    def cgroup(self) -> str | None: ...

    def poll(self) -> int | None: ...

    def suspended(self) -> bool:
        """Stopped by SIGSTOP (or a tracer): alive, and serving nothing."""


@dataclass(frozen=True)
class SpawnedProcess:
    popen: subprocess.Popen
    ref: ProcessRef
    cgroup: str | None = None  # the role's own cgroup, where the host offers one

    def poll(self) -> int | None:
        return self.popen.poll()

    def suspended(self) -> bool:
        return is_suspended(self.popen.pid)


class SpawnError(Exception):
    """The program could not be executed at all (missing, not executable)."""


def open_role_log(log_path: Path, marker: Marker, append: bool) -> int:
    """The role's log for its stdout and stderr, no link followed below the state home
    (muse_launch/files.py)."""
    # Always O_APPEND: after the supervisor rotated it by copy-truncate (rundir/logfiles.py), the role's
    # next write lands at the new end, not at its old offset past a hole.
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | (0 if append else os.O_TRUNC)
    return open_nofollow(log_path, flags, root=Path(marker.run_dir).parent)


def spawn_role(spec: LaunchSpec, marker: Marker, log_path: Path, append: bool) -> SpawnedProcess:
    env = {**os.environ, **spec.env, **marker.env(spec.name)}
    argv = [program_path(spec.argv[0], env), *spec.argv[1:]]
    try:
        log = open_role_log(log_path, marker, append)
    except PlantedLink as e:  # never written through
        raise SpawnError(f"cannot open its log: {e}") from e
    except OSError:  # a read-only or full run directory: the role runs (a restart too), its output is lost
        log = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
    try:
        cgroup = cgroups.create_role_cgroup(marker.deployment, marker.run_dir, spec.name)
        procs = os.open(cgroup / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC) if cgroup else None
    except BaseException:
        os.close(log)
        raise
    try:
        popen = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own session and group: Ctrl-C on our terminal never reaches it
            # Into its cgroup before exec, so nothing it runs is ever outside ("0": the writer itself).
            preexec_fn=None if procs is None else lambda: os.write(procs, b"0"),
        )
    except OSError as e:
        raise SpawnError(f"cannot run {spec.argv[0]!r}: {e.strerror}") from e
    except subprocess.SubprocessError as e:  # the preexec_fn failed: the move into the cgroup was refused
        raise SpawnError(
            f"cannot move {spec.name} into its cgroup {cgroup} ({e}); "
            f"{cgroups.CGROUPS_SWITCH}=0 runs roles without cgroups"
        ) from e
    finally:
        os.close(log)
        if procs is not None:
            os.close(procs)
    # Not yet reaped even if it exited already, so its start time is still readable.
    return SpawnedProcess(popen, ProcessRef.of(popen.pid), str(cgroup) if cgroup else None)


@dataclass(frozen=True)
class StopTarget:
    """What stopping a role needs; the state file keeps it, so `down` works without the supervisor."""

    role: str
    leader: ProcessRef | None
    signal: str = "SIGTERM"
    grace: float = 30.0
    cgroup: str | None = None  # every process in it is the role's, whatever its environment or session


@dataclass(frozen=True)
class StopReport:
    killed: tuple[str, ...] = ()  # "role: pid N (command)" for each process that needed SIGKILL
    survivors: tuple[str, ...] = ()  # still alive after SIGKILL (uninterruptible sleep)


@dataclass
class _Stopping:
    target: StopTarget
    processes: list[ProcessRef]
    deadline: float
    killed_at: float | None = None
    killed: list[str] = field(default_factory=list)
    resuming: tuple[float, int | None] | None = None  # (since, pgid): SIGCONT sent, the stop signal not yet
    # (when, pgid): the stop signal sent to a resumed process, sent once more if it is still there after
    # RESEND_SECONDS: on a loaded host its main thread may still not have been the one to take it
    resent: tuple[float, int | None] | None = None


def role_processes(target: StopTarget, marker: Marker) -> tuple[list[ProcessRef], int | None]:
    """The role's processes, each as verified then (pid and start ticks): its leader, its cgroup's members,
    its marked processes, its session's members when the session is provably the role's, and all their
    descendants.

    The session (and group) the leader created is the role's while the leader holds its pid (checked by
    start ticks, so a reused pid is someone else; a zombie not yet reaped still holds it), or, once the
    leader is gone, while one of its members is verifiably ours (marker or cgroup): a session id stays
    taken while any process is in it, so a session with a member of ours has been ours since the leader
    created it. Else a process whose session id equals the dead leader's pid may be anyone's (a daemon's
    double fork leaves such sessions): neither it nor its group is touched.
    """
    leader = target.leader
    me = boot_id()
    found: dict[int, ProcessRef] = {}
    if leader is not None and leader.verified:
        # Its pid is still the leader's (alive, or a zombie not yet reaped): no one else can have made that
        # session.
        session_ours = start_ticks(leader.pid) == leader.start_ticks
        if leader.is_running():
            found[leader.pid] = leader
    else:  # a state file from before start ticks: the leader by its create time, its session never trusted
        session_ours = False
        if leader is not None and (proc := leader.find()) is not None:
            found[proc.pid] = ProcessRef(proc.pid, start_ticks(proc.pid), me)
    in_cgroup = set(cgroups.members(target.cgroup))
    in_session: list[ProcessRef] = []
    for proc in psutil.process_iter():
        pid = proc.pid
        stat = stat_of(pid)
        if stat is None or pid in found or stat.state in ("Z", "X"):
            continue
        ticks = stat.start_ticks
        ref = ProcessRef(pid, ticks, me)
        same_session = (
            leader is not None
            and leader.pid in (stat.pgid, stat.sid)
            and (leader.start_ticks is None or ticks >= leader.start_ticks)
        )
        try:
            ours = pid in in_cgroup or marker.matches(proc.environ(), target.role)
        except psutil.Error:
            ours = False
        if ours:
            found[pid] = ref
            session_ours = session_ours or (same_session and leader.verified)
        elif same_session:
            in_session.append(ref)
    if session_ours:
        found.update((r.pid, r) for r in in_session)
    for ref in list(found.values()):
        try:
            children = psutil.Process(ref.pid).children(recursive=True)
        except psutil.Error:
            continue
        for child in children:
            if (ticks := start_ticks(child.pid)) is not None and process_state(child.pid) not in (
                "Z",
                "X",
                None,
            ):
                found.setdefault(child.pid, ProcessRef(child.pid, ticks, me))
    return list(found.values()), leader.pid if session_ours else None


def _signal(processes: Iterable[ProcessRef], pgid: int | None, sig: signal.Signals) -> None:
    if pgid is not None:
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:  # ESRCH: the group is gone already
            pass
    for ref in processes:
        if pgid is not None and (session_of(ref.pid) or (None,))[0] == pgid:
            continue  # the group signal reached it; a second SIGTERM means "exit now" to some servers
        ref.send_signal(sig)  # through a pidfd, if it is still the process found


def _stop_signal(processes: list[ProcessRef], pgid: int | None, sig: signal.Signals) -> None:
    """The stop signal, then SIGCONT: a process stopped by SIGSTOP since acts on it now, not at SIGKILL."""
    _signal(processes, pgid, sig)
    if sig not in (signal.SIGKILL, signal.SIGCONT):
        _signal(processes, pgid, signal.SIGCONT)


RESUME_SECONDS = 3.0  # how long a stopped process may take to run again before its stop signal goes anyway
RESEND_SECONDS = 1.0  # a resumed process still there this long after its stop signal gets it once more


class GroupStop:
    """Stopping some roles, as a state with deadlines: their stop signal sent at the start, SIGKILL at
    the end of each one's grace (or at once on `kill_now`). `poll` never waits: the supervisor's loop
    calls it between other work; it returns the report once none of their processes is alive."""

    def __init__(
        self,
        targets: Iterable[StopTarget],
        marker: Marker,
        now: float,
        mask: Callable[[str], str] = lambda arg: arg,
    ):
        self.marker = marker
        self.mask = mask  # for the command lines of what it reports killed
        self.stopping: list[_Stopping] = []
        self.killed: list[str] = []
        self.survivors: list[str] = []
        for target in targets:
            processes, pgid = role_processes(target, marker)
            entry = _Stopping(target, processes, now + target.grace)
            if any(is_suspended(p.pid) for p in processes):
                # Stopped by SIGSTOP: continue it first, and send the stop signal once it runs. A signal sent
                # while all its threads are stopped goes to whichever wakes first, and Python runs a handler
                # only in its main thread (asleep for an hour, it never would); a running process gets it
                # there.
                _signal(processes, pgid, signal.SIGCONT)
                entry.resuming = (now, pgid)
            else:
                _stop_signal(processes, pgid, signal.Signals[target.signal])
            self.stopping.append(entry)

    def poll(self, now: float, kill_now: bool = False) -> StopReport | None:
        for entry in list(self.stopping):
            if entry.resuming is not None:
                since, pgid = entry.resuming
                if (
                    not all(resumed(p.pid) for p in entry.processes)
                    and now - since < RESUME_SECONDS
                    and not kill_now
                ):
                    continue
                _stop_signal(entry.processes, pgid, signal.Signals[entry.target.signal])
                entry.resuming, entry.resent = None, (now, pgid)
            entry.processes = [p for p in entry.processes if p.is_running()]
            if entry.resent is not None and entry.processes and now - entry.resent[0] >= RESEND_SECONDS:
                _stop_signal(entry.processes, entry.resent[1], signal.Signals[entry.target.signal])
                entry.resent = (float("inf"), None)  # once: a handler that takes its time is not hurried
            if not entry.processes:
                # Look again: a process may have forked while shutting down; its cgroup lists every one left.
                target = entry.target
                entry.processes, _ = role_processes(
                    StopTarget(target.role, None, cgroup=target.cgroup), self.marker
                )
                if not entry.processes:
                    cgroups.remove(target.cgroup, wait=0.0)  # never waits: the supervisor's loop calls this
                    self.stopping.remove(entry)
                    self.killed += entry.killed
                continue
            if entry.killed_at is None and (now >= entry.deadline or kill_now):
                entry.processes, pgid = role_processes(entry.target, self.marker)
                entry.killed = [f"{entry.target.role}: {describe(p, self.mask)}" for p in entry.processes]
                cgroups.kill(entry.target.cgroup)  # every member at once, forking or not
                _signal(entry.processes, pgid, signal.SIGKILL)
                entry.killed_at = now
            elif entry.killed_at is not None and now - entry.killed_at > AFTER_KILL_SECONDS:
                self.survivors += [f"{entry.target.role}: {describe(p, self.mask)}" for p in entry.processes]
                self.killed += entry.killed
                self.stopping.remove(entry)
        return None if self.stopping else StopReport(tuple(self.killed), tuple(self.survivors))


class Polled(Protocol):
    def poll(self, now: float, kill_now: bool) -> StopReport | None: ...


def stop_in_waves(
    waves: Iterable[tuple[str, ...]],
    begin: Callable[[tuple[str, ...]], Iterable[Polled]],
    wait: Callable[[], None],
    now: Callable[[], float] = time.monotonic,
    kill_now: Callable[[], bool] = lambda: False,
) -> StopReport:
    """The one wave-stop (the supervisor's, `down`'s, and `down` of a SLURM job): the waves in the order given
    (last wave first), each wave's stops begun together, the next wave once every one of them reported."""
    killed: list[str] = []
    survivors: list[str] = []
    for wave in waves:
        pending = list(begin(wave))
        while pending:
            moment = now()
            for stop in list(pending):
                if (report := stop.poll(moment, kill_now())) is not None:
                    killed += report.killed
                    survivors += report.survivors
                    pending.remove(stop)
            if pending:
                wait()
    return StopReport(tuple(killed), tuple(survivors))


def stop_roles(
    targets: Iterable[StopTarget],
    marker: Marker,
    kill_now: threading.Event | None = None,
    mask: Callable[[str], str] = lambda arg: arg,
) -> StopReport:
    """Stop roles together and wait until none of their processes is alive (`down`: nothing else to do).

    `kill_now` (a second Ctrl-C) cuts the grace short.
    """
    stop = GroupStop(targets, marker, time.monotonic(), mask)
    while (report := stop.poll(time.monotonic(), kill_now is not None and kill_now.is_set())) is None:
        time.sleep(POLL_SECONDS)
    return report
