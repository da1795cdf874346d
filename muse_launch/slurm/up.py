"""`up FILE --on slurm`: submit the batch script, print the job id, follow the batch host's
supervisor through the run directory until every role is ready (or one failed, and then nothing
of the job is left), then return (-d) or stream the roles' logs until Ctrl-C."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from muse_launch.errors import RuntimeFailure
from muse_launch.files import open_fresh, replace_file
from muse_launch.plan.spec import Plan
from muse_launch.render_progress import LiveProgress, PlainProgress
from muse_launch.rundir.lifecycle import DeploymentState, RoleState
from muse_launch.rundir.logs import LogFollower, RolePrinter, last_lines
from muse_launch.rundir.state import SLURM, RunDir, is_locked, read_state, write_state
from muse_launch.supervise.planned_record import planned_record
from muse_launch.topology.model import Topology

from . import cluster
from .down import down_on_slurm
from .files import SlurmFiles
from .script import default_python, render_script

POLL_SECONDS = 0.1
JOB_POLL_SECONDS = 0.5
FAILURE_LOG_LINES = 20
CANCEL_WAIT_SECONDS = 60.0


@dataclass(frozen=True)
class SlurmOptions:
    partition: str | None = None
    account: str | None = None
    time: str | None = None
    sbatch: tuple[str, ...] = ()
    detach: bool = False
    fail_fast: bool = False
    rehearse: bool = False
    sets: tuple[str, ...] = field(default_factory=tuple)

    def sbatch_options(self) -> list[str]:
        out = [f"--partition={self.partition}"] if self.partition else []
        out += [f"--account={self.account}"] if self.account else []
        out += [f"--time={self.time}"] if self.time else []
        return [*out, *self.sbatch]


def sbatch_script(
    plan: Plan, topology: Topology, rehearse: bool, sets: list[str], fail_fast: bool = False
) -> str:
    """`plan --format sbatch`: the script `up --on slurm` submits for the same file and options."""
    return render_script(
        topology, SlurmFiles(RunDir.of(plan.name)), default_python(), rehearse, sets, fail_fast
    )


def _say(console: Console) -> Callable[[str], None]:
    return lambda text: console.print(text, highlight=False, markup=False, soft_wrap=True)


def _refuse_if_running(files: SlurmFiles) -> None:
    if is_locked(files.run_dir):
        raise RuntimeFailure(
            f"deployment {files.run_dir.name!r} is running on this host; "
            f"`muse-launch down {files.run_dir.name}` first"
        )
    job_id = files.job_id()
    if job_id and cluster.job(job_id).active:
        raise RuntimeFailure(
            f"deployment {files.run_dir.name!r} still has SLURM job {job_id}; "
            f"`muse-launch down {files.run_dir.name}` first"
        )


def up_on_slurm(
    plan: Plan,
    topology: Topology,
    source: Path,
    redact: Callable[[str], str],
    options: SlurmOptions,
    console: Console,
) -> int:
    say = _say(console)
    run_dir = RunDir.of(plan.name)
    files = SlurmFiles(run_dir)
    _refuse_if_running(files)
    fresh = not run_dir.path.exists()
    script = render_script(
        topology, files, default_python(), options.rehearse, list(options.sets), options.fail_fast
    )
    files.clear_run()
    # What was checked is what the batch host plans.
    replace_file(files.topology, Path(source).read_bytes(), root=run_dir.home)
    files.write_text(files.source, str(Path(source).resolve()))
    files.write_text(files.script, script)
    for spec in plan.specs:  # a link planted there is replaced, not written through (muse_launch/files.py)
        os.close(open_fresh(run_dir.log(spec.name), root=run_dir.home))
    record = planned_record(plan, str(source), redact, backend=SLURM)
    write_state(run_dir, record)
    started = time.monotonic()
    submitted_at = time.time()
    try:
        job_id = cluster.submit(script, options.sbatch_options())
    except BaseException:
        _forget(run_dir, record, fresh)  # no job: no deployment for `status`, `ls` or "known:" to show
        raise
    files.write_json(
        files.job,
        {
            "job_id": job_id,
            "submitted_at": submitted_at,
            "rehearse": options.rehearse,
            "sbatch": options.sbatch_options(),
            "script": str(files.script),
        },
    )
    say(f"{plan.name}: submitted SLURM job {job_id} ({files.script})")
    interrupted: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: interrupted.append(signum))
    try:
        outcome = _await(files, job_id, record, console, interrupted)
    finally:
        signal.signal(signal.SIGINT, previous)
    final = read_state(run_dir) or record
    if outcome == "ready":
        urls = ", ".join(r.url for r in final.entry_roles() if r.url)
        job = cluster.job(job_id)
        say(
            f"{plan.name}: ready in {time.monotonic() - started:.2f}s{': ' + urls if urls else ''}; "
            f"SLURM job {job_id} on {','.join(job.nodes)}"
        )
        if options.detach:
            from muse_launch.render_progress import ready_hint

            say(ready_hint(plan.name))
            return 0
        return _follow(plan, files, console, redact)
    if outcome == "interrupted":
        say(f"{plan.name}: interrupted; stopping SLURM job {job_id}")
        down_on_slurm(run_dir)
        return 130
    if (files.read_json(files.job) or {}).get("down_at"):
        say(f"{plan.name}: stopped by `muse-launch down` before it was ready")
        return 1
    _say_failure(lambda text: say(redact(text)), files, final)  # a role's last lines may hold a secret
    cluster.cancel(job_id)
    gone = cluster.wait_gone(job_id, CANCEL_WAIT_SECONDS)
    down_on_slurm(run_dir)  # marks every role stopped, confirms no step or process is left
    say(f"{plan.name}: SLURM job {job_id} {gone.state.lower()}; nothing of it is left")
    return 1


def _forget(run_dir: RunDir, record, fresh: bool) -> None:
    """The submission failed: remove what `up` wrote (a directory it made), or leave the record stopped."""
    import shutil
    from dataclasses import replace

    if fresh:
        shutil.rmtree(run_dir.path, ignore_errors=True)
        return
    write_state(
        run_dir,
        replace(
            record,
            state=DeploymentState.STOPPED,
            roles=tuple(replace(r, state=RoleState.STOPPED) for r in record.roles),
        ),
    )


def _await(files: SlurmFiles, job_id: str, record, console: Console, interrupted: list[int]) -> str:
    """ "ready", "failed" (a role failed, or the job ended first) or "interrupted"."""
    progress = (
        LiveProgress(console, files.run_dir, record) if console.is_terminal else PlainProgress(console.file)
    )
    say = _say(console)
    shown_state = None
    next_job_poll = 0.0
    with progress:
        while True:
            if interrupted:
                return "interrupted"
            current = read_state(files.run_dir) or record
            progress.update(current)
            if current.state is DeploymentState.READY and any(r.process for r in current.roles):
                return "ready"
            if any(r.state is RoleState.FAILED for r in current.roles) or files.done.exists():
                return "failed"
            if time.monotonic() >= next_job_poll:
                next_job_poll = time.monotonic() + JOB_POLL_SECONDS
                job = cluster.job(job_id)
                if job.state != shown_state and not console.is_terminal:
                    reason = f" ({job.reason})" if job.reason and job.reason != "None" else ""
                    say(f"job {job_id}: {job.state.lower()}{reason}")
                shown_state = job.state
                if not job.active:
                    return "failed"
            time.sleep(POLL_SECONDS)


def _say_failure(say: Callable[[str], None], files: SlurmFiles, record) -> None:
    failed = next((r for r in record.roles if r.state is RoleState.FAILED), None)
    if failed is not None:
        say(f"error: role {failed.name} failed: {failed.reason}")
        log = files.run_dir.log(failed.name)
        lines = last_lines(log, FAILURE_LOG_LINES)
        say(f"last {len(lines)} lines of {log}:" if lines else f"{log} is empty")
        for line in lines:
            say(f"  {failed.name} | {line}")
        return
    lines = last_lines(files.batch_log, FAILURE_LOG_LINES)
    say(f"error: the job ended before every role was ready; last {len(lines)} lines of {files.batch_log}:")
    for line in lines:
        say(f"  batch | {line}")


def _follow(plan: Plan, files: SlurmFiles, console: Console, redact: Callable[[str], str]) -> int:
    """Like `up` without -d: the roles' logs until Ctrl-C, then `down`; a secret a role prints hidden as
    `up` on one host hides it."""
    say = _say(console)
    say("Ctrl-C stops it")
    names = [s.name for s in plan.specs]
    printer = RolePrinter(console.file, names, colour=console.is_terminal, mask=redact)
    follower = LogFollower({s.name: files.run_dir.log(s.name) for s in plan.specs}, from_end=True)
    try:
        while not files.done.exists():
            follower.print_new(printer)
            time.sleep(0.2)
        follower.print_new(printer)
        say(f"{plan.name}: the batch supervisor stopped; see {files.batch_log}")
        down_on_slurm(files.run_dir)
        return 1
    except KeyboardInterrupt:
        say(f"{plan.name}: stopping")
        down_on_slurm(files.run_dir)
        return 130
