"""`status`: the recorded state, corrected by what is alive now, plus each role's health now."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from muse_launch.backend_types import DeploymentView, OwnerOf, RoleView
from muse_launch.host.gpus import GpuReader, gib
from muse_launch.local.gpu_runtime import role_gpu_memory
from muse_launch.proc.identity import is_suspended
from muse_launch.proc.listeners import HostView, ListenerOwner
from muse_launch.proc.process import Marker
from muse_launch.rundir.lifecycle import SUSPENDED_REASON, RoleState
from muse_launch.rundir.state import DeploymentRecord, RunDir


def observed(record: DeploymentRecord) -> DeploymentRecord:
    """With its supervisor gone, a role whose process died was seen by no one: show it failed. A ready role
    stopped by SIGSTOP is shown unhealthy at once (the supervisor notices it within a tick)."""
    record = replace(
        record,
        roles=tuple(
            replace(r, state=RoleState.UNHEALTHY, reason=SUSPENDED_REASON)
            if r.state is RoleState.READY and r.process and r.process.find() and is_suspended(r.process.pid)
            else r
            for r in record.roles
        ),
    )
    if record.supervisor and record.supervisor.find():
        return record
    roles = tuple(
        replace(r, state=RoleState.FAILED, process=None, reason="died while no supervisor was watching")
        if r.live and (r.process is None or r.process.find() is None)
        else r
        for r in record.roles
    )
    # a change in progress is the supervisor's: with it gone (killed mid-change), none is in progress
    return replace(record, supervisor=None, roles=roles, change=None)


def local_owners(record: DeploymentRecord, run_dir: RunDir) -> OwnerOf:
    """On this host a role's processes can be looked at: the listener that answers must be the role's own."""
    marker = Marker(record.name, str(run_dir.path))
    view = HostView()  # one look at the host's sockets and processes for all the roles: linear in them
    return lambda role: (
        ListenerOwner(role.process.pid, role.name, marker.env(role.name), role.cgroup, view=view)
        if role.process
        else None
    )


GpuMemory = Mapping[str, Mapping[int, int]]  # role -> GPU index -> bytes its processes hold


def gpu_memory_now(record: DeploymentRecord, read: GpuReader) -> GpuMemory | None:
    """None where the host's GPUs cannot be read, or the deployment plans none."""
    if not any(r.gpus for r in record.roles):
        return None
    view = read()
    return role_gpu_memory(record, view) if view.available else None


def local_view(
    record: DeploymentRecord,
    health: dict[str, str | None],
    versions: dict[str, str | None] | None = None,
    gpu_memory: GpuMemory | None = None,
) -> DeploymentView:
    """The deployment as this host sees it: each role's pid, health now, and GPU memory ({"total_bytes",
    "by_gpu": {index: bytes}} in JSON, null where the host's GPUs cannot be read); "versions": the installed
    release of each engine and router (null: not found here)."""
    supervisor = f"supervisor pid {record.supervisor.pid}" if record.supervisor else "no supervisor running"
    wiring = "; ".join(f"{r.name}: {r.wiring_text}" for r in record.roles if r.wiring)
    installed = ", ".join(f"{e} {v or 'unknown'}" for e, v in versions.items()) if versions else ""
    notes = (f"wiring: {wiring}",) * bool(wiring) + (f"installed: {installed}",) * bool(installed)
    document = record.status_dict()
    if versions is not None:
        document["versions"] = versions
    roles = []
    for role, entry in zip(record.roles, document.pop("roles"), strict=True):
        held = gpu_memory.get(role.name, {}) if gpu_memory is not None else None
        entry["gpu_memory"] = (
            None
            if held is None
            else {"total_bytes": sum(held.values()), "by_gpu": {str(g): b for g, b in sorted(held.items())}}
        )
        roles.append(
            RoleView(
                role.name,
                role.kind,
                role.state.value,
                str(role.process.pid) if role.process else "-",
                ",".join(map(str, role.gpus)) or "-",
                role.url or "-",
                role.ready_at,
                role.restarts_text,
                str(role.generation),
                health[role.name],
                role.reason if role.state is RoleState.FAILED else None,
                f"{gib(sum(held.values()))} GiB" if held else None,
                entry,
            )
        )
    return DeploymentView(
        record.name,
        record.shown_state,
        f"{supervisor}; {record.source}",
        "pid",
        tuple(roles),
        document,
        (record.change.what, record.change.since) if record.change else None,
        notes,
        gpu_memory is not None,
    )
