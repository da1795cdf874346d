"""`down`: from any shell, with or without a live supervisor. Everything it needs is in state.json
and in the marker every process of the deployment carries."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import replace

import psutil
from tenacity import Retrying, retry_if_result, stop_after_delay, wait_fixed

from muse_launch.backend_types import DownReport
from muse_launch.errors import RuntimeFailure
from muse_launch.host.gpus import GPU_RELEASE_SECONDS, GpuReader
from muse_launch.local.gpu_runtime import await_gpu_release, deployment_holders
from muse_launch.proc import cgroups
from muse_launch.proc.cgroups import BEST_EFFORT_NOTE
from muse_launch.proc.identity import catches, holds_open
from muse_launch.proc.masks import no_arguments
from muse_launch.proc.ports import is_listening, port_holder
from muse_launch.proc.process import (
    POLL_SECONDS,
    GroupStop,
    Marker,
    ProcessRef,
    StopTarget,
    describe,
    is_alive,
    marked_processes,
    marked_roles,
    stop_in_waves,
    stop_roles,
)
from muse_launch.rundir.lifecycle import RoleState
from muse_launch.rundir.state import (
    DeploymentLock,
    DeploymentRecord,
    RunDir,
    StateDamaged,
    read_state,
    recorded_role,
    write_state,
)

SUPERVISOR_EXIT_SECONDS = 5.0
PORTS_CLOSE_SECONDS = 10.0
LOCK_WAIT_SECONDS = 60.0  # for an `up` still in its checks, or another `down`, beyond the roles' graces
LOCK_POLL_SECONDS = 0.05


def refuse_leftovers(run_dir: RunDir) -> None:
    """Roles of an earlier run still alive (its supervisor was killed): name them, start no duplicates."""
    marker = Marker(run_dir.name, str(run_dir.path))
    try:
        record = read_state(run_dir)
    except StateDamaged:
        record = None
    roles = {r.name: r.process.find() for r in record.roles if r.process} if record else {}
    roles = {name: proc for name, proc in roles.items() if proc is not None}
    for proc in marked_processes(marker):
        try:
            roles.setdefault(proc.environ().get("MUSE_LAUNCH_ROLE", "?"), proc)
        except psutil.Error:
            continue
    mask = record.masks.token if record else no_arguments  # the earlier run's secrets, by value
    running = [f"{name} ({describe(proc, mask)})" for name, proc in sorted(roles.items())]
    # One that cleared its environment carries no marker, but stays in its role's cgroup.
    running += [
        f"{path.name} (pid {pid}, in its cgroup {path})"
        for path in cgroups.role_cgroups(run_dir.name, marker.run_dir)
        for pid in cgroups.members(path)
        if path.name not in roles
    ]
    if running:
        running = ", ".join(running)
        raise RuntimeFailure(
            f"deployment {run_dir.name!r} still has processes from an earlier run: roles "
            f"{running} are running with no supervisor; nothing new was started",
            fix=f"`muse-launch down {run_dir.name}` stops them; then `up` again",
        )


def release_supervisor(record: DeploymentRecord) -> str | None:
    """Ask a live supervisor to hand the roles over (SIGUSR1) so it restarts nothing while they stop.

    It is signalled by its start ticks (a pidfd checked before the signal), so neither a reused pid nor
    a wall-clock step since it started fools `down`; a legacy state file's supervisor by its create time."""
    ref = record.supervisor
    proc = ref.find() if ref else None
    if proc is None:
        return "no supervisor was running" if ref else None
    return _release(ref, proc)


def _release(ref: ProcessRef, proc: psutil.Process) -> str | None:
    if ref.verified:
        send, alive = ref.send_signal, ref.is_running
    else:
        send, alive = proc.send_signal, lambda: is_alive(proc)
    send(signal.SIGUSR1)
    deadline = time.monotonic() + SUPERVISOR_EXIT_SECONDS
    while alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    if alive():
        send(signal.SIGKILL)
        deadline = time.monotonic() + SUPERVISOR_EXIT_SECONDS
        while alive() and time.monotonic() < deadline:  # its death frees the lock
            time.sleep(0.02)
        limit = f"{SUPERVISOR_EXIT_SECONDS:g}s"
        return f"the supervisor (pid {proc.pid}) did not hand over within {limit}; killed it"
    return None


def lock_holding_supervisors(run_dir: RunDir) -> list[ProcessRef]:
    """With state.json unreadable, the supervisor's pid is unknown; the kernel still knows who holds the
    deployment's lock file open. A holder that is a `muse-launch up` (the detached supervisor is a fork of
    that command line) with a SIGUSR1 handler is its supervisor: a supervisor installs it before it supervises
    anything, while an `up` still in its checks has none and is waited for, as is a `down` holding it."""
    lock = {os.path.realpath(run_dir.lock_file)}
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.pid == os.getpid() or not holds_open(proc.pid, lock):
                continue
            argv = proc.cmdline()
        except psutil.Error:
            continue
        if (
            "up" in argv
            and any("muse_launch" in a or "muse-launch" in a for a in argv[:3])
            and catches(proc.pid, signal.SIGUSR1)
        ):
            found.append(ProcessRef.of(proc.pid))
    return found


def containment_note(record: DeploymentRecord) -> str | None:
    """Said once by `down` when a role that ran had no cgroup of its own."""
    if any(r.started_at and not r.cgroup for r in record.roles):
        return f"{BEST_EFFORT_NOTE}\n  fix: {cgroups.best_effort_fix(record.source)}"
    return None


def open_ports(record: DeploymentRecord) -> list[str]:
    """Each role's ports on its own address (a rehearsal gives each node its own loopback address)."""
    return [
        f"{role.name} {name} port {role.probe_host}:{port} (held by "
        f"{port_holder(port, role.probe_host, recorded=recorded_role)})"
        for role in record.roles
        for name, port in role.ports.items()
        if is_listening(role.probe_host, port)
    ]


def _readable_state(run_dir: RunDir) -> DeploymentRecord | None:
    try:
        return read_state(run_dir)
    except StateDamaged:
        return None


def take_over(run_dir: RunDir, grace: float | None) -> tuple[DeploymentLock, list[str]]:
    """The deployment's lock, for this `down`. Whoever holds it is made to let go: a supervisor is asked to
    hand the roles over (SIGUSR1; an `up` still in its checks names its supervisor in state.json as soon as
    it has one); another `down` is waited for, after which this one stops what is left, usually nothing."""
    notes: list[str] = []
    deadline: float | None = None
    first = _readable_state(run_dir)
    # Dead already when this `down` began (not released meanwhile by another `down`): say so.
    released = first is None or first.supervisor is None or first.supervisor.find() is not None
    asked: set[int] = set()  # supervisors found by the lock they hold, each asked once
    while True:
        record = _readable_state(run_dir)
        if record is not None and record.supervisor is not None and record.supervisor.find() is not None:
            released = True
            if note := release_supervisor(record):
                notes.append(note)
        elif record is None:  # damaged or gone: the lock's holder may be the supervisor
            for ref in lock_holding_supervisors(run_dir):
                if ref.pid not in asked and (proc := ref.find()) is not None:
                    asked.add(ref.pid)
                    released = True
                    notes.append(
                        f"{run_dir.state_file} is unreadable: asked the supervisor holding the "
                        f"deployment's lock (pid {ref.pid}) to hand over"
                    )
                    if note := _release(ref, proc):
                        notes.append(note)
        if (lock := DeploymentLock.attempt(run_dir)) is not None:
            if not released:
                notes.insert(0, "no supervisor was running")
            return lock, notes + ([lock.note] if lock.note else [])
        if deadline is None:
            graces = (
                sum(
                    max((grace if grace is not None else r.grace) for r in record.roles)
                    for _ in record.stop_waves
                )
                if record and record.roles
                else 0.0
            )
            deadline = (
                time.monotonic() + LOCK_WAIT_SECONDS + graces + PORTS_CLOSE_SECONDS + GPU_RELEASE_SECONDS
            )
        if time.monotonic() >= deadline:
            raise RuntimeFailure(
                f"deployment {run_dir.name!r} is still held by another muse-launch (an `up` or "
                f"a `down`) after {LOCK_WAIT_SECONDS:g}s plus its roles' grace periods",
                fix=f"wait for it, then run `muse-launch down {run_dir.name}` again",
            )
        time.sleep(LOCK_POLL_SECONDS)


def bring_down(run_dir: RunDir, grace: float | None = None, gpus: GpuReader | None = None) -> DownReport:
    """Stop the deployment by its state; by its marker alone where the state is gone or damaged. Writes
    nothing it needs: on a read-only or full disk it still stops everything, and says what it could not
    record. A second `down` meanwhile waits for this one (`take_over`)."""
    started = time.monotonic()
    lock, notes = take_over(run_dir, grace)
    try:
        record = _readable_state(run_dir)  # the supervisor's last word
        if record is None:
            report = bring_down_without_state(run_dir, grace)
            return replace(report, seconds=time.monotonic() - started, notes=(*notes, *report.notes))
        marker = Marker(record.name, str(run_dir.path))
        on_gpus = gpus is not None and any(r.gpus for r in record.roles)
        seen = deployment_holders(record, gpus()) if on_gpus else {}
        stopped: list[str] = []
        killed: list[str] = []
        survivors: list[str] = []

        def begin(wave: tuple[str, ...]) -> list[GroupStop]:
            targets = [record.role(name).stop_target(grace) for name in wave]
            stopped.extend(
                t.role
                for t in targets
                if t.leader or marked_processes(marker, t.role) or cgroups.members(t.cgroup)
            )
            return [GroupStop(targets, marker, time.monotonic(), record.masks.token)]

        report = stop_in_waves(record.stop_waves, begin, lambda: time.sleep(POLL_SECONDS))
        killed += report.killed
        survivors += report.survivors
        # Anything still marked (spawned by a supervisor killed between spawn and its state write, or one
        # that restarted a role while it could not write its state).
        leftover_roles = marked_roles(marker)
        stopped += sorted(leftover_roles - set(stopped))
        report = stop_roles(
            [StopTarget(role, None, "SIGKILL", 0.0) for role in leftover_roles],
            marker,
            mask=record.masks.token,
        )
        killed += report.killed
        survivors += report.survivors
        still_open = Retrying(
            stop=stop_after_delay(PORTS_CLOSE_SECONDS),
            wait=wait_fixed(0.05),
            retry=retry_if_result(bool),
            retry_error_callback=lambda s: s.outcome.result(),
        )(open_ports, record)
        for role in record.roles:
            cgroups.remove(role.cgroup)  # emptied by now; waits a moment for members still exiting
        if note := containment_note(record):
            notes.append(note)
        release = await_gpu_release(record, gpus, seen) if on_gpus else None
        final = replace(
            record,
            supervisor=None,
            change=None,  # stopped: whatever change ran is over
            roles=tuple(
                replace(r, state=RoleState.STOPPED, process=None, ready_at=None) for r in record.roles
            ),
        )
        try:
            write_state(run_dir, final)
        except OSError as exc:
            notes.append(
                f"everything is stopped, but {run_dir.state_file} could not be updated "
                f"({exc.strerror or exc}); `status` shows the state last written"
            )
    finally:
        lock.release()
    return DownReport(
        record.name,
        time.monotonic() - started,
        tuple(stopped),
        tuple(killed),
        tuple(survivors),
        tuple(still_open),
        tuple(notes),
        release.line if release else None,
        release.held if release else (),
    )


def bring_down_without_state(run_dir: RunDir, grace: float | None = None) -> DownReport:
    """`down` of a deployment whose state.json is gone or damaged: stop whatever carries its marker, and
    empty the role cgroups it left (where a process that cleared its environment still is)."""
    started = time.monotonic()
    marker = Marker(run_dir.name, str(run_dir.path))
    contained = {
        path.name: path for path in cgroups.role_cgroups(run_dir.name, marker.run_dir, anywhere=True)
    }
    roles = sorted(marked_roles(marker) | {role for role, path in contained.items() if cgroups.members(path)})
    report = stop_roles(
        [
            StopTarget(
                role,
                None,
                "SIGTERM",
                10.0 if grace is None else grace,
                cgroup=str(contained[role]) if role in contained else None,
            )
            for role in roles
        ],
        marker,
        mask=no_arguments,
    )  # the secrets' digests went with the state
    for path in contained.values():
        cgroups.remove(path)
    reach = "the deployment's marker and its role cgroups" if contained else "the deployment's marker"
    note = (
        f"{run_dir.state_file} is missing or damaged: stopped the processes in {reach} "
        f"(best effort: no ports or process groups to check without the state)"
    )
    return DownReport(
        name=run_dir.name,
        seconds=time.monotonic() - started,
        stopped=tuple(roles),
        killed=tuple(report.killed),
        survivors=tuple(report.survivors),
        open_ports=(),
        notes=(note,),
    )
