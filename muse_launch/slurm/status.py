"""`status` of a SLURM deployment: the job (id, state, nodes) as SLURM sees it now, each role's
node, and the roles as the batch supervisor recorded them, corrected by what SLURM says: a job
that ended (cancelled by hand, timed out) leaves no role ready."""

from __future__ import annotations

from dataclasses import dataclass, replace

from muse_launch.backend_types import DeploymentView, RoleView
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

    def shown(self, health: dict[str, str | None]) -> DeploymentView:
        """As `status` shows it: the job as SLURM sees it now, each role's node."""
        record = self.record
        document = record.status_dict()
        document["state"] = self.state
        document["supervisor_pid"] = record.supervisor.pid if self.supervisor and record.supervisor else None
        document["slurm"] = {
            "job_id": self.job.id,
            "state": self.job.state,
            "nodes": list(self.job.nodes),
            "reason": self.job.reason or None,
        }
        roles = []
        for role, entry in zip(record.roles, document.pop("roles"), strict=True):
            entry["node"] = self.nodes.get(role.name)
            roles.append(
                RoleView(
                    role.name,
                    role.kind,
                    role.state.value,
                    self.nodes.get(role.name, "-"),
                    ",".join(map(str, role.gpus)) or "-",
                    role.url or "-",
                    role.ready_at,
                    str(role.restarts),
                    str(role.generation),
                    health.get(role.name),
                    role.reason if role.state is RoleState.FAILED else None,
                    json=entry,
                )
            )
        supervisor = "supervisor on the batch host" if self.supervisor else "no supervisor running"
        nodes = ",".join(self.job.nodes) or "-"
        reason = f", {self.job.reason}" if self.job.reason and self.job.reason != "None" else ""
        return DeploymentView(
            record.name,
            self.state,
            f"SLURM job {self.job.id} {self.job.state}{reason} on {nodes}; {supervisor}; {record.source}",
            "node",
            tuple(roles),
            document,
            (record.change.what, record.change.since) if record.change else None,
        )


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
