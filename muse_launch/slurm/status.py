"""`status` of a SLURM deployment: the job (id, state, nodes) as SLURM sees it now, each role's
node, and the roles as the batch supervisor recorded them, corrected by what SLURM says: a job
that ended (cancelled by hand, timed out) leaves no role ready."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from rich.table import Table
from rich.text import Text

from muse_launch.local.progress import STATE_STYLES
from muse_launch.local.status import since
from muse_launch.rundir.lifecycle import RoleState
from muse_launch.rundir.state import DeploymentRecord, RunDir

from . import cluster
from .files import SlurmFiles


@dataclass(frozen=True)
class SlurmView:
    record: DeploymentRecord
    job: cluster.Job
    nodes: dict[str, str]  # role -> SLURM node
    supervisor: bool  # the batch supervisor's heartbeat is fresh
    state: str  # the deployment: starting | ready | degraded | stopped | failed | cancelled | pending

    def to_json(self, health: dict[str, str | None]) -> dict[str, Any]:
        out = self.record.status_dict()
        out["state"] = self.state
        out["supervisor_pid"] = (
            self.record.supervisor.pid if self.supervisor and self.record.supervisor else None
        )
        out["slurm"] = {
            "job_id": self.job.id,
            "state": self.job.state,
            "nodes": list(self.job.nodes),
            "reason": self.job.reason or None,
        }
        for role in out["roles"]:
            role["node"] = self.nodes.get(role["name"])
            seen = health.get(role["name"])
            role["health"] = None if seen is None else "ok" if seen == "ok" else "failing"
        return out


def slurm_view(run_dir: RunDir, record: DeploymentRecord) -> SlurmView:
    files = SlurmFiles(run_dir)
    job = cluster.job(files.job_id() or "")
    placed = (files.read_json(files.placement) or {}).get("roles", {})
    nodes = {name: where["node"] for name, where in placed.items()}
    alive = files.supervisor_alive()
    if not alive:  # a change in progress is the supervisor's: with it gone, none is in progress
        record = replace(record, change=None)
    state = record.state.value
    if not job.active:
        ended = job.state.lower() if job.state != "GONE" else "gone"
        roles = tuple(
            replace(r, state=RoleState.FAILED, process=None, reason=f"SLURM job {job.id} {ended}")
            if r.live
            else r
            for r in record.roles
        )
        if not (files.read_json(files.job) or {}).get("down_at"):  # it ended without `down`
            state = "cancelled" if job.state == "CANCELLED" else "failed"
        record = replace(record, roles=roles, supervisor=None)
    elif job.state == "PENDING":
        state = "pending"
    elif not alive and not any(r.live for r in record.roles):
        state = "starting"
    return SlurmView(record, job, nodes, alive, state)


def slurm_table(view: SlurmView, health: dict[str, str | None]) -> Table:
    record = view.record
    supervisor = "supervisor on the batch host" if view.supervisor else "no supervisor running"
    nodes = ",".join(view.job.nodes) or "-"
    reason = f", {view.job.reason}" if view.job.reason and view.job.reason != "None" else ""
    table = Table(
        title=f"{record.name}: {view.state} (SLURM job {view.job.id} {view.job.state}{reason} on {nodes}; "
        f"{supervisor}; {record.source})"
        + (f"\nchanging: {record.change.what} (since {since(record.change.since)})" if record.change else ""),
        title_justify="left",
    )
    for column in (
        "role",
        "kind",
        "state",
        "node",
        "gpus",
        "url",
        "ready since",
        "restarts",
        "gen",
        "health now",
    ):
        table.add_column(column)
    for role in record.roles:
        seen = health.get(role.name) or (role.reason if role.state is RoleState.FAILED else None)
        table.add_row(
            role.name,
            role.kind,
            Text(role.state.value, style=STATE_STYLES[role.state]),
            view.nodes.get(role.name, "-"),
            ",".join(map(str, role.gpus)) or "-",
            role.url or "-",
            since(role.ready_at),
            str(role.restarts),
            str(role.generation),
            Text(seen or "-", style="green" if seen == "ok" else "red" if seen else "dim"),
        )
    return table
