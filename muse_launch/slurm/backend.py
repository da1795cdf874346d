"""The CLI's entry points for SLURM deployments, so that commands/run.py only dispatches."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from typing import TYPE_CHECKING

from muse_launch.errors import RuntimeFailure, UsageError
from muse_launch.run.state import DeploymentRecord, RunDir, read_state
from muse_launch.slurm.files import SlurmFiles

if TYPE_CHECKING:  # each command imports what it runs: a deployment on this host never loads these
    import httpx
    from rich.console import Console
    from rich.table import Table

    from muse_launch.run.down import DownReport

TARGETS = ("slurm",)


def up_on(target: str, loaded, console: Console, one_host_only: dict[str, object], **options) -> int:
    from muse_launch.slurm.up import SlurmOptions, up_on_slurm

    if target not in TARGETS:
        raise UsageError(f"--on {target}: unknown; one of: {', '.join(TARGETS)}")
    if given := [flag for flag, value in one_host_only.items() if value]:
        raise UsageError(f"{', '.join(given)}: not with --on {target} (one job runs every role)")
    return up_on_slurm(loaded.plan, loaded.loaded.topology, loaded.source, loaded.redact, SlurmOptions(**options),
                       console)


def is_slurm(run_dir: RunDir) -> bool:
    return SlurmFiles(run_dir).exists()


def leave_slurm(run_dir: RunDir) -> None:
    """Before a deployment on this host: its name's SLURM job must be over, and is then forgotten
    (so that `status` and `down` treat the name as this host's)."""
    files = SlurmFiles(run_dir)
    if not files.exists():
        return
    from muse_launch.slurm import cluster

    job_id = files.job_id()
    if job_id and cluster.job(job_id).active:
        raise RuntimeFailure(f"deployment {run_dir.name!r} runs as SLURM job {job_id}; "
                             f"`muse-launch down {run_dir.name}` first")
    shutil.rmtree(files.dir, ignore_errors=True)


def down_any(run_dir: RunDir, grace: float | None, local: Callable[[RunDir, float | None], DownReport]) -> DownReport:
    if not is_slurm(run_dir):
        return local(run_dir, grace)
    from muse_launch.slurm.down import down_on_slurm

    return down_on_slurm(run_dir, grace)


def observed_any(record: DeploymentRecord, local: Callable[[DeploymentRecord], DeploymentRecord]) -> DeploymentRecord:
    """A SLURM deployment's roles as SLURM sees them now (its supervisor's pid is on the batch host)."""
    run_dir = RunDir.of(record.name)
    if not is_slurm(run_dir):
        return local(record)
    from muse_launch.slurm.status import slurm_view

    return slurm_view(run_dir, record).record


def slurm_status(run_dir: RunDir, client: httpx.Client, as_json: bool, watch: bool) -> str | Table | None:
    """None for a deployment on this host."""
    if not is_slurm(run_dir):
        return None
    from muse_launch.run.status import health_now
    from muse_launch.slurm.status import slurm_table, slurm_view

    view = slurm_view(run_dir, read_state(run_dir))
    health = health_now(view.record, run_dir, client, local=False)  # roles on other nodes: no pids to look at
    if as_json:
        return json.dumps(view.to_json(health), indent=None if watch else 2)
    return slurm_table(view, health)
