"""What the Backend seam (muse_launch/backend.py) takes and returns, shared by every backend and the
commands above it: a backend's declared capabilities, what `down` left (DownReport), whose listener a
role's probe must find (OwnerOf), a deployment as `status` shows it (DeploymentView). Nothing here imports
a backend."""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from muse_launch.host.gpus import GPU_RELEASE_SECONDS

if TYPE_CHECKING:
    from muse_launch.proc.listeners import ListenerOwner
    from muse_launch.rundir.state import RoleRecord

Say = Callable[[str], None]
OwnerOf = Callable[["RoleRecord"], "ListenerOwner | None"]  # whose listener a role's probe must find, if seen


def nobody(role: RoleRecord) -> ListenerOwner | None:
    """OwnerOf where the roles run elsewhere (SLURM's nodes, Kubernetes' pods): no pid here to look at."""
    return None


class Capability(enum.Enum):
    """What a backend can do beyond up, down, status and logs; the commands ask, never probe."""

    CHANGES = "changes"  # add, remove, restart an instance, scale a role while it serves
    LEASES = "leases"  # several changes held as one (`held`): a rolling restart, `up FILE`'s steps
    RELAUNCH = "relaunch"  # `up FILE` of an edited file: adopt it, relaunch instances by it
    ADDS_ROLES = "adds_roles"  # and add instances of a role the edited file brings in
    MOVES_PLAN = "moves_plan"  # the plan runs elsewhere than the file says (`plan_as_started`)


@dataclass
class Held:
    """A lease on a deployment's changes (Backend.held); `commit` says whether what was done under it
    stands."""

    commit: bool = False


@dataclass(frozen=True)
class DownReport:
    name: str
    seconds: float
    stopped: tuple[str, ...]  # roles that had a process, in the order they were stopped
    killed: tuple[str, ...]  # processes that needed SIGKILL
    survivors: tuple[str, ...]  # alive even after SIGKILL
    open_ports: tuple[str, ...]  # still accepting connections at the end
    notes: tuple[str, ...]
    gpus: str | None = None  # "GPUs 0-7 free"; None where the host's GPUs cannot be read
    gpus_held: tuple[str, ...] = ()  # the deployment's processes still holding GPU memory

    @property
    def clean(self) -> bool:
        return not self.survivors and not self.open_ports and not self.gpus_held

    def to_json(self) -> str:
        """`down --json` (docs/status-json.md): the report's fields, and whether it left nothing."""
        import dataclasses
        import json

        data = {**dataclasses.asdict(self), "seconds": round(self.seconds, 3), "clean": self.clean}
        return json.dumps(data, indent=2)

    def lines(self) -> list[str]:
        lines = [*self.notes]
        lines.append(
            f"{self.name}: stopped {', '.join(self.stopped)} in {self.seconds:.2f}s"
            if self.stopped
            else f"{self.name}: nothing was running; checked in {self.seconds:.2f}s"
        )
        if self.killed:
            lines.append("had to SIGKILL:")
            lines += [f"  {k}" for k in self.killed]
        if self.survivors:
            lines.append("still alive after SIGKILL (uninterruptible; check the GPU driver):")
            lines += [f"  {s}" for s in self.survivors]
        if self.open_ports:
            lines.append("ports still open:")
            lines += [f"  {p}" for p in self.open_ports]
        if self.gpus_held:
            lines.append(f"GPU memory still held after {GPU_RELEASE_SECONDS:g}s:")
            lines += [f"  {h}" for h in self.gpus_held]
        elif self.gpus:
            lines.append(self.gpus)
        return lines


@dataclass(frozen=True)
class RoleView:
    """One role in `status` as its backend sees it now (render_status.py draws it)."""

    name: str
    kind: str
    state: str  # a RoleState's value (a pod's state on Kubernetes)
    where: str  # its pid, node or pod: the column the deployment's view names
    gpus: str = "-"
    url: str = "-"
    ready_at: str | None = None  # ISO 8601
    restarts: str = "0"
    generation: str = "-"
    health: str | None = None  # "ok", or what its probe sees now; None: nothing to ask
    reason: str | None = None  # why it failed (shown where there is no health to show)
    gpu_memory: str | None = None  # "60 GiB", where the host's GPUs are read
    json: Mapping[str, Any] = field(default_factory=dict)  # its entry in `status --json`, health added


@dataclass(frozen=True)
class DeploymentView:
    """A deployment in `status` as its backend sees it now: `observe` corrected by what it sees, with its
    roles' health; one renderer above the seam draws it as a table or JSON (render_status.py)."""

    name: str
    state: str
    about: str  # how and where it runs, after its state in the title
    where: str  # what the roles' `where` is: pid | node | pod
    roles: tuple[RoleView, ...]
    json: Mapping[str, Any]  # `status --json` (docs/status-json.md) but its roles, which are the roles' own
    change: tuple[str, str] | None = None  # what is changing, and since when (ISO 8601)
    notes: tuple[str, ...] = ()  # under the table: wiring, the installed releases
    gpu_memory: bool = False  # the host's GPUs were read: each role's memory is shown
