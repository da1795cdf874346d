"""SLURM as a backend (muse_launch/backend.py): `up --on slurm` submits one job whose batch host supervises
each role as a step on its node; `down` and `status` read the job's files in the run directory and ask
SLURM. The roles' processes are on other nodes: this host never looks at their pids or listeners."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from muse_launch.backend_types import Capability, DeploymentView, DownReport, Say
from muse_launch.change import Adopt, Change
from muse_launch.errors import RuntimeFailure
from muse_launch.rundir.state import SLURM, DeploymentRecord, RunDir, read_state
from muse_launch.slurm.files import SlurmFiles
from muse_launch.supervise.requests import SupervisedChanges

if TYPE_CHECKING:  # each method imports what it runs: a deployment on this host never loads these
    import httpx
    from rich.console import Console

    from muse_launch.core import LoadedPlan, UpRequest
    from muse_launch.plan.spec import Plan
    from muse_launch.rundir.logs import RolePrinter


class SlurmBackend(SupervisedChanges):
    name = SLURM
    # a new role would need a place in the allocation `up` planned: refused before (no ADDS_ROLES)
    capabilities = SupervisedChanges.capabilities | {Capability.MOVES_PLAN}
    flags = ("--partition", "--account", "--time", "--sbatch")
    not_here = " (one job runs every role)"

    def _request(self, run_dir: RunDir, op: str, args: dict, say: Say) -> dict:
        """Through request and answer files in the run directory, relayed by the batch host's watcher."""
        from muse_launch.slurm.request_files import request

        return request(SlurmFiles(run_dir), op, args, say)

    def owns(self, run_dir: RunDir) -> bool:
        return SlurmFiles(run_dir).exists()

    def bring_up(
        self, loaded: LoadedPlan, request: UpRequest, console: Console, claim: Callable[[RunDir], None]
    ) -> int:
        from muse_launch.slurm.up import SlurmOptions, up_on_slurm

        flags = request.flags
        options = SlurmOptions(
            partition=flags.get("--partition"),
            account=flags.get("--account"),
            time=flags.get("--time"),
            sbatch=tuple(flags.get("--sbatch", ())),
            detach=request.detach,
            fail_fast=request.fail_fast,
            rehearse=request.rehearse,
            sets=request.sets,
        )
        return up_on_slurm(
            loaded.plan, loaded.loaded.topology, loaded.source, loaded.redact, options, console
        )

    def release(self, run_dir: RunDir) -> None:
        """Before another backend takes the name: its SLURM job must be over, and is then forgotten (so that
        `status` and `down` treat the name as the other backend's)."""
        files = SlurmFiles(run_dir)
        if not files.exists():
            return
        from muse_launch.slurm import cluster

        job_id = files.job_id()
        if job_id and cluster.job(job_id).active:
            raise RuntimeFailure(
                f"deployment {run_dir.name!r} runs as SLURM job {job_id}; "
                f"`muse-launch down {run_dir.name}` first"
            )
        shutil.rmtree(files.dir, ignore_errors=True)

    def stop(self, run_dir: RunDir, grace: float | None) -> DownReport:
        from muse_launch.slurm.down import down_on_slurm

        return down_on_slurm(run_dir, grace)

    def observe(self, record: DeploymentRecord) -> DeploymentRecord:
        """The roles as SLURM sees them now (the supervisor's pid is on the batch host)."""
        from muse_launch.slurm.status import slurm_view

        return slurm_view(RunDir.of(record.name), record).record

    def status(self, run_dir: RunDir, client: httpx.Client) -> DeploymentView:
        from muse_launch.slurm.status import slurm_view
        from muse_launch.supervise.probe import health_now

        view = slurm_view(run_dir, read_state(run_dir))
        return view.shown(health_now(view.record, run_dir, client))  # on other nodes: no listener owner

    def print_logs(
        self, run_dir: RunDir, roles: list[str], lines: int, follow: bool, printer: RolePrinter
    ) -> None:
        from muse_launch.rundir.logs import print_files

        # each step writes its log to the shared run directory
        files = {role: run_dir.log(role) for role in roles}
        print_files(run_dir, files, lines, follow, printer)

    def plan_as_started(self, run_dir: RunDir, loaded: LoadedPlan, rehearse: bool) -> Plan:
        """The file's plan moved onto the job's nodes, as the batch host moved the first one
        (placement.json, read as untrusted: a node is a name and an address, or it is not used)."""
        from muse_launch.plan.build import PlanError
        from muse_launch.plan.compose import compose
        from muse_launch.slurm.placement import AllocatedNode, on_nodes

        placed = SlurmFiles(run_dir).read_json(SlurmFiles(run_dir).placement) or {}
        nodes = placed.get("nodes") if isinstance(placed.get("nodes"), list) else []
        allocation = [
            AllocatedNode(n["name"], n["address"])
            for n in nodes
            if isinstance(n, dict) and isinstance(n.get("name"), str) and isinstance(n.get("address"), str)
        ]
        if not allocation:
            raise RuntimeFailure(
                f"{run_dir.name}: its job's nodes are not recorded ({SlurmFiles(run_dir).placement})",
                fix=f"`muse-launch down {run_dir.name}`, then `up --on slurm` the file again",
            )
        topology = loaded.loaded.topology
        try:
            return compose(topology, rehearse=rehearse, where=on_nodes(allocation)).plan
        except (PlanError, ValueError, IndexError, KeyError) as exc:
            raise RuntimeFailure(
                f"{loaded.source} does not fit the job's {len(allocation)} nodes: {exc}",
                fix=f"`muse-launch down {run_dir.name}`, then `up --on slurm` the file",
            ) from None

    def change(self, run_dir: RunDir, change: Change, say: Say = print) -> dict:
        if isinstance(change, Adopt):
            change = self._adopted(run_dir, change)
        return super().change(run_dir, change, say)

    def _adopted(self, run_dir: RunDir, change: Adopt) -> Adopt:
        """The batch supervisor reads the edited file from a copy in the run directory, as it read the
        first one (the allocation shares the run directory), and relaunches changed instances by it on the
        nodes they run on. Requests are files: the `${env:...}` values go as salted digests
        (the deployment's masks' salt), so a new secret is refused there, never written down."""
        from pathlib import Path

        from muse_launch.files import replace_file
        from muse_launch.supervise.change_executor import env_digest
        from muse_launch.topology.load import read_regular_file

        record = read_state(run_dir)
        salt = record.masks.salt if record else ""
        digests = tuple((n, env_digest(salt, n, v)) for n, v in change.environ)
        copy = SlurmFiles(run_dir).dir / "adopted.yaml"  # the batch host plans from a copy, as from `up`'s
        replace_file(copy, read_regular_file(Path(change.file)), root=run_dir.home)
        return replace(change, file=str(copy), environ=(), env_sha256=digests)
