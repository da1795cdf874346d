"""The local host as a backend (muse_launch/backend.py): `up` spawns each role here under one supervisor,
`down` stops what carries the deployment's marker, `status` looks at the roles' processes and listeners."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from muse_launch.backend_types import Capability, DeploymentView, DownReport, OwnerOf
from muse_launch.errors import RuntimeFailure
from muse_launch.rundir.state import LOCAL, DeploymentRecord, RunDir
from muse_launch.supervise.requests import SupervisedChanges

if TYPE_CHECKING:  # each method imports what it runs: `down` of nothing loads none of these
    import httpx
    from rich.console import Console

    from muse_launch.core import LoadedPlan, UpRequest
    from muse_launch.plan.spec import LaunchSpec, Plan
    from muse_launch.rundir.logs import RolePrinter
    from muse_launch.supervise.change_executor import Placement


class LocalBackend(SupervisedChanges):
    name = LOCAL
    capabilities = SupervisedChanges.capabilities | {Capability.ADDS_ROLES}
    flags = ("--keep", "--only", "--skip-gpu-check")

    def _request(self, run_dir: RunDir, op: str, args: dict, say: Callable[[str], None]) -> dict:
        """Over the control socket, which only the deployment's own user may open (an adopted file's
        `${env:...}` values go in clear over it)."""
        from muse_launch.supervise.control_socket import request

        return request(run_dir, op, args, say)

    def owns(self, run_dir: RunDir) -> bool:
        return True  # what no other backend claims runs here

    def bring_up(
        self, loaded: LoadedPlan, request: UpRequest, console: Console, claim: Callable[[RunDir], None]
    ) -> int:
        from muse_launch.host.gpus import read_gpu_view
        from muse_launch.local.gpu_runtime import preflight_for
        from muse_launch.local.up import UpOptions, bring_up, refuse_multi_node
        from muse_launch.supervise.autoscaler import Setup

        if not request.rehearse:
            refuse_multi_node(loaded.plan)
        only = request.flags.get("--only")
        options = UpOptions(
            detach=request.detach,
            fail_fast=request.fail_fast,
            keep=bool(request.flags.get("--keep")),
            only=only,
            start=loaded.loaded.topology.start,
            secret_sources=loaded.loaded.secret_sources,
            placement=None if only else placement(loaded, request, read_gpu_view),
            autoscale=None if only else Setup.of(loaded.loaded.topology),
        )
        skipped = gpu_check_skipped(request)
        gpus = preflight_for(loaded.plan, loaded.loaded.topology, read_gpu_view, skipped)
        return bring_up(loaded.plan, loaded.source, loaded.redact, options, console, gpus, claim=claim)

    def release(self, run_dir: RunDir) -> None:
        """Nothing to forget: while a deployment of this name runs here, its lock refuses another `up`."""

    def stop(self, run_dir: RunDir, grace: float | None) -> DownReport:
        from muse_launch.host.gpus import read_gpu_view
        from muse_launch.local.down import bring_down

        return bring_down(run_dir, grace, gpus=read_gpu_view)

    def observe(self, record: DeploymentRecord) -> DeploymentRecord:
        from muse_launch.local.status import observed

        return observed(record)

    def status(self, run_dir: RunDir, client: httpx.Client) -> DeploymentView:
        from muse_launch.host.gpus import read_gpu_view
        from muse_launch.host.versions import deployment_versions
        from muse_launch.local.status import gpu_memory_now, local_owners, local_view, observed
        from muse_launch.rundir.state import read_state
        from muse_launch.supervise.probe import health_now

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
        return local_view(record, health, versions, gpu_memory_now(record, read_gpu_view))

    def listener_owners(self, record: DeploymentRecord, run_dir: RunDir) -> OwnerOf:
        from muse_launch.local.status import local_owners

        return local_owners(record, run_dir)

    def print_logs(
        self, run_dir: RunDir, roles: list[str], lines: int, follow: bool, printer: RolePrinter
    ) -> None:
        from muse_launch.rundir.logs import print_files

        files = {role: run_dir.log(role) for role in roles}
        print_files(run_dir, files, lines, follow, printer)


def placement(loaded: LoadedPlan, request: UpRequest, read_gpus) -> Placement:
    """How the supervisor places a new instance: the file's plan with N replicas of a role (rehearsed as
    `up` was), and `up`'s port and GPU pre-flight for it."""
    from muse_launch.host.versions import engine_versions
    from muse_launch.local.gpu_runtime import SKIP_FLAG, Owners, preflight_for
    from muse_launch.local.up import busy_fix
    from muse_launch.plan.compose import compose
    from muse_launch.plan.placement import Room
    from muse_launch.proc.ports import busy_ports, can_bind
    from muse_launch.rundir.lifecycle import LOCAL, RoleState
    from muse_launch.rundir.state import recorded_role, running_deployments
    from muse_launch.supervise.change_executor import Placement
    from muse_launch.topology.hardware import PROFILES

    topology = loaded.loaded.topology
    versions: dict[str, str | None] = {}  # the engines' releases, read once: they do not change as it runs

    def replan(counts: Mapping[str, int], ports: Mapping[str, Mapping[str, int]] | None = None) -> Plan:
        """As `up` runs it: with its start policy, which may set an engine's variable (the encoder eviction
        TTL of an overlapped start), so that a new or relaunched instance runs what `up` of the file would
        start."""

        def read(plan: Plan) -> dict[str, str | None]:
            if not versions:
                versions.update(engine_versions(plan))
            return versions

        return compose(topology, counts=counts, ports=ports, rehearse=request.rehearse, versions=read).plan

    def preflight(part: Plan, say: Callable[[str], None], reserved: Sequence[LaunchSpec] = ()) -> None:
        """`reserved` (instances placed, not started) need nothing here: their GPUs and ports are held in
        the supervisor's room already (supervise/change_executor.py)."""
        if busy := busy_ports(part, loaded.redact, recorded_role):
            raise RuntimeFailure(
                "ports are busy:\n  " + "\n  ".join(map(str, busy)), fix=busy_fix(part, busy)
            )
        skipped = gpu_check_skipped(request)
        preflight_for(part, topology, read_gpus, skipped).require(part, running_deployments, say)

    def room(own: str) -> Room:
        """This host's GPUs and who holds them, but for deployment `own`'s instances (its supervisor
        knows those): the other deployments' records, and NVML's holders where the GPU check reads the
        host; else the hardware profile's GPUs, as a real host of it has (a rehearsal places the same)."""
        profile = PROFILES[topology.hardware]
        if not profile.has_gpus:
            return Room(())
        records = running_deployments()
        held: dict[int, str] = {}
        for record in records:
            if record.name == own or record.backend != LOCAL:
                continue
            for role in record.roles:
                if role.state not in (RoleState.STOPPED, RoleState.FAILED):
                    for gpu in role.gpus:
                        held.setdefault(gpu, f"{role.name} of {record.name}")
        gpus = tuple(range(profile.gpus_per_node))
        source = f"the {profile.name} hardware profile"
        view = read_gpus() if not (request.flags.get(SKIP_FLAG) or request.rehearse) else None
        if view is not None and view.available:
            gpus, source = tuple(g.index for g in view.gpus), view.source
            owners = Owners(records)
            for gpu in view.gpus:
                for holder in gpu.holders:
                    owner = owners.of(holder.pid)
                    if owner is None or owner[0] != own:
                        held.setdefault(gpu.index, owners.label(holder))
        return Room(gpus, held, source)

    def reload(source: str, sets: tuple[str, ...], environ: Mapping[str, str]) -> Placement:
        """The same rules from an edited file, as `up FILE` of it checks it (the roles are not touched)."""
        from pathlib import Path

        from muse_launch.core import load_plan

        fresh = load_plan(Path(source), list(sets), rehearse=request.rehearse, environ=environ)
        return placement(fresh, request, read_gpus)

    return Placement(
        replan,
        preflight,
        room=room,
        port_free=can_bind,
        hardware=topology.hardware,
        reload=reload,
        redact=loaded.redact,
        sha256=loaded.loaded.sha256,
    )


def gpu_check_skipped(request: UpRequest) -> str | None:
    """Why `up` reads no GPU of this host: --skip-gpu-check, or a rehearsal (no GPU engine runs); None: it
    reads them."""
    from muse_launch.local.gpu_runtime import SKIP_FLAG

    if request.flags.get(SKIP_FLAG):
        return SKIP_FLAG
    return "a rehearsal runs no GPU engine" if request.rehearse else None
