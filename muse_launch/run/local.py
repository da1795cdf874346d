"""The local host as a backend (muse_launch/backend.py): `up` spawns each role here under one supervisor,
`down` stops what carries the deployment's marker, `status` looks at the roles' processes and listeners."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from muse_launch.errors import NotSupported, RuntimeFailure
from muse_launch.run.state import LOCAL, DeploymentRecord, RunDir

if TYPE_CHECKING:  # each method imports what it runs: `down` of nothing loads none of these
    import httpx
    from rich.console import Console
    from rich.table import Table

    from muse_launch.core import LoadedPlan, UpRequest
    from muse_launch.run.down import DownReport
    from muse_launch.run.logs import RolePrinter
    from muse_launch.run.status import OwnerOf


class LocalBackend:
    name = LOCAL

    def owns(self, run_dir: RunDir) -> bool:
        return True  # what no other backend claims runs here

    def bring_up(
        self, loaded: LoadedPlan, request: UpRequest, console: Console, claim: Callable[[RunDir], None]
    ) -> int:
        from muse_launch.host.gpus import read_gpu_view
        from muse_launch.run.gpus import preflight_for
        from muse_launch.run.up import UpOptions, bring_up, refuse_multi_node

        if not request.rehearse:
            refuse_multi_node(loaded.plan)
        options = UpOptions(
            detach=request.detach,
            fail_fast=request.fail_fast,
            keep=request.keep,
            only=request.only,
            start=loaded.loaded.topology.start,
            secret_sources=loaded.loaded.secret_sources,
        )
        skipped = (
            "--skip-gpu-check"
            if request.skip_gpu_check
            else "a rehearsal runs no GPU engine"
            if request.rehearse
            else None
        )
        gpus = preflight_for(loaded.plan, loaded.loaded.topology, read_gpu_view, skipped)
        return bring_up(loaded.plan, loaded.source, loaded.redact, options, console, gpus, claim=claim)

    def release(self, run_dir: RunDir) -> None:
        """Nothing to forget: while a deployment of this name runs here, its lock refuses another `up`."""

    def stop(self, run_dir: RunDir, grace: float | None) -> DownReport:
        from muse_launch.host.gpus import read_gpu_view
        from muse_launch.run.down import bring_down

        return bring_down(run_dir, grace, gpus=read_gpu_view)

    def observe(self, record: DeploymentRecord) -> DeploymentRecord:
        from muse_launch.run.status import observed

        return observed(record)

    def status(self, run_dir: RunDir, client: httpx.Client, as_json: bool, watch: bool) -> str | Table:
        import json

        from muse_launch.host.gpus import read_gpu_view
        from muse_launch.host.versions import deployment_versions
        from muse_launch.run.state import read_state
        from muse_launch.run.status import (
            gpu_memory_now,
            health_now,
            local_owners,
            observed,
            status_json,
            status_table,
        )

        recorded = read_state(run_dir)  # again at each refresh of --watch
        if recorded is None:
            raise RuntimeFailure(
                f"deployment {run_dir.name!r} has no state any more ({run_dir.state_file} is gone)",
                fix=f"`muse-launch down {run_dir.name}` stops whatever of it still runs",
            )
        # engine -> release: as `up` recorded it, else (an older state) read now from the roles' recorded argv
        versions = dict(recorded.versions) or deployment_versions(recorded.roles)
        record = observed(recorded)
        health = health_now(record, run_dir, client, local_owners(record, run_dir))
        gpu_memory = gpu_memory_now(record, read_gpu_view)
        if as_json:  # --watch: JSON lines
            return json.dumps(status_json(record, health, versions, gpu_memory), indent=None if watch else 2)
        return status_table(record, health, versions, gpu_memory)

    def listener_owners(self, record: DeploymentRecord, run_dir: RunDir) -> OwnerOf:
        from muse_launch.run.status import local_owners

        return local_owners(record, run_dir)

    def print_logs(
        self, run_dir: RunDir, roles: list[str], lines: int, follow: bool, printer: RolePrinter
    ) -> None:
        from muse_launch.run.logs import print_files

        files = {role: run_dir.log(role) for role in roles}
        print_files(run_dir, files, lines, follow, printer)

    def add_instance(self, run_dir: RunDir, role: str) -> None:
        raise NotSupported(
            f"adding an instance of {role} to a running deployment is not supported on this host yet",
            fix=f"raise roles.{role}.replicas in the file, then `muse-launch down {run_dir.name}` "
            "and `up` it again",
        )

    def remove_instance(self, run_dir: RunDir, instance: str) -> None:
        raise NotSupported(
            f"removing {instance} from a running deployment is not supported on this host yet",
            fix=f"lower its role's replicas in the file, then `down {run_dir.name}` and `up` again",
        )

    def restart_instance(self, run_dir: RunDir, instance: str) -> None:
        raise NotSupported(
            f"restarting {instance} alone is not supported on this host yet",
            fix=f"`muse-launch down {run_dir.name}` and `up` it again; the supervisor restarts "
            "a role that dies by its restart policy",
        )
