"""`down NAME` of a SLURM deployment: from any host that shares the run directory.

With the batch supervisor alive, `down` asks it (slurm/down-request) to stop the roles in reverse
waves, as it would on Ctrl-C, and waits for it to finish. Without it (killed; the batch script
then keeps the allocation), `down` stops each wave's steps itself through scancel. Either way it
then cancels the job and returns once SLURM lists no job or step of it, and no process of it is
left on this host; the state file ends with every role stopped.
"""

from __future__ import annotations

import socket
import time
from dataclasses import replace

from muse_launch.backend_types import DownReport
from muse_launch.errors import RuntimeFailure
from muse_launch.proc.process import (
    Marker,
    StopReport,
    StopTarget,
    describe,
    marked_processes,
    stop_in_waves,
    stop_roles,
)
from muse_launch.rundir.lifecycle import RoleState
from muse_launch.rundir.state import DeploymentRecord, RunDir, read_state, write_state

from . import cluster
from .files import SlurmFiles
from .processes import POLL_SECONDS as STEP_POLL_SECONDS
from .processes import StepStop

SUPERVISOR_ACK_SECONDS = 5.0
JOB_GONE_SECONDS = 60.0
BATCH_EXIT_SECONDS = 5.0
DONE_AFTER_HEARTBEAT_SECONDS = 2.0


def _listening(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=0.3).close()
        return True
    except OSError:
        return False


def down_on_slurm(run_dir: RunDir, grace: float | None = None) -> DownReport:
    """Ask the batch supervisor to stop the job's steps in reverse waves; stop them from here where it cannot;
    then end the job and whatever SLURM left on this host."""
    started = time.monotonic()
    files = SlurmFiles(run_dir)
    record = initial = read_state(run_dir)
    job_id = files.job_id()
    if record is None or job_id is None:
        raise RuntimeFailure(f"{run_dir.path}: no SLURM job recorded; nothing to stop")
    files.write_json(files.job, {**(files.read_json(files.job) or {}), "down_at": time.time()})
    had_steps = cluster.steps(job_id)
    by_supervisor, notes = _ask_the_supervisor(files, job_id, record, grace)
    record = read_state(run_dir) or record
    by_us = _stop_the_steps(job_id, record, grace)
    gone = cluster.wait_gone(job_id, JOB_GONE_SECONDS)
    survivors = [*by_supervisor.survivors, *by_us.survivors]
    if gone.active or cluster.steps(job_id):
        survivors.append(
            f"SLURM still lists job {job_id} ({gone.state}) or its steps: "
            f"{', '.join(cluster.steps(job_id)) or 'none'}"
        )
    leftovers = _stop_leftovers(run_dir, record)
    open_ports = [
        f"{r.name} {kind} port {r.probe_host}:{port}"
        for r in record.roles
        for kind, port in r.ports.items()
        if _listening(r.probe_host, port)
    ]
    write_state(
        run_dir,
        replace(
            record,
            supervisor=None,
            roles=tuple(
                replace(r, state=RoleState.STOPPED, process=None, ready_at=None) for r in record.roles
            ),
        ),
    )
    files.down_request.unlink(missing_ok=True)
    stopped = tuple(r.name for r in initial.roles if r.process or r.name in had_steps)
    killed = (*by_supervisor.killed, *by_us.killed, *leftovers.killed)
    return DownReport(
        record.name,
        time.monotonic() - started,
        stopped,
        killed,
        (*survivors, *leftovers.survivors),
        tuple(open_ports),
        tuple(notes or [f"SLURM job {job_id}: {gone.state.lower()}"]),
    )


def _ask_the_supervisor(
    files: SlurmFiles, job_id: str, record: DeploymentRecord, grace: float | None
) -> tuple[StopReport, list[str]]:
    """The batch supervisor stops the steps as on Ctrl-C, if it runs; what it reported, and notes."""
    job = cluster.job(job_id)
    if not (job.active and files.supervisor_alive() and not files.done.exists()):
        if job.state == "PENDING":
            return StopReport(), [f"SLURM job {job_id} was still pending; cancelling it"]
        if job.active:
            return StopReport(), ["no supervisor was running; stopping the steps through SLURM"]
        if job.state != "GONE":
            return StopReport(), [f"SLURM job {job_id} had already ended ({job.state.lower()})"]
        return StopReport(), []
    files.write_json(files.down_request, {"grace": grace, "at": time.time()})
    waves_grace = sum(
        max((grace if grace is not None else r.grace) for r in record.roles if r.name in wave) + 20.0
        for wave in record.stop_waves
    )
    deadline = time.monotonic() + waves_grace
    while not files.done.exists() and files.supervisor_alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    # Its heartbeat ends a moment before it writes slurm/done: give it that moment.
    settle = time.monotonic() + DONE_AFTER_HEARTBEAT_SECONDS
    while not files.done.exists() and not files.supervisor_alive() and time.monotonic() < settle:
        time.sleep(0.1)
    if not files.done.exists():
        why = (
            f"did not finish stopping within {waves_grace:g}s"
            if files.supervisor_alive()
            else "stopped beating before it finished stopping"
        )
        return StopReport(), [f"the batch supervisor {why}; stopping the steps from here"]
    done = files.read_json(files.done) or {}
    cluster.wait_gone(job_id, BATCH_EXIT_SECONDS)  # the batch script ends the job itself
    return StopReport(
        tuple(f"{k} (by the batch supervisor)" for k in done.get("killed", [])),
        tuple(done.get("survivors", [])),
    ), []


def _stop_the_steps(job_id: str, record: DeploymentRecord, grace: float | None) -> StopReport:
    """While the job runs: its steps, in reverse waves through scancel, then the job."""
    if not cluster.job(job_id).active:
        return StopReport()

    def begin(wave: tuple[str, ...]) -> list[StepStop]:
        return [
            StepStop(
                job_id,
                [
                    StopTarget(
                        name,
                        None,
                        record.role(name).stop_signal,
                        record.role(name).grace if grace is None else grace,
                    )
                    for name in wave
                ],
                time.monotonic(),
            )
        ]

    report = stop_in_waves(record.stop_waves, begin, lambda: time.sleep(STEP_POLL_SECONDS))
    cluster.cancel(job_id)
    return report


def _stop_leftovers(run_dir: RunDir, record: DeploymentRecord) -> StopReport:
    """The steps' processes are SLURM's to end (proctrack); what it missed on this host is ours."""
    marker = Marker(record.name, str(run_dir.path))
    if not (leftovers := marked_processes(marker)):
        return StopReport()
    report = stop_roles([StopTarget(r, None, "SIGKILL", 0.0) for r in {r.name for r in record.roles}], marker)
    return StopReport(tuple(f"left by SLURM: {describe(p)}" for p in leftovers), report.survivors)
